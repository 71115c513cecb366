package channels_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// semLabVariants names the variants of kernels/sem_lab.cu, in enum order.
var semLabVariants = []string{
	"api (red.release.sys / relaxed polls + ld.acquire.sys, counter in memory, watchdog)",
	"same ordering, counter in a register, no watchdog",
	"fence.acq_rel.sys + relaxed red / relaxed polls + fence.acq_rel.sys",
	"fence.sc.sys + relaxed red / relaxed polls + fence.sc.sys",
	"release/acquire at .gpu scope (insufficient; a bound)",
	"relaxed red / relaxed polls (no ordering; the floor)",
	"atom.release.sys (fetch) / relaxed polls + acquire",
	"red.release.sys / acquire on every poll",
	"red.release.sys / relaxed polls (release only)",
	"relaxed red / relaxed polls + ld.acquire.sys (acquire only)",
}

// TestSemaphoreLatencyLab times a signal/wait round trip between GPUs 0
// and 1 built each way of kernels/sem_lab.cu. It measures, it does not
// check: it runs only with GOEP_SEM_LAB=1 on a machine with 2+ GPUs.
func TestSemaphoreLatencyLab(t *testing.T) {
	if os.Getenv("GOEP_SEM_LAB") != "1" {
		t.Skip("set GOEP_SEM_LAB=1 to run the semaphore latency lab")
	}
	if n, err := device.CUDADeviceCount(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs (%d, %v)", n, err)
	}
	const iters = 100000
	results := make([][]float64, 2) // [rank][variant] us per round trip
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	errs := channeltest.RunRanks(ctx, device.CUDA, 2, bootstrap.Config{Timeout: time.Minute},
		channels.Config{Timeouts: channels.Timeouts{Wait: testWait}}, channeltest.LayoutFor(4096),
		func(ctx context.Context, r *channeltest.Rank) error {
			me := r.Comm.Rank()
			results[me] = make([]float64, len(semLabVariants))
			out, err := r.Dev.Alloc(64)
			if err != nil {
				return err
			}
			defer r.Dev.Free(out)
			for v := range semLabVariants {
				for rep := 0; rep < 3; rep++ { // the first repetition warms up
					args := device.NewArgs(6).Ptr(r.Handles.Ptr()).U32(uint32(1 - me)).U64(iters).
						U32(uint32(1 - me)).U32(uint32(v)).Ptr(out.Ptr)
					if err := r.Dev.Launch(devapi.KernelSemLabPingPong, device.D1(1), device.D1(32), 0, nil, args); err != nil {
						return err
					}
					if err := r.Dev.DefaultStream().Synchronize(); err != nil {
						return err
					}
					got := make([]byte, 16)
					if err := r.Dev.CopyOut(got, out.Ptr); err != nil {
						return err
					}
					done, ns := le64(got[0:]), le64(got[8:])
					if done != iters {
						return fmt.Errorf("variant %d: %d of %d rounds", v, done, iters)
					}
					if rep > 0 {
						us := float64(ns) / 1e3 / iters
						if rep == 1 || us < results[me][v] {
							results[me][v] = us
						}
					}
					if err := r.Comm.Barrier(ctx); err != nil {
						return err
					}
				}
			}
			return nil
		})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "signal/wait round trip GPU0<->GPU1, %d rounds, best of 2 (us):\n", iters)
	for v, name := range semLabVariants {
		fmt.Fprintf(&b, "  %2d  %6.3f  %s\n", v, results[0][v], name)
	}
	t.Log(b.String())
}

func le64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}
