package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLowLatencyOnHost(t *testing.T) {
	js := filepath.Join(t.TempDir(), "ll.json")
	code, stdout, stderr := run(t, "lowlatency", "--backend", "host", "--ranks", "4", "--tokens", "0,1,6", "--hidden", "256",
		"--topk", "3", "--experts", "8", "--mask", "2", "--json", js)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"T=6 bf16 dispatch", "T=6 ue8m0 combine", "bit for bit", "rank 2 reported masked", "(graph)"} {
		require.Contains(t, stdout, want)
	}
	var rep llReport
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, 4, rep.Ranks)
	// 3 token counts x 3 formats x (dispatch, combine, graph).
	require.Len(t, rep.Figures, 27)
	for _, c := range rep.Checks {
		require.NotEqual(t, "fail", c.Status, "%+v", c)
	}
	// Bad flags are refused before any work.
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--mask", "2")
	require.NotEqual(t, 0, code)
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--formats", "fp4")
	require.NotEqual(t, 0, code)
}
