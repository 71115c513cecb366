package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
)

func TestLowLatencyOnHost(t *testing.T) {
	dir := t.TempDir()
	js, plotPrefix := filepath.Join(dir, "ll.json"), filepath.Join(dir, "ll")
	code, stdout, stderr := run(t, "lowlatency", "--backend", "host", "--ranks", "4", "--tokens", "0,1,6", "--hidden", "256",
		"--topk", "3", "--experts", "8", "--mask", "2", "--json", js, "--plot", plotPrefix)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"T=6 bf16 dispatch", "T=6 ue8m0 combine", "bit for bit", "rank 2 reported masked",
		"DeepEP's timing rules", "plot: " + plotPrefix + ".png"} {
		require.Contains(t, stdout, want)
	}
	// The checks table comes before the timings.
	require.Less(t, strings.Index(stdout, "CHECKS"), strings.Index(stdout, "TIMINGS"))
	for _, ext := range []string{".png", ".svg"} {
		st, err := os.Stat(plotPrefix + ext)
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
	rep := readJSON[llReport](t, js)
	require.Equal(t, 4, rep.Ranks)
	// 3 token counts x 3 formats x (dispatch, combine; graph: dispatch,
	// combine, dispatch+combine, dispatch x8, dispatch+combine x8), each
	// once.
	require.Len(t, rep.Figures, 63)
	seen := map[string]bool{}
	for _, f := range rep.Figures {
		key := fmt.Sprintf("%d %s %s %v", f.Tokens, f.Format, f.Op, f.Graph)
		require.False(t, seen[key], "figure %s twice", key)
		seen[key] = true
		require.True(t, f.MinUS <= f.US && f.US <= f.MaxUS, "%+v", f)
	}
	require.True(t, seen["6 ue8m0 combine true"] && seen["1 fp8 dispatch+combine true"] && seen["6 bf16 dispatch false"] &&
		seen["6 fp8 dispatch+combine x8 true"] && seen["1 bf16 dispatch x8 true"])
	require.Contains(t, rep.Timing, "DeepEP's timing rules")
	for _, c := range rep.Checks {
		require.NotEqual(t, "fail", c.Status, "%+v", c)
	}
	// Bad flags are refused before any work.
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--mask", "2")
	require.NotEqual(t, 0, code)
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--formats", "fp4")
	require.NotEqual(t, 0, code)
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--tokens", "0,4", "--plot", plotPrefix+"2")
	require.NotEqual(t, 0, code, "a plot of one positive token count")
}

// On GPUs: 8 goroutine ranks over the GPUs present (sharing them when
// fewer), the shape (hidden 7168, top-8 of 256) at 1 and 128
// tokens, every format, graphs, a masked rank; shorter timing loops.
func TestLowLatencyOnGPU(t *testing.T) {
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA GPU: %v", err)
	}
	dir := t.TempDir()
	js := filepath.Join(dir, "ll.json")
	code, stdout, stderr := run(t, "lowlatency", "--backend", "cuda", "--ranks", "8", "--tokens", "1,128", "--warmup", "5",
		"--iters", "10", "--json", js, "--plot", filepath.Join(dir, "ll"))
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	rep := readJSON[llReport](t, js)
	require.Len(t, rep.Figures, 2*3*5)
	if n < 8 {
		require.Contains(t, stdout, "not NVLink figures")
	}
	t.Logf("\n%s", stdout)
}

// Across 2 virtual nodes on the host backend: every check passes with the
// other node's rows over port channels (a masked rank on the other node of
// ranks 0 and 1); --nodes that does not divide the ranks is refused.
func TestLowLatencyNodesOnHost(t *testing.T) {
	js := filepath.Join(t.TempDir(), "ll.json")
	code, stdout, stderr := run(t, "lowlatency", "--backend", "host", "--ranks", "4", "--nodes", "2", "--tokens", "0,3",
		"--hidden", "128", "--topk", "2", "--experts", "8", "--formats", "bf16,fp8", "--mask", "3", "--graph=false",
		"--json", js)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Contains(t, stdout, "in 2 virtual nodes")
	require.Contains(t, stdout, "rank 3 reported masked")
	rep := readJSON[llReport](t, js)
	require.Equal(t, 2, rep.Nodes)
	require.NotEmpty(t, rep.Checks)
	for _, c := range rep.Checks {
		require.NotEqual(t, "fail", c.Status, "%+v", c)
	}
	code, _, _ = run(t, "lowlatency", "--backend", "host", "--ranks", "4", "--nodes", "3")
	require.NotEqual(t, 0, code)
}
