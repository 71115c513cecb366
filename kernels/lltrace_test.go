package kernels

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/kernelflags"
)

// The low-latency module compiles with the trace switch's define (the
// build `ep-bench lowlatency --trace` runs), into another cache entry and
// other code than the default build. The switch itself (kernelflags.Defines
// in compileOptions) is exercised end to end by lowlatency's
// TestEmulatedTrace, which re-runs its binary with $GOEP_LL_TRACE=1.
func TestLLTraceBuildCompiles(t *testing.T) {
	needNVRTC(t)
	require.False(t, kernelflags.LLTrace(), "this test binary runs the default build")
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	def := Module{Name: "lltrace_default", File: "lowlatency.cu"}
	on := def
	on.Name = "lltrace_on"
	on.Options = []string{kernelflags.DefineLLTrace}
	a, err := c.Compile(def, SM90)
	require.NoError(t, err)
	b, err := c.Compile(on, SM90)
	require.NoError(t, err, "lowlatency.cu with %s", kernelflags.DefineLLTrace)
	assert.NotEqual(t, a.Key, b.Key, "the define must change the cache key")
	assert.False(t, bytes.Equal(a.CUBIN, b.CUBIN), "the define must change the code")
	assert.Contains(t, b.Options, kernelflags.DefineLLTrace)
	opts, _ := compileOptions(Module{Name: "p", File: "p.cu"}, SM90, 12)
	assert.NotContains(t, opts, kernelflags.DefineLLTrace)
}
