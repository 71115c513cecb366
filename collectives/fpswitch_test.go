package collectives_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
)

// The fingerprint A/B switch on the real kernels (CPU emulation). In the
// default build, two ranks that run an LL allreduce with different
// reductions fail with ErrMismatch.
// The test then runs this binary again with $GOEP_BENCH_NO_FINGERPRINT=1
// (the benchmarks' switch): there the same calls are NOT detected (every
// rank returns success: no tag, no check is compiled in), and the switched
// kernels still match the reference on 2 ranks (the A/B times a correct
// build).
func TestEmulatedFingerprintSwitch(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	errs := runSwitchMismatch(t)
	if kernelflags.NoFingerprint() {
		for r, err := range errs {
			require.NoError(t, err, "rank %d: with the fingerprint compiled out, a mismatch goes unseen", r)
		}
		t.Log("mismatched calls returned success on every rank: " + kernelflags.Mode())
		return
	}
	for r, err := range errs {
		require.ErrorIs(t, err, collectives.ErrMismatch, "rank %d", r)
	}
	s, err := kernelflags.RerunSwitched("^(TestEmulatedFingerprintSwitch|TestEmulatedKernelsMatchReference)$/^(2)?$")
	require.NoError(t, err, "%s", s)
	require.Contains(t, s, "collectives tests: fingerprint=off", "the child ran the switched build")
	require.Contains(t, s, "mismatched calls returned success on every rank")
	require.Contains(t, s, "--- PASS: TestEmulatedKernelsMatchReference/2")
	require.NotContains(t, s, "--- SKIP")
}

// runSwitchMismatch: 2 emulated ranks, one matched LL allreduce, then an LL
// allreduce with sum on rank 0 and max on rank 1, then a scratch (bulk)
// allreduce with sum against min (a difference that changes no round or
// signal count, so the build without fingerprints completes it); the
// per-rank errors of the mismatched calls (the first that failed).
func runSwitchMismatch(t *testing.T) []error {
	t.Helper()
	const ranks = 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := emuConfig()
	cfg.Channels.Timeouts.Wait = 20 * time.Second // a missed detection ends here, not in a hang
	out := make([]error, ranks)
	open := func(r int) (device.Device, error) { return cpuemu.Open(r, cpuemu.Options{SMs: 2}) }
	errs := colltest.RunDevices(ctx, ranks, open, bootstrap.Config{Timeout: 5 * time.Minute},
		func(int) collectives.Config { return cfg }, func(ctx context.Context, c *collectives.Communicator) error {
			b, err := colltest.NewBuffers(ctx, c, 1<<16, false)
			if err != nil {
				return err
			}
			defer b.Free()
			s := c.Device().DefaultStream()
			call := func(count int, op ref.Op, algo string) error {
				w, err := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, count, ref.BF16, op, collectives.WithAlgorithm(algo))
				if err == nil {
					err = w.Sync(ctx)
				}
				return err
			}
			if err := call(300, ref.Sum, collectives.AlgoLL); err != nil {
				return err
			}
			op, op2 := ref.Sum, ref.Sum
			if c.Rank() == 1 {
				op, op2 = ref.Max, ref.Min
			}
			err = call(300, op, collectives.AlgoLL)
			if err == nil {
				err = call(700, op2, collectives.AlgoScratch)
			}
			out[c.Rank()] = err
			return nil
		})
	for r, err := range errs {
		if err != nil && !errors.Is(err, collectives.ErrMismatch) && !strings.Contains(err.Error(), "mismatch") {
			require.NoError(t, err, "rank %d", r)
		}
	}
	return out
}
