package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
)

// Small counts keep the host runs quick; the checks are the same.
var quickIntranode = []string{"--backend", "host", "--hidden", "256", "--topk", "4", "--experts", "16",
	"--warmup", "2", "--iters", "3", "--flush-mib", "1"}

func TestIntranodeOnHost(t *testing.T) {
	dir := t.TempDir()
	js, plot := filepath.Join(dir, "in.json"), filepath.Join(dir, "in")
	args := append([]string{"intranode", "--ranks", "4", "--tokens", "0,1,40", "--fp8", "--masked", "5",
		"--json", js, "--plot", plot}, quickIntranode...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"intranode: 4 ranks (goroutines), host backend", "T=40 bf16", "byte-exact",
		"combine bit-exact", "T=40 fp8", "TIMINGS", "notify+dispatch", "graph", "intranode: all checks passed"} {
		assert.Contains(t, stdout, want)
	}
	assert.Regexp(t, `progress +[0-9.]+s: T=40 \(3/3\): dispatch bf16 cached \(host backend, plain copy\)`, stderr)
	assert.NotContains(t, stdout+stderr, "24 SMs", "the host backend has no SMs")
	rep := readJSON[inReport](t, js)
	require.Empty(t, rep.Errors)
	require.Equal(t, 4, rep.Ranks)
	// Per token count: layout, then bf16 cached, combine, full, three
	// graphs, then fp8 cached, full, two graphs.
	require.Len(t, rep.Rows, 3*11)
	seen := map[string]int{}
	for _, r := range rep.Rows {
		seen[r.Op+" "+r.Dtype+" "+r.Mode]++
		require.Positive(t, r.US, "%+v", r)
		require.LessOrEqual(t, r.MinUS, r.US)
		require.GreaterOrEqual(t, r.MaxUS, r.US)
		if r.Op == "layout" {
			require.Zero(t, r.Bytes)
			continue
		}
		switch {
		case r.Tokens == 0:
			require.Zero(t, r.Bytes)
		case r.Dtype == "fp8":
			require.Equal(t, int64(r.Recv)*(256+8), r.Bytes, "FP8 rows count hidden x (1+4/128) bytes")
		default:
			require.Equal(t, int64(r.Recv)*512, r.Bytes, "BF16 rows count hidden x 2 bytes")
		}
		if r.Bytes > 0 {
			require.InDelta(t, float64(r.Bytes)/r.US/1e3, r.GBps, 1e-9)
		}
	}
	for _, k := range []string{"layout i64 events", "dispatch bf16 cached", "combine bf16 events", "notify+dispatch bf16 full",
		"dispatch bf16 graph", "notify+dispatch bf16 graph", "combine bf16 graph", "dispatch fp8 cached",
		"notify+dispatch fp8 full", "dispatch fp8 graph", "notify+dispatch fp8 graph"} {
		require.Equal(t, 3, seen[k], k)
	}
	for _, ext := range []string{".png", ".svg"} {
		st, err := os.Stat(plot + ext)
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
	require.Len(t, rep.Checks, 3*3)
}

func TestIntranodeTuneOnHost(t *testing.T) {
	args := append([]string{"intranode", "--ranks", "2", "--tokens", "24", "--tune", "--tune-sms", "1,2",
		"--tune-warmup", "0", "--tune-iters", "2", "--fp8"}, quickIntranode...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "TUNING")
	assert.NotContains(t, stdout, "TIMINGS")
	for _, want := range []string{"ranks=2 T=24 dispatch bf16: ", "ranks=2 T=24 combine bf16: ", "ranks=2 T=24 dispatch fp8: "} {
		assert.Contains(t, stdout, want)
	}
	assert.Contains(t, stderr, "progress ")
	for _, mode := range []string{"plain", "wide", "tma"} {
		assert.Regexp(t, `dispatch\s+bf16\s+cached\s+`+mode+`\s`, stdout, "the tuning sweeps the %s copy path", mode)
	}
}

func TestIntranodeSMSweepAndBadFlags(t *testing.T) {
	args := append([]string{"intranode", "--ranks", "2", "--tokens", "8", "--sms", "1,3", "--graph=false",
		"--dispatch-threads", "64", "--combine-threads", "96", "--copy", "wide"}, quickIntranode...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "wide    1       64")
	assert.Contains(t, stdout, "-    3       96")
	assert.NotContains(t, stdout, "graph  ")

	for msg, flags := range map[string][]string{
		"do not divide evenly": {"--experts", "18", "--ranks", "4"},
		"want integers":        {"--tokens", "4,x"},
		"is negative":          {"--tokens", "-1"},
		"want --iters":         {"--iters", "1"},
		"FP8 needs hidden":     {"--fp8", "--hidden", "200"},
		"threads per block":    {"--dispatch-threads", "40"},
		"multiple of 8":        {"--hidden", "100"},
		"SM counts must be":    {"--sms", "-3"},
	} {
		code, _, stderr := run(t, append(append([]string{"intranode"}, quickIntranode...), flags...)...)
		assert.Equal(t, 1, code, msg)
		assert.Contains(t, stderr, msg)
	}
}

func TestIntranodeHostRefusesProcesses(t *testing.T) {
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", "1")
	code, _, stderr := run(t, "intranode", "--backend", "host", "--hidden", "256", "--topk", "4", "--experts", "16")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "goroutine ranks of one process")
}

// On GPUs: every GPU (up to 8) as goroutine ranks, DeepEP's shape; on one
// GPU, 4 ranks share it.
func TestIntranodeOnGPU(t *testing.T) {
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA GPU: %v", err)
	}
	ranks := fmt.Sprint(min(max(n, 4), 8))
	code, stdout, stderr := run(t, "intranode", "--backend", "cuda", "--ranks", ranks, "--tokens", "128,4096", "--fp8")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "intranode: all checks passed")
	t.Logf("\n%s", stdout)
}
