package collectives_test

// The real kernels/coll_ll.cu, coll_bulk.cu and coll_util.cu on CPU
// threads (internal/cpuemu), through the Communicator on goroutine ranks:
// every allreduce, allgather and reduce-scatter kernel, compared with the
// plain-Go reference (collectives/ref) element by element on the host.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
)

// emuConfig keeps the emulation small: 64 threads, 2 blocks, a 96 KiB
// scratch (the scratch kernels run several rounds from a few KiB on).
func emuConfig() collectives.Config {
	return collectives.Config{
		Channels:     channels.Config{Timeouts: channels.Timeouts{Wait: 2 * time.Minute}},
		ScratchBytes: 96 << 10, PacketBytes: 512 << 10, MaxBlocks: 2, LLMaxBlocks: 2, Threads: 64,
		NCCL: collectives.NCCLOff,
	}
}

func runEmu(t *testing.T, ranks int, cfg collectives.Config, fn func(ctx context.Context, c *collectives.Communicator) error) {
	t.Helper()
	cpuemu.SkipUnavailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	open := func(r int) (device.Device, error) { return cpuemu.Open(r, cpuemu.Options{SMs: 2}) }
	errs := colltest.RunDevices(ctx, ranks, open, bootstrap.Config{Timeout: 5 * time.Minute},
		func(int) collectives.Config { return cfg }, fn)
	ranktest.NoErrors(t, errs)
}

// emuKernels lists every native algorithm of every collective.
func emuKernels() [][2]any {
	var out [][2]any
	for _, k := range collectives.Kinds {
		for _, a := range collectives.Algorithms(k) {
			if a != collectives.AlgoNCCL {
				out = append(out, [2]any{k, a})
			}
		}
	}
	return out
}

// Every algorithm of every collective, sizes around the vector, word,
// piece and round boundaries, each type and reduction in turn, in and out
// of place, aligned and not, on 2, 3 (pieces that do not divide) and 4
// ranks.
func TestEmulatedKernelsMatchReference(t *testing.T) {
	for _, ranks := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			runEmu(t, ranks, emuConfig(), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				seed := uint32(ranks * 1000)
				// Odd and even, below and above a block's share, one
				// multi-block and one large count (CI runs these on 2
				// cores: each size costs seconds).
				sizes := []int{1, 8, 17, 1023, 4100, 20011}
				if ranks == 4 {
					sizes = []int{5, 257, 4100, 30011}
				}
				for _, ka := range emuKernels() {
					k, a := ka[0].(collectives.Kind), ka[1].(string)
					dts := []ref.DataType{ref.BF16, ref.FP16, ref.FP32}
					if k == collectives.AllGather {
						dts = append(dts, ref.FP8E4M3)
					}
					for i, n := range sizes {
						seed++
						op := ref.Ops[(i+int(seed))%len(ref.Ops)]
						if k == collectives.AllGather {
							op = ref.Sum
						}
						cs := colltest.Case{Kind: k, Algorithm: a, Count: n, DType: dts[(i+ranks)%len(dts)], Op: op, Seed: seed,
							InPlace: i%3 == 1, Offset: []int{0, 0, 1, 8}[i%4]}
						if !b.Fits(cs) {
							continue
						}
						if _, err := b.Check(ctx, cs); err != nil {
							return err
						}
					}
				}
				return nil
			})
		})
	}
}

// Back-to-back calls that switch algorithms every call (flags, slots and
// semaphores carried across kernels), and graph replays.
func TestEmulatedBackToBackAndGraphs(t *testing.T) {
	runEmu(t, 3, emuConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		for _, k := range collectives.Kinds {
			algos := []string{collectives.AlgoLL, collectives.AlgoScratch, collectives.AlgoZC}
			if k == collectives.AllReduce {
				algos = append(algos, collectives.AlgoLL2)
			}
			cs := colltest.Case{Kind: k, Count: 3001, DType: ref.BF16, Op: ref.Sum, Seed: 77}
			if _, err := b.BackToBack(ctx, cs, 12, algos); err != nil {
				return err
			}
			for _, a := range algos {
				cs.Algorithm = a
				if err := b.GraphPair(ctx, cs, 3); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Another grid geometry: 96-thread blocks (three warps), 3 blocks, a
// scratch that forces many rounds, on 4 ranks.
func TestEmulatedOddGeometry(t *testing.T) {
	cfg := emuConfig()
	cfg.Threads, cfg.MaxBlocks, cfg.LLMaxBlocks, cfg.ScratchBytes = 96, 3, 3, 64<<10
	runEmu(t, 4, cfg, func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		seed := uint32(900)
		for _, ka := range emuKernels() {
			k, a := ka[0].(collectives.Kind), ka[1].(string)
			for i, n := range []int{9, 5005, 30011} {
				seed++
				cs := colltest.Case{Kind: k, Algorithm: a, Count: n, DType: []ref.DataType{ref.BF16, ref.FP32}[i%2],
					Op: ref.Sum, Seed: seed, InPlace: i%2 == 1}
				if !b.Fits(cs) {
					continue
				}
				if _, err := b.Check(ctx, cs); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Matched ll2 allreduces of a few words back to back, where two or more
// ranks' pieces are empty (3 ranks: one word; 4 ranks: two words): a rank
// must never overwrite a packet of such a call that a peer has yet to read
// with one of its next call (the presence packets of goep_coll_ar_ll2 in
// kernels/coll_ll.cu; with one a pair instead of one a round, both subtests
// stalled within 500 calls in every run tried). A short wait timeout, so
// that a lost packet fails in seconds; the results of these sizes are
// checked by TestEmulatedKernelsMatchReference.
func TestEmulatedTinyLL2BackToBack(t *testing.T) {
	for _, tc := range []struct{ ranks, count int }{{3, 1}, {4, 5}} {
		t.Run(fmt.Sprint(tc.ranks), func(t *testing.T) {
			cfg := emuConfig()
			cfg.Channels.Timeouts.Wait = 20 * time.Second
			runEmu(t, tc.ranks, cfg, func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				s := c.Device().DefaultStream()
				for i := 0; i < 500; i++ {
					w, err := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, tc.count, ref.BF16, ref.Sum,
						collectives.WithAlgorithm(collectives.AlgoLL2))
					if err == nil {
						err = w.Sync(ctx)
					}
					if err != nil {
						return fmt.Errorf("call %d: %w", i, err)
					}
				}
				return nil
			})
		})
	}
}

// The real kernels in the CPU emulation: every case against every kernel
// family, as on the host.
func TestEmulatedMismatchedCalls(t *testing.T) {
	for _, algo := range []string{collectives.AlgoLL, collectives.AlgoLL2, collectives.AlgoScratch, collectives.AlgoZC} {
		base := mmCall{kind: collectives.AllReduce, count: 700, dt: ref.BF16, op: ref.Sum, algo: algo}
		for _, cs := range mmCases(algo) {
			t.Run(algo+"/"+cs.name, func(t *testing.T) {
				runMismatch(t, 3, func(fn func(ctx context.Context, c *collectives.Communicator) error) {
					runEmu(t, 3, emuConfig(), fn)
				}, cs, base)
			})
		}
	}
	for _, algo := range []string{collectives.AlgoLL, collectives.AlgoScratch, collectives.AlgoZC} {
		base := mmCall{kind: collectives.ReduceScatter, count: 300, dt: ref.FP16, op: ref.Min, algo: algo}
		cs := mmCases(algo)[1] // count
		t.Run("reducescatter-"+algo+"/"+cs.name, func(t *testing.T) {
			runMismatch(t, 3, func(fn func(ctx context.Context, c *collectives.Communicator) error) {
				runEmu(t, 3, emuConfig(), fn)
			}, cs, base)
		})
	}
}

// Last: every kernel above ran (the mismatch cases run goep_coll_fp_sync).
func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"coll_ll.cu", "coll_bulk.cu", "coll_util.cu"}, nil)
}
