package userkernel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
)

// backend is where a test's goroutine ranks run: goep's CPU emulation of
// the user's CUDA source (always; skipped without g++), the plain host
// backend (which refuses user kernels), or the GPUs (ranks spread over
// those present, several per GPU when there are fewer GPUs than ranks).
type backend string

const (
	emu  backend = "emu"
	host backend = "host"
	gpu  backend = "cuda"
)

// kernelBackends are the backends that run user kernels here: the
// emulation, and the GPUs when present.
func kernelBackends(t *testing.T) []backend {
	out := []backend{emu}
	if n, err := device.CUDADeviceCount(); err == nil && n > 0 {
		out = append(out, gpu)
	} else {
		t.Logf("GPU runs skipped: no CUDA GPU (%v)", err)
	}
	return out
}

func open(b backend, rank int) (device.Device, error) {
	switch b {
	case emu:
		return cpuemu.Open(rank, cpuemu.Options{SMs: 2})
	case gpu:
		return device.OpenRank(device.CUDA, rank)
	}
	return device.OpenHost(rank), nil
}

// runRanks runs fn on n goroutine ranks of b, each with a communicator
// whose device waits give up after wait. No rank closes its communicator
// or device until every rank's fn has returned (a peer may still reach its
// memory); a rank that fails closes its bootstrap so the others fail fast.
func runRanks(t *testing.T, b backend, n int, wait time.Duration, fn func(ctx context.Context, comm *channels.Communicator) error) []error {
	t.Helper()
	if b == emu {
		cpuemu.SkipUnavailable(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var done sync.WaitGroup
	done.Add(n)
	return bootstrap.RunInProcess(ctx, n, bootstrap.Config{Timeout: 2 * time.Minute},
		func(ctx context.Context, bs bootstrap.Bootstrap) error {
			var comm *channels.Communicator
			dev, err := open(b, bs.Rank())
			if err == nil {
				comm, err = channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: wait}})
			}
			if err == nil {
				err = fn(ctx, comm)
			}
			if err != nil {
				_ = bs.Close()
			}
			done.Done()
			done.Wait()
			if comm != nil {
				err = errors.Join(err, comm.Close())
			}
			if dev != nil {
				err = errors.Join(err, dev.Close())
			}
			if err != nil {
				return fmt.Errorf("%s rank %d: %w", b, bs.Rank(), err)
			}
			return nil
		})
}

// noErrors fails t with every rank's error.
func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		assert.NoError(t, err, "rank %d", r)
	}
}
