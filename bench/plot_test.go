package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Both plots write PNG and SVG from their reports; lines keep first-seen
// order and sort their points by x.
func TestPlotsWriteFiles(t *testing.T) {
	var ls lineSet
	ls.add("b", 3, 1)
	ls.add("a", 1, 5)
	ls.add("b", 2, 2)
	require.Equal(t, []string{"b", "a"}, ls.order)
	require.Equal(t, 5.0, ls.maxY())

	dir := t.TempDir()
	in := inReport{Ranks: 2, Device: "test", Hidden: 128, TopK: 2, Experts: 4, Rows: []inRow{
		{inKey: inKey{Tokens: 128, Op: "dispatch", Dtype: "bf16", Mode: "cached", SMs: 4}, US: 10, GBps: 1, Bytes: 100},
		{inKey: inKey{Tokens: 512, Op: "dispatch", Dtype: "bf16", Mode: "cached", SMs: 4}, US: 20, GBps: 2, Bytes: 400},
	}}
	require.NoError(t, plotIntranode(filepath.Join(dir, "in"), in))
	coll := collReport{Ranks: 2, Device: "test", DType: "bf16", Op: "sum", Rows: []collRow{
		{Collective: "allreduce", Bytes: 4096, Mode: "eager", BusGBps: 1},
		{Collective: "allreduce", Bytes: 1 << 20, Mode: "eager", BusGBps: 3},
	}}
	require.NoError(t, plotColl(filepath.Join(dir, "coll"), coll))
	for _, f := range []string{"in.png", "in.svg", "coll.png", "coll.svg"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		require.Positive(t, st.Size(), f)
	}
	require.Error(t, plotColl(filepath.Join(dir, "none"), collReport{}))
}
