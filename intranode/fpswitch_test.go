package intranode_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/intranode"
)

// The fingerprint A/B switch on the real kernels (CPU emulation). In the
// default build, a cached dispatch of FP8 rows on one rank against BF16
// rows on the other fails on both with a mismatch naming the dtype. The
// test then runs this binary again with $GOEP_BENCH_NO_FINGERPRINT=1 (the
// benchmark's switch): there the same calls are NOT detected (both ranks
// return success: the entry flags carry no tag and nothing is checked),
// and the switched kernels still match the reference on 2 ranks (the A/B
// times a correct build).
func TestEmulatedFingerprintSwitch(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	errs, _ := emuMismatch(t, 1, [][]emuCall{{cachedFP8}, {cached}})
	if kernelflags.NoFingerprint() {
		for i, err := range errs {
			require.NoError(t, err, "rank %d: with the fingerprint compiled out, a mismatch goes unseen", i)
		}
		t.Log("mismatched calls returned success on every rank: " + kernelflags.Mode())
		return
	}
	for i, err := range errs {
		var te *channels.TimeoutError
		require.ErrorAs(t, err, &te, "rank %d", i)
		require.Equal(t, uint32(intranode.StageMismatch), te.Stage, "rank %d: %v", i, err)
		require.Contains(t, intranode.NewMismatchError(i, te.Peer, "emulated", te.Expected, te.Observed).Error(),
			"dtype FP8", "rank %d", i)
	}
	s, err := kernelflags.RerunSwitched("^(TestEmulatedFingerprintSwitch|TestEmulatedKernels)$/^(R2-H128-.*)?$")
	require.NoError(t, err, "%s", s)
	require.Contains(t, s, "intranode tests: fingerprint=off", "the child ran the switched build")
	require.Contains(t, s, "mismatched calls returned success on every rank")
	require.Contains(t, s, "--- PASS: TestEmulatedKernels/R2-H128-")
	require.False(t, strings.Contains(s, "--- SKIP"), "the child skipped:\n%s", s)
}
