package channels_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// ceLabModes names kernels/ce_lab.cu's load modes, in enum order.
var ceLabModes = []string{"copy", "read", "spin"}

// TestCopyEngineLab measures what internode's network leg over the port
// over CUDA IPC runs into: a port put between GPUs 0 and 1 (both ranks
// putting to each other at once, one put of the count and its flush per
// launch, as ep-bench's "put once") alone and beside kernels that keep
// some SMs copying HBM, reading it, or only busy (kernels/ce_lab.cu), with
// the count in one put or cut into back-to-back pieces. It measures, it
// does not check: it runs only with GOEP_CE_LAB=1 on a machine with 2+
// GPUs. GOEP_CE_LAB_BYTES sets the count (default 58720256: an EP2
// dispatch's network bytes at 4096 tokens of 7168 BF16).
func TestCopyEngineLab(t *testing.T) {
	if os.Getenv("GOEP_CE_LAB") != "1" {
		t.Skip("set GOEP_CE_LAB=1 to run the copy-engine lab")
	}
	if n, err := device.CUDADeviceCount(); err != nil || n < 2 {
		t.Skipf("needs 2 GPUs (%d, %v)", n, err)
	}
	size := int64(58720256)
	if s := os.Getenv("GOEP_CE_LAB_BYTES"); s != "" {
		if _, err := fmt.Sscan(s, &size); err != nil || size <= 0 || size%(64*16) != 0 {
			t.Fatalf("GOEP_CE_LAB_BYTES=%q: want a positive multiple of 1024", s)
		}
	}
	type cfg struct{ blocks, mode, pieces int }
	var cfgs []cfg
	for _, pieces := range []int{1, 4, 16, 64} {
		cfgs = append(cfgs, cfg{0, 0, pieces})
		for _, blocks := range []int{8, 24, 48, 96} {
			for mode := range ceLabModes {
				cfgs = append(cfgs, cfg{blocks, mode, pieces})
			}
		}
	}
	const reps = 7 // the first warms up; the median of the rest
	const loadNS = 3_000_000
	const loadWords = 256 << 20 / 16 // 256 MiB a side
	type result struct{ putUS, loadGBps float64 }
	results := make([][]result, 2) // [rank][cfg]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ccfg := channels.Config{Timeouts: channels.Timeouts{Wait: testWait},
		Network: channels.NetworkConfig{Transport: channels.TransportCudaIPC, VirtualNodes: 2}}
	errs := channeltest.RunRanks(ctx, device.CUDA, 2, bootstrap.Config{Timeout: time.Minute}, ccfg,
		channeltest.LayoutFor(int(size)), func(ctx context.Context, r *channeltest.Rank) error {
			me := r.Comm.Rank()
			if err := r.EnsurePort(ctx); err != nil {
				return err
			}
			src, err := r.Dev.Alloc(16 * loadWords)
			if err != nil {
				return err
			}
			defer r.Dev.Free(src)
			dst, err := r.Dev.Alloc(16 * loadWords)
			if err != nil {
				return err
			}
			defer r.Dev.Free(dst)
			outs, err := r.Dev.Alloc(32)
			if err != nil {
				return err
			}
			defer r.Dev.Free(outs)
			putSt, err := r.Dev.NewStream()
			if err != nil {
				return err
			}
			defer putSt.Close()
			loadSt, err := r.Dev.NewStream()
			if err != nil {
				return err
			}
			defer loadSt.Close()
			dstOff := uint64(r.Layout.Region + r.Layout.Guard)
			results[me] = make([]result, len(cfgs))
			for i, c := range cfgs {
				var puts, loads []float64
				for rep := range reps {
					if err := r.Dev.CopyIn(outs.Ptr, make([]byte, 32)); err != nil {
						return err
					}
					if err := r.Comm.Barrier(ctx); err != nil {
						return err
					}
					if c.blocks > 0 {
						args := device.NewArgs(6).Ptr(src.Ptr).Ptr(dst.Ptr).U64(loadWords).U64(loadNS).U32(uint32(c.mode)).Ptr(outs.Ptr + 16)
						if err := r.Dev.Launch(devapi.KernelCELabLoad, device.D1(c.blocks), device.D1(512), 0, loadSt, args); err != nil {
							return err
						}
					}
					piece := uint64(size / int64(c.pieces))
					args := device.NewArgs(8).Ptr(r.PortHandles.Ptr()).U32(uint32(1 - me)).U64(dstOff).U64(0).U64(piece).
						U32(uint32(c.pieces)).U32(25).Ptr(outs.Ptr)
					if err := r.Dev.Launch(devapi.KernelPortPutBench, device.D1(1), device.D1(32), 0, putSt, args); err != nil {
						return err
					}
					if err := putSt.Synchronize(); err != nil {
						return err
					}
					if err := loadSt.Synchronize(); err != nil {
						return err
					}
					got := make([]byte, 32)
					if err := r.Dev.CopyOut(got, outs.Ptr); err != nil {
						return err
					}
					w := func(k int) uint64 { return binary.LittleEndian.Uint64(got[8*k:]) }
					if w(0) != 1 {
						return fmt.Errorf("cfg %+v: the put's flush did not complete", c)
					}
					if c.blocks > 0 && w(1) >= loadNS {
						return fmt.Errorf("cfg %+v: the put (%d ns) outlasted its load (%d ns)", c, w(1), loadNS)
					}
					if rep == 0 {
						continue
					}
					puts = append(puts, float64(w(1))/1e3)
					if c.blocks > 0 {
						loads = append(loads, float64(w(2))/float64(w(3)))
					}
				}
				results[me][i] = result{median(puts), median(loads)}
			}
			return nil
		})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "port put of %d bytes GPU0<->GPU1 at once (one flush a launch), median of %d; load = SMs of each GPU running ce_lab for %d us:\n",
		size, reps-1, loadNS/1000)
	fmt.Fprintf(&b, "  %6s  %6s  %4s  %9s  %9s  %8s  %8s  %12s\n", "pieces", "blocks", "load", "us r0", "us r1", "GB/s r0", "GB/s r1", "load GB/s r0")
	for i, c := range cfgs {
		mode := "-"
		if c.blocks > 0 {
			mode = ceLabModes[c.mode]
		}
		r0, r1 := results[0][i], results[1][i]
		fmt.Fprintf(&b, "  %6d  %6d  %4s  %9.1f  %9.1f  %8.1f  %8.1f  %12.1f\n", c.pieces, c.blocks, mode, r0.putUS, r1.putUS,
			float64(size)/r0.putUS/1e3, float64(size)/r1.putUS/1e3, r0.loadGBps)
	}
	t.Log(b.String())
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
