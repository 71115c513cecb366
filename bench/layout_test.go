package bench

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
)

// Small timing counts keep the host runs quick; the checks are the same.
var quickLayout = []string{"--warmup", "2", "--iters", "5", "--graph-launches", "3", "--replays", "2", "--flush-mib", "1"}

func TestLayoutCommandOnHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "layout.json")
	args := append([]string{"layout", "--backend", "host", "--tokens", "0,1,300", "--masked", "7", "--json", path}, quickLayout...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "layout kernel on host:0: K=8 E=256 R=8 int64")
	assert.Contains(t, stdout, "graph us/launch")
	rep := readJSON[struct {
		Layout []layoutResult `json:"layout"`
	}](t, path)
	require.Len(t, rep.Layout, 3)
	for i, tokens := range []int{0, 1, 300} {
		r := rep.Layout[i]
		assert.Equal(t, tokens, r.Tokens)
		assert.Equal(t, "ok", r.Check)
		assert.Equal(t, "host", r.Backend)
		assert.Equal(t, 4, r.Iters, "the first timed launch is dropped")
		assert.Equal(t, 3, r.GraphLaunches)
		assert.Greater(t, r.MeanUS, 0.0)
	}
	assert.Equal(t, "2x256", rep.Layout[2].Grid)

	code, stdout, stderr = run(t, append([]string{"layout", "--backend", "host", "--tokens", "64", "--int32", "--topk", "9", "--experts", "512", "--ranks", "64", "--threads", "32", "--graph-launches", "0"}, quickLayout[:4]...)...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "int32")
	assert.Contains(t, stdout, "2x32")
}

func TestLayoutCommandRejectsBadFlags(t *testing.T) {
	for msg, flags := range map[string][]string{
		"do not divide evenly":       {"--experts", "100"},
		"want integers":              {"--tokens", "4096,x"},
		"negative token count":       {"--tokens", "-1"},
		"want --iters >= 2":          {"--iters", "1"},
		"top-k must be":              {"--topk", "0"},
		"multiple of 32 in 32..1024": {"--threads", "48"},
	} {
		code, _, stderr := run(t, append([]string{"layout", "--backend", "host"}, flags...)...)
		assert.Equal(t, 1, code, msg)
		assert.Contains(t, stderr, msg)
	}
}

// On a GPU the same command checks the CUDA kernel and prints the verdict
// against the 15 us target.
func TestLayoutCommandOnGPU(t *testing.T) {
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA GPU: %v", err)
	}
	code, stdout, stderr := run(t, "layout", "--backend", "cuda", "--tokens", "128,4096", "--iters", "50")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "target")
	t.Logf("\n%s", stdout)
}
