package kernels

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/kernelflags"
)

// Every measurement switch's define (the builds the GPU A/Bs and
// `ep-bench lowlatency --trace` run) compiles its modules into another
// cache entry and other code than the default build. The switches
// themselves (kernelflags.Defines in compileOptions) are exercised end to
// end by the intranode and collectives switch tests and lowlatency's
// TestEmulatedTrace, which re-run their binary with the variable set.
func TestSwitchedBuildsCompile(t *testing.T) {
	needNVRTC(t)
	require.False(t, kernelflags.NoFingerprint(), "this test binary runs the default build")
	require.False(t, kernelflags.LLTrace(), "this test binary runs the default build")
	require.False(t, kernelflags.InnTrace(), "this test binary runs the default build")
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	for _, sw := range []struct {
		define string
		files  []string
	}{
		{kernelflags.DefineNoFingerprint, []string{"coll_ll.cu", "coll_bulk.cu"}},
		{kernelflags.DefineLLTrace, []string{"lowlatency.cu"}},
		{kernelflags.DefineInnTrace, []string{"internode.cu"}},
	} {
		for _, file := range sw.files {
			def := Module{Name: "switch_default_" + file[:len(file)-3], File: file}
			on := def
			on.Name = "switch_on_" + file[:len(file)-3]
			on.Options = []string{sw.define}
			a, err := c.Compile(def, SM90)
			require.NoError(t, err, file)
			b, err := c.Compile(on, SM90)
			require.NoError(t, err, "%s with %s", file, sw.define)
			assert.NotEqual(t, a.Key, b.Key, "%s: %s must change the cache key", file, sw.define)
			assert.False(t, bytes.Equal(a.CUBIN, b.CUBIN), "%s: %s must change the code", file, sw.define)
			assert.Contains(t, b.Options, sw.define)
		}
		// The default option list carries no switch.
		opts, _ := compileOptions(Module{Name: "p", File: "p.cu"}, SM90, 12)
		assert.NotContains(t, opts, sw.define)
	}
}
