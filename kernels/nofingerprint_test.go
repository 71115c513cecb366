package kernels

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/kernelflags"
)

// The fingerprinted modules compile with the measurement switch's define
// (the build the GPU A/B runs), into another cache entry and other code
// than the default build. The switch itself (kernelflags.Defines in
// compileOptions) is exercised end to end by the intranode and collectives
// switch tests, which re-run their binary with $GOEP_BENCH_NO_FINGERPRINT.
func TestNoFingerprintBuildCompiles(t *testing.T) {
	needNVRTC(t)
	require.False(t, kernelflags.NoFingerprint(), "this test binary runs the default build")
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	for _, file := range []string{"coll_ll.cu", "coll_bulk.cu"} {
		def := Module{Name: "nofp_default_" + file[:len(file)-3], File: file}
		off := def
		off.Name = "nofp_off_" + file[:len(file)-3]
		off.Options = []string{kernelflags.DefineNoFingerprint}
		a, err := c.Compile(def, SM90)
		require.NoError(t, err, file)
		b, err := c.Compile(off, SM90)
		require.NoError(t, err, "%s with %s", file, kernelflags.DefineNoFingerprint)
		assert.NotEqual(t, a.Key, b.Key, "%s: the define must change the cache key", file)
		assert.False(t, bytes.Equal(a.CUBIN, b.CUBIN), "%s: the define must change the code", file)
		assert.Contains(t, b.Options, kernelflags.DefineNoFingerprint)
	}
	// The default option list carries no switch.
	opts, _ := compileOptions(Module{Name: "p", File: "p.cu"}, SM90, 12)
	assert.NotContains(t, opts, kernelflags.DefineNoFingerprint)
}
