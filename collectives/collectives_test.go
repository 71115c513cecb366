package collectives_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// Correctness of every algorithm against the plain-Go reference: every
// collective, type, reduction, in and out of place, misaligned buffers,
// sizes from 1 element across every boundary the algorithms have (words,
// vectors, pieces, blocks, rounds), on 2..4 host ranks (8 for a subset),
// and on 2, 4 and 8 GPUs up to 1 GiB when present.

// dtypesOf are the types a collective runs natively.
func dtypesOf(k collectives.Kind) []ref.DataType {
	if k == collectives.AllGather {
		return ref.DataTypes
	}
	return []ref.DataType{ref.BF16, ref.FP16, ref.FP32}
}

// algosOf are the algorithms to check on w: the native ones, and NCCL
// where it can run (GPUs, or the host stand-in).
func algosOf(w world, k collectives.Kind) []string {
	var out []string
	for _, a := range collectives.Algorithms(k) {
		if a != collectives.AlgoNCCL || ncclRuns(w) || (!w.gpu() && fakeNCCLPath != "") {
			out = append(out, a)
		}
	}
	return out
}

// sizes are element counts; large sizes only with sum (the reductions
// differ only per element).
func sizes(w world, large bool) []int {
	s := []int{1, 2, 3, 5, 8, 13, 64, 257, 1000, 4099, 20011}
	if large {
		s = append(s, 65537, 300007)
		if w.gpu() {
			s = append(s, 1<<20+3, 4<<20+5)
		}
	}
	return s
}

// caseList builds the correctness cases of one collective and algorithm.
func caseList(w world, k collectives.Kind, algo string, seed *uint32) []colltest.Case {
	var out []colltest.Case
	nccl := algo == collectives.AlgoNCCL
	for _, dt := range dtypesOf(k) {
		ops := []ref.Op{ref.Sum}
		if k != collectives.AllGather {
			ops = ref.Ops
		}
		for _, op := range ops {
			for i, n := range sizes(w, op == ref.Sum && (dt == ref.BF16 || w.gpu())) {
				*seed++
				cs := colltest.Case{Kind: k, Algorithm: algo, Count: n, DType: dt, Op: op, Seed: *seed,
					InPlace: i%3 == 2, Offset: []int{0, 0, 0, 1, 3, 8}[i%6]}
				if nccl {
					// NCCL sums in its own order: small integers are exact in every order.
					cs.Fill, cs.Offset = ref.FillSmallInt, 0
					if dt == ref.FP8E4M3 && !w.gpu() {
						continue // the host stand-in moves fp8 as bytes only through allgather (done)
					}
				}
				out = append(out, cs)
			}
		}
	}
	return out
}

func TestAlgorithmsMatchReference(t *testing.T) {
	worlds := append(append([]world{}, hostWorlds...), gpuWorlds(t)...)
	for _, w := range worlds {
		t.Run(w.String(), func(t *testing.T) {
			arena := 8 << 20
			if w.gpu() {
				arena = w.ranks*(4<<20+5)*4 + 1<<20 // the largest case: an fp32 allgather of 4M+5 per rank
			}
			start := time.Now()
			var checked atomic.Int64
			run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, arena, true)
				if err != nil {
					return err
				}
				defer b.Free()
				if w.gpu() {
					b.HostLimit = 1 << 20 // beyond: the device checks all, the host a sample
				}
				seed := uint32(100)
				for _, k := range collectives.Kinds {
					for _, a := range algosOf(w, k) {
						for _, cs := range caseList(w, k, a, &seed) {
							if !b.Fits(cs) {
								continue
							}
							got, err := b.Check(ctx, cs)
							if err != nil {
								return err
							}
							if got != a {
								return fmt.Errorf("%s ran %s", cs, got)
							}
							if c.Rank() == 0 {
								checked.Add(1)
							}
						}
					}
				}
				return nil
			})
			t.Logf("%s: %d cases per rank in %s", w, checked.Load(), time.Since(start).Round(time.Millisecond))
		})
	}
}

// Eight host ranks: every algorithm on a few sizes (the suite above on 2..4
// ranks covers the rest).
func TestEightHostRanks(t *testing.T) {
	w := world{device.Host, 8}
	run(t, w, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 2<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		seed := uint32(9)
		for _, k := range collectives.Kinds {
			for _, a := range algosOf(w, k) {
				for i, n := range []int{1, 17, 4099, 33333} {
					seed++
					cs := colltest.Case{Kind: k, Algorithm: a, Count: n, DType: ref.BF16, Op: ref.Sum, Seed: seed, InPlace: i == 2}
					if a == collectives.AlgoNCCL {
						cs.Fill = ref.FillSmallInt
					}
					if !b.Fits(cs) {
						continue
					}
					if _, err := b.Check(ctx, cs); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// Large messages: 16 MiB on the host (CI), 1 GiB on GPUs, through every
// bulk algorithm (GPUs: NCCL too). Outputs beyond 64 MiB are checked in
// full on the device and on a sample against the Go reference.
func TestLargeMessages(t *testing.T) {
	worlds := []world{{device.Host, 2}}
	worlds = append(worlds, gpuWorlds(t)...)
	for _, w := range worlds {
		t.Run(w.String(), func(t *testing.T) {
			limit := 16 << 20
			if w.gpu() {
				limit = 1 << 30
			}
			run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, limit+(64<<10), true)
				if err != nil {
					return err
				}
				defer b.Free()
				b.HostLimit = 1 << 20 // the device check (the Go twin on the host) covers every element
				for _, k := range collectives.Kinds {
					for _, a := range algosOf(w, k) {
						if a == collectives.AlgoLL || a == collectives.AlgoLL2 {
							continue
						}
						dt := ref.BF16
						count := limit / 2
						if k != collectives.AllReduce {
							count /= c.Size() // per-rank part; the whole buffer is limit bytes
						}
						if !w.gpu() && a == collectives.AlgoScratch {
							dt, count = ref.FP32, count/2
						}
						cs := colltest.Case{Kind: k, Algorithm: a, Count: count - 3, DType: dt, Op: ref.Sum, Seed: 4242}
						if a == collectives.AlgoNCCL {
							cs.Fill = ref.FillSmallInt
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

// 1000 back-to-back calls without synchronisation, every result checked:
// one algorithm at a time, then all of them interleaved (consecutive calls
// hand the packet and scratch buffers from one algorithm to another).
func TestThousandBackToBack(t *testing.T) {
	worlds := []world{{device.Host, 4}}
	worlds = append(worlds, gpuWorlds(t)...)
	for _, w := range worlds {
		t.Run(w.String(), func(t *testing.T) {
			run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 4<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				for _, k := range collectives.Kinds {
					algos := algosOf(w, k)
					count := 5001
					if k == collectives.AllReduce {
						count = 20001
					}
					if !w.gpu() {
						count /= 5 // the twins compute every element on two cores
					}
					cs := colltest.Case{Kind: k, Count: count, DType: ref.BF16, Op: ref.Sum, Seed: 31}
					iters := 1000
					if !w.gpu() {
						iters = 250 // per algorithm on the host: 1000 in the mixed run below
					}
					for _, a := range algos {
						if a == collectives.AlgoNCCL {
							continue // NCCL's order of summation differs: in the mixed run with small integers
						}
						if _, err := b.BackToBack(ctx, cs, iters, []string{a}); err != nil {
							return err
						}
					}
					cs.Fill = ref.FillSmallInt
					used, err := b.BackToBack(ctx, cs, 1000, algos)
					if err != nil {
						return err
					}
					sort.Strings(used)
					if len(used) != len(algos) {
						return fmt.Errorf("%s: interleaved run used %v, want %v", k, used, algos)
					}
				}
				return nil
			})
		})
	}
}

// Matched ll2 allreduces of one and two words back to back on the GPUs,
// where most ranks' pieces are empty and exchange only presence packets
// (kernels/coll_ll.cu): every result checked, no packet lost to the next
// launch (TestEmulatedTinyLL2BackToBack runs the same kernel in the CPU
// emulation).
func TestTinyLL2BackToBackGPU(t *testing.T) {
	for _, w := range gpuWorlds(t) {
		if w.ranks < 3 {
			continue // one empty piece at most: nothing to exchange
		}
		t.Run(w.String(), func(t *testing.T) {
			run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				for _, count := range []int{1, 5} { // BF16: one word, two words
					cs := colltest.Case{Kind: collectives.AllReduce, Count: count, DType: ref.BF16, Op: ref.Sum, Seed: 17}
					if _, err := b.BackToBack(ctx, cs, 2000, []string{collectives.AlgoLL2}); err != nil {
						return fmt.Errorf("count %d: %w", count, err)
					}
				}
				return nil
			})
		})
	}
}

// 100 replays of a captured graph holding two calls with different data,
// for every algorithm.
func TestGraphReplays(t *testing.T) {
	worlds := []world{{device.Host, 3}}
	worlds = append(worlds, gpuWorlds(t)...)
	for _, w := range worlds {
		t.Run(w.String(), func(t *testing.T) {
			run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
				b, err := colltest.NewBuffers(ctx, c, 4<<20, true)
				if err != nil {
					return err
				}
				defer b.Free()
				for _, k := range collectives.Kinds {
					for _, a := range algosOf(w, k) {
						count := 7777
						if !w.gpu() {
							count = 1001
						}
						cs := colltest.Case{Kind: k, Algorithm: a, Count: count, DType: ref.BF16, Op: ref.Sum, Seed: 5, Fill: ref.FillSmallInt}
						if err := b.GraphPair(ctx, cs, 100); err != nil {
							return err
						}
						// And a single call replayed, checked against the Go reference.
						cs.Graph, cs.Replays, cs.Count = true, 3, 1234
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

// A rank that never calls: every other rank's call ends with a timeout
// error that names it, through each family of algorithms.
func TestTimeoutNamesMissingRank(t *testing.T) {
	worlds := []world{{device.Host, 3}}
	if n := gpus(); n >= 2 {
		worlds = append(worlds, world{device.CUDA, 2})
	}
	for _, w := range worlds {
		for _, a := range []string{collectives.AlgoLL, collectives.AlgoScratch, collectives.AlgoZC} {
			t.Run(w.String()+"/"+a, func(t *testing.T) {
				cfg := configFor(w)
				cfg.Channels.Timeouts.Wait = 300 * time.Millisecond
				absent := w.ranks - 1
				errs := make([]error, w.ranks)
				run(t, w, cfg, func(ctx context.Context, c *collectives.Communicator) error {
					b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
					if err != nil {
						return err
					}
					defer b.Free()
					if c.Rank() == absent {
						return c.Barrier(ctx) // released once the others have seen their errors
					}
					s := c.Device().DefaultStream()
					work, err := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 4096, ref.BF16, ref.Sum, collectives.WithAlgorithm(a))
					if err == nil {
						err = work.Sync(ctx)
					}
					errs[c.Rank()] = err
					if err == nil {
						return errors.New("the call succeeded without rank " + fmt.Sprint(absent))
					}
					// Later calls are refused with the same error.
					if _, err2 := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 8, ref.BF16, ref.Sum); err2 == nil {
						return errors.New("a call after the timeout was accepted")
					}
					return c.Barrier(ctx)
				})
				for r, err := range errs {
					if r == absent {
						continue
					}
					require.Error(t, err)
					require.ErrorIs(t, err, channels.ErrTimeout, "rank %d", r)
					require.Contains(t, err.Error(), fmt.Sprintf("waiting on rank %d", absent), "rank %d: %v", r, err)
					t.Logf("rank %d: %v", r, err)
				}
			})
		}
	}
}

// Debug mode catches calls that do not match across ranks and names them.
func TestDebugModeCatchesMismatchedCalls(t *testing.T) {
	cfg := hostConfig()
	cfg.Debug = true
	w := world{device.Host, 3}
	run(t, w, cfg, func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, false)
		if err != nil {
			return err
		}
		defer b.Free()
		s := c.Device().DefaultStream()
		// Matching calls pass.
		if _, err := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 100, ref.BF16, ref.Sum); err != nil {
			return err
		}
		count := 100
		if c.Rank() == 1 {
			count = 200
		}
		_, err = c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, count, ref.BF16, ref.Sum)
		if err == nil {
			return errors.New("mismatched counts were accepted")
		}
		for _, want := range []string{"do not match", "count=100", "count=200", "[0 2]", "[1]"} {
			if !strings.Contains(err.Error(), want) {
				return fmt.Errorf("error %q lacks %q", err, want)
			}
		}
		// An invalid call on one rank fails every rank (instead of leaving
		// the others waiting on the device).
		send := b.Send.Ptr
		if c.Rank() == 2 {
			send = 0
		}
		_, err = c.AllReduce(ctx, s, send, b.Recv.Ptr, 100, ref.BF16, ref.Sum)
		if err == nil || !strings.Contains(err.Error(), "invalid call") || !strings.Contains(err.Error(), "ranks [2]") {
			return fmt.Errorf("one rank's invalid call: %v", err)
		}
		return nil
	})
}

// What the native algorithms do not cover goes to NCCL, or fails with an
// error naming the combination when NCCL cannot run it.
func TestUnsupportedCombinations(t *testing.T) {
	cfg := hostConfig()
	cfg.NCCL = collectives.NCCLOff
	run(t, world{device.Host, 2}, cfg, func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 8<<20, false)
		if err != nil {
			return err
		}
		defer b.Free()
		s := c.Device().DefaultStream()
		for _, tc := range []struct {
			call func() (*collectives.Work, error)
			want []string
		}{
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 64, ref.FP8E4M3, ref.Sum)
			}, []string{"allreduce", "fp8_e4m3", "not implemented natively", "NCCL"}},
			{func() (*collectives.Work, error) {
				return c.ReduceScatter(ctx, s, b.Send.Ptr, b.Recv.Ptr, 64, ref.BF16, ref.Prod)
			}, []string{"reducescatter", "prod", "not implemented natively", "NCCL is off"}},
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 64, ref.BF16, ref.Sum, collectives.WithAlgorithm("nvls"))
			}, []string{"no algorithm \"nvls\""}},
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 64, ref.BF16, ref.Sum, collectives.WithAlgorithm(collectives.AlgoZC))
			}, []string{"registered", "zc"}},
			{func() (*collectives.Work, error) {
				return c.AllGather(ctx, s, b.Send.Ptr, b.Recv.Ptr, 64, ref.DataType(9))
			}, []string{"unknown data type"}},
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, -1, ref.BF16, ref.Sum)
			}, []string{"negative count"}},
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, 0, b.Recv.Ptr, 64, ref.BF16, ref.Sum)
			}, []string{"nil buffer"}},
			{func() (*collectives.Work, error) {
				return c.AllReduce(ctx, s, b.Send.Ptr, b.Send.Ptr+2, 64, ref.BF16, ref.Sum)
			}, []string{"overlap"}},
			{func() (*collectives.Work, error) {
				return c.AllGather(ctx, s, b.Send.Ptr, b.Recv.Ptr, 200000, ref.BF16, collectives.WithAlgorithm(collectives.AlgoLL))
			}, []string{"LL packets", "PacketBytes"}},
		} {
			_, err := tc.call()
			if err == nil {
				return fmt.Errorf("accepted a call that should fail with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					return fmt.Errorf("error %q lacks %q", err, w)
				}
			}
		}
		// Unregistered buffers: the selector falls back from zero-copy.
		w, err := c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, 2<<20, ref.BF16, ref.Sum)
		if err != nil {
			return err
		}
		if w.Algorithm() != collectives.AlgoScratch {
			return fmt.Errorf("unregistered 4 MiB allreduce ran %s, want scratch", w.Algorithm())
		}
		// Zero elements: nothing to do.
		if w, err = c.AllReduce(ctx, s, 0, 0, 0, ref.BF16, ref.Sum); err != nil || !w.Done() {
			return fmt.Errorf("empty call: %v", err)
		}
		return nil
	})
}

// With NCCL (the host stand-in in CI), prod and fp8 reductions fall back to
// it.
func TestNCCLFallback(t *testing.T) {
	w := world{device.Host, 3}
	if gpus() >= 1 {
		w = world{device.CUDA, 2}
		if !ncclRuns(w) {
			t.Skipf("NCCL cannot run 2 ranks here (loaded: %v; %d GPUs, and NCCL refuses ranks sharing a GPU)", realNCCL, gpus())
		}
	} else if fakeNCCLPath == "" {
		t.Skip("the host-memory NCCL stand-in was not built")
	}
	run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
		dev := c.Device()
		n := 1000
		send, err := dev.Alloc(4 * n)
		if err != nil {
			return err
		}
		defer dev.Free(send)
		recv, err := dev.Alloc(4 * n)
		if err != nil {
			return err
		}
		defer dev.Free(recv)
		in := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			ref.SetElem(in, ref.FP32, i, ref.FromFloat32(ref.FP32, float32(c.Rank()+1)*float32(i%7-3)))
		}
		if err := dev.CopyIn(send.Ptr, in); err != nil {
			return err
		}
		work, err := c.AllReduce(ctx, nil, send.Ptr, recv.Ptr, n, ref.FP32, ref.Prod)
		if err != nil {
			return err
		}
		if work.Algorithm() != collectives.AlgoNCCL {
			return fmt.Errorf("prod ran %s, want nccl", work.Algorithm())
		}
		if err := work.Sync(ctx); err != nil {
			return err
		}
		if err := dev.DefaultStream().Synchronize(); err != nil {
			return err
		}
		out := make([]byte, 4*n)
		if err := dev.CopyOut(out, recv.Ptr); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			want := float32(1)
			for r := 0; r < c.Size(); r++ {
				want *= float32(r+1) * float32(i%7-3)
			}
			if got := ref.ToFloat32(ref.FP32, ref.Elem(out, ref.FP32, i)); got != want {
				return fmt.Errorf("prod element %d = %v, want %v", i, got, want)
			}
		}
		if lib := c.NCCLLibrary(); lib == nil {
			return errors.New("no NCCL library reported")
		}
		return nil
	})
}

// A world of one copies.
func TestWorldOfOne(t *testing.T) {
	run(t, world{device.Host, 1}, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, false)
		if err != nil {
			return err
		}
		defer b.Free()
		for _, k := range collectives.Kinds {
			got, err := b.Check(ctx, colltest.Case{Kind: k, Count: 1001, DType: ref.FP16, Op: ref.Max, Seed: 3})
			if err != nil {
				return err
			}
			if got != "copy" {
				return fmt.Errorf("%s on one rank ran %s", k, got)
			}
		}
		return nil
	})
}
