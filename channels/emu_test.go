package channels_test

// The real kernels/channel_kernels.cu and port_kernels.cu (with the device
// API headers they include: memory channels, LL packets, semaphores, the
// port-channel FIFO) on CPU threads (internal/cpuemu), through the checks
// of channeltest on goroutine ranks. Port channels run end to end: the
// emulated threads push triggers into the FIFO in host memory and the real
// Go proxy carries them out. Data is compared byte for byte with what the
// sender wrote; counts with what was sent.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
)

// emuRaw runs fn on n goroutine ranks, each with its bootstrap and an
// emulated device.
func emuRaw(t *testing.T, n int, fn func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error) {
	t.Helper()
	cpuemu.SkipUnavailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	errs := bootstrap.RunInProcess(ctx, n, bootstrap.Config{Timeout: 2 * time.Minute},
		func(ctx context.Context, bs bootstrap.Bootstrap) error {
			dev, err := cpuemu.Open(bs.Rank(), cpuemu.Options{SMs: 2})
			if err != nil {
				return err
			}
			return errors.Join(fn(ctx, bs, dev), dev.Close())
		})
	for r, err := range errs {
		assert.NoError(t, err, "emulated rank %d", r)
	}
}

// emuRanks is runRanks on emulated devices: a communicator and a
// channeltest.Rank per rank; nothing is freed until every rank is done.
func emuRanks(t *testing.T, n, maxBytes int, fn func(ctx context.Context, r *channeltest.Rank) error) {
	t.Helper()
	var finished sync.WaitGroup
	finished.Add(n)
	emuRaw(t, n, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		var comm *channels.Communicator
		var r *channeltest.Rank
		err := func() (err error) {
			if comm, err = channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: time.Minute}}); err != nil {
				return err
			}
			if r, err = channeltest.NewRank(ctx, comm, channeltest.LayoutFor(maxBytes)); err != nil {
				return err
			}
			return fn(ctx, r)
		}()
		if err != nil {
			_ = bs.Close()
		}
		finished.Done()
		finished.Wait()
		if r != nil {
			err = errors.Join(err, r.Close())
		}
		if comm != nil {
			err = errors.Join(err, comm.Close())
		}
		return err
	})
}

var emuSizes = []int{4, 5, 7, 16, 17, 31, 127, 1000, 4093, 65537}

// Memory channels: put, get, signal and wait, LL16 and LL8 packets, host
// semaphores, counter waits, packets in replayed graphs, on 2 and 4 ranks.
func TestEmulatedMemoryChannels(t *testing.T) {
	for _, n := range []int{2, 4} {
		emuRanks(t, n, 1<<17, func(ctx context.Context, r *channeltest.Rank) error {
			if err := r.CheckPutGet(ctx, seed, emuSizes); err != nil {
				return err
			}
			for _, proto := range []int{16, 8} {
				if err := r.CheckPackets(ctx, seed, emuSizes, proto); err != nil {
					return err
				}
				if err := r.CheckGraphPackets(ctx, seed, proto, 256, 5); err != nil {
					return err
				}
			}
			if err := r.CheckSignals(ctx, 100, 50); err != nil {
				return err
			}
			if err := r.CheckHostSemaphores(ctx, 3, 20); err != nil {
				return err
			}
			return r.CheckCounterWait(ctx)
		})
	}
}

// The measurement kernels check what they move (LL patterns in the
// kernel, put-all and ping-pong counters); tiny iteration counts.
func TestEmulatedChannelBenchKernels(t *testing.T) {
	emuRanks(t, 2, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
		if _, err := r.BenchPingPong(ctx, 20, false); err != nil {
			return err
		}
		if _, err := r.BenchPingPong(ctx, 20, true); err != nil {
			return err
		}
		if _, err := r.BenchPutGet(ctx, []int{4096}, 2, 64, 2); err != nil {
			return err
		}
		if _, err := r.BenchPutAll(ctx, 4096, []int{1, 2}, 64, 2, true); err != nil {
			return err
		}
		for _, proto := range []int{16, 8} {
			if _, err := r.BenchLL(ctx, proto, []int{64, 1000}, 3, 9); err != nil {
				return err
			}
		}
		return nil
	})
}

// Port channels: puts, signals and flushes of random sizes pushed by
// emulated threads and carried out by the Go proxy arrive byte-exact and
// in order; concurrent atomic adds sum exactly; the measurement kernels
// run and check their counters.
func TestEmulatedPortChannels(t *testing.T) {
	for _, n := range []int{2, 4} {
		emuRanks(t, n, 16<<10, func(ctx context.Context, r *channeltest.Rank) error {
			if err := r.CheckPortStream(ctx, seed, 40, 16<<10); err != nil {
				return err
			}
			return r.CheckPortAtomics(ctx, seed, 300, 1)
		})
	}
	emuRanks(t, 2, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
		if _, err := r.BenchPortPingPong(ctx, 20); err != nil {
			return err
		}
		if _, err := r.BenchPortPut(ctx, []int{8, 4096}, 2); err != nil {
			return err
		}
		_, err := r.BenchPortAtomic(ctx, 200)
		return err
	})
}

// Waits nobody satisfies end with timeout errors naming the wait (memory
// and port channels), and an abort ends every waiting block.
func TestEmulatedTimeouts(t *testing.T) {
	emuRaw(t, 2, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		if err := channeltest.CheckTimeout(ctx, bs, dev, 300*time.Millisecond); err != nil {
			return err
		}
		if err := channeltest.CheckAbort(ctx, bs, dev); err != nil {
			return err
		}
		return channeltest.CheckPortTimeouts(ctx, bs, dev, 300*time.Millisecond)
	})
}

func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"channel_kernels.cu", "port_kernels.cu"}, nil)
}
