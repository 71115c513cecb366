package intranode_test

// The real kernels/intranode.cu (notify, dispatch in both copy modes,
// combine, the staging row copy) on CPU threads (internal/cpuemu), on
// goroutine ranks over host memory, compared bit for bit with the plain-Go
// reference (intranode.ReferenceDispatch / ReferenceCombine): BF16 and FP8
// with scales, weights, biases, empty ranks, hot experts, masked entries,
// and second iterations through the cached handle (dispatch without
// notify).

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"github.com/goep-dev/goep/routing"
)

func emuBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func emuUp[T any](t *testing.T, d device.Device, s []T) uintptr {
	var z T
	b, err := d.Alloc(max(256, len(s)*int(unsafe.Sizeof(z))))
	require.NoError(t, err)
	if len(s) > 0 {
		require.NoError(t, d.CopyIn(b.Ptr, emuBytes(s)))
	}
	return b.Ptr
}

func emuDown[T any](t *testing.T, d device.Device, p uintptr, n int) []T {
	out := make([]T, n)
	if n > 0 {
		require.NoError(t, d.CopyOut(emuBytes(out), p))
	}
	return out
}

func emuEq[T comparable](t *testing.T, want, got []T, what string) {
	t.Helper()
	require.Equal(t, len(want), len(got), what)
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s: first difference at %d: want %v got %v", what, i, want[i], got[i])
		}
	}
}

func emuF32bits(v []float32) []uint32 {
	o := make([]uint32, len(v))
	for i, x := range v {
		o[i] = math.Float32bits(x)
	}
	return o
}

type emuCase struct {
	ranks, hidden, topk, experts int
	tokens                       []int
	fp8, weights                 bool
	bias                         int
	cfg                          intranode.LaunchConfig
	gen                          routing.GenOptions
	iters                        int
	// separateNotify launches notify with cfg's block size and then
	// dispatch, instead of the fused notify+dispatch (whose notify has
	// 1024 threads: more than 4 ranks of it exceed the threads the
	// emulation runs at once).
	separateNotify bool
	// stridedScales uploads FP8 scales column-major with T padded to 4
	// (TMA-aligned) on even iterations and with rows padded by 3 on odd
	// ones; the kernel reads them in place at those strides.
	stridedScales bool
}

func emuRandBF16(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	sp := []uint16{0, 0x8000, 0x7f80, 0xff80, 0x7fc1, 1, 0x8003}
	for i := range x {
		v := uint16(rng.Uint32())
		x[i] = v&0x8000 | (119+(v>>8)&15)<<7 | v&0x7f
		if rng.IntN(40) == 0 {
			x[i] = sp[rng.IntN(len(sp))]
		}
	}
	return x
}

// emuStridedScales uploads row-major scales [n][s] column-major with n
// padded to a multiple of 4, or row-major with rows padded by 3, with the
// rest of the allocation poisoned, and returns the element strides.
func emuStridedScales(t *testing.T, d device.Device, sc []float32, n, s int, colMajor bool) (uintptr, [2]int64) {
	st := [2]int64{int64(s + 3), 1}
	size := n * (s + 3)
	if colMajor {
		st = [2]int64{1, int64((n + 3) / 4 * 4)}
		size = int(st[1]) * s
	}
	buf := make([]float32, size)
	for i := range buf {
		buf[i] = float32(math.NaN())
	}
	for tok := 0; tok < n; tok++ {
		for c := 0; c < s; c++ {
			buf[int64(tok)*st[0]+int64(c)*st[1]] = sc[tok*s+c]
		}
	}
	return emuUp(t, d, buf), st
}

func emuRunCase(t *testing.T, c emuCase) {
	mt := 1
	for _, n := range c.tokens {
		mt = max(mt, n)
	}
	l, err := intranode.NewLayout(intranode.Config{Ranks: c.ranks, MaxTokens: mt, Hidden: c.hidden, TopK: c.topk,
		LocalExperts: c.experts / c.ranks, FP8: c.fp8})
	require.NoError(t, err)
	boots, err := bootstrap.NewInProcess(c.ranks, bootstrap.Config{})
	require.NoError(t, err)
	ranks := make([]*intranodetest.Rank, c.ranks)
	devs := make([]*cpuemu.Device, c.ranks)
	t.Cleanup(func() {
		for i := range devs {
			if devs[i] != nil {
				_ = devs[i].Close()
			}
			_ = boots[i].Close()
		}
	})
	par := func(f func(i int) error) {
		var wg sync.WaitGroup
		errs := make([]error, c.ranks)
		for i := 0; i < c.ranks; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = f(i) }()
		}
		wg.Wait()
		for i, e := range errs {
			require.NoError(t, e, "rank %d", i)
		}
	}
	par(func(i int) error {
		var err error
		dev, err := cpuemu.Open(i, cpuemu.Options{SMs: 132})
		if err != nil {
			return err
		}
		devs[i] = dev
		ranks[i], err = intranodetest.NewRank(context.Background(), dev, boots[i], l, intranodetest.RankOptions{Timeout: 60 * time.Second})
		return err
	})
	shape := intranode.Shape{Hidden: c.hidden, TopK: c.topk, Experts: c.experts, Ranks: c.ranks}
	ins := make([]intranode.RankInput, c.ranks)
	topk := make([]uintptr, c.ranks)
	handles := make([]intranode.Handle, c.ranks)
	for i, r := range ranks {
		g := c.gen
		g.Seed = uint64(i) + 17*c.gen.Seed
		rt, err := routing.Generate(routing.Shape{Tokens: c.tokens[i], K: c.topk, Experts: c.experts, Ranks: c.ranks}, g)
		require.NoError(t, err)
		ins[i].TopK = rt.Idx
		topk[i] = emuUp(t, r.Dev, rt.Idx)
		handles[i] = r.WS.DefaultHandle(c.tokens[i])
	}
	for it := 0; it < max(1, c.iters); it++ {
		dargs := make([]intranode.DispatchArgs, c.ranks)
		for i, r := range ranks {
			rng := rand.New(rand.NewPCG(uint64(it), uint64(i)))
			n := c.tokens[i]
			ins[i].X, ins[i].XFP8, ins[i].Scales, ins[i].Weights = nil, nil, nil, nil
			a := intranode.DispatchArgs{FP8: c.fp8, TopK: topk[i], Handle: handles[i]}
			if c.fp8 {
				ins[i].XFP8 = make([]uint8, n*c.hidden)
				for j := range ins[i].XFP8 {
					ins[i].XFP8[j] = uint8(rng.Uint32())
				}
				ins[i].Scales = make([]float32, n*c.hidden/128)
				for j := range ins[i].Scales {
					ins[i].Scales[j] = rng.Float32()
				}
				a.X, a.Scales = emuUp(t, r.Dev, ins[i].XFP8), emuUp(t, r.Dev, ins[i].Scales)
				if c.stridedScales {
					a.Scales, a.ScaleStrides = emuStridedScales(t, r.Dev, ins[i].Scales, n, c.hidden/128, it%2 == 0)
				}
			} else {
				ins[i].X = emuRandBF16(rng, n*c.hidden)
				a.X = emuUp(t, r.Dev, ins[i].X)
			}
			if c.weights {
				ins[i].Weights = make([]float32, n*c.topk)
				for j := range ins[i].Weights {
					ins[i].Weights[j] = float32(rng.NormFloat64())
				}
				a.Weights = emuUp(t, r.Dev, ins[i].Weights)
			}
			dargs[i] = a
			for _, reg := range l.Regions()[3:] {
				if reg.Name == "send pos" && it > 0 {
					break
				}
				require.NoError(t, r.Dev.MemsetAsync(r.WS.Base+uintptr(reg.Offset), 0xEE, reg.Size, nil))
			}
		}
		par(func(i int) error {
			cfg := c.cfg
			if it%2 == 1 {
				cfg.Copy = intranode.CopyWide
				cfg.Threads = min(cfg.Threads, intranode.DispatchWideMaxThreads)
			}
			if it == 0 && c.separateNotify {
				// Notify with the case's block size (the fused path's notify
				// takes 1024 threads), then dispatch with its entry wait.
				r := ranks[i]
				binary.LittleEndian.PutUint32(r.RecvCount.Host, math.MaxUint32)
				if err := r.WS.Notify(r.Dev, nil, intranode.NotifyArgs{TopK: topk[i], Handle: handles[i], ExpertAlignment: 4,
					RecvCount: r.RecvCount.Dev, ExpertCounts: r.ExpertCounts.Dev}, cfg); err != nil {
					return err
				}
				if err := r.WS.Dispatch(r.Dev, nil, dargs[i], cfg); err != nil {
					return err
				}
			} else if it == 0 {
				if err := ranks[i].NotifyDispatch(nil, topk[i], handles[i], 4, dargs[i], cfg); err != nil {
					return err
				}
			} else if err := ranks[i].WS.Dispatch(ranks[i].Dev, nil, dargs[i], cfg); err != nil {
				return err
			}
			return ranks[i].Check()
		})
		want, err := intranode.ReferenceDispatch(shape, ins, 4)
		require.NoError(t, err)
		for i, r := range ranks {
			d, w := r.Dev, want[i]
			n := w.Received()
			what := fmt.Sprintf("iter %d rank %d", it, i)
			if it == 0 {
				require.Equal(t, n, r.RecvCountNow(), what)
				require.Equal(t, w.TokensPerLocalExpert, r.ExpertCountsNow(), what)
			}
			emuEq(t, w.RankPrefix, emuDown[int32](t, d, handles[i].RankPrefix, c.ranks), what+" prefix")
			v := r.WS.Recv()
			if c.fp8 {
				emuEq(t, w.RecvXFP8, emuDown[uint8](t, d, v.X, n*c.hidden), what+" x8")
				emuEq(t, emuF32bits(w.RecvScales), emuF32bits(emuDown[float32](t, d, v.Scales, n*c.hidden/128)), what+" scales")
			} else {
				emuEq(t, w.RecvX, emuDown[uint16](t, d, v.X, n*c.hidden), what+" x")
			}
			emuEq(t, w.RecvSrcToken, emuDown[int32](t, d, v.SrcToken, n), what+" src")
			emuEq(t, w.RecvTopK, emuDown[int64](t, d, v.TopK, n*c.topk), what+" topk")
			if c.weights {
				emuEq(t, emuF32bits(w.RecvWeights), emuF32bits(emuDown[float32](t, d, v.Weights, n*c.topk)), what+" weights")
			}
		}
		// combine
		cins := make([]intranode.CombineInput, c.ranks)
		cargs := make([]intranode.CombineArgs, c.ranks)
		for i, r := range ranks {
			rng := rand.New(rand.NewPCG(uint64(it)+99, uint64(i)))
			n, tok := want[i].Received(), c.tokens[i]
			cins[i].Y = emuRandBF16(rng, n*c.hidden)
			// Combine inputs in the combine input region (read in place) or,
			// on odd ranks of odd iterations, outside it (staged into it).
			staged := it%2 == 1 && i%2 == 1
			a := intranode.CombineArgs{Handle: handles[i]}
			if staged {
				a.Y = emuUp(t, r.Dev, cins[i].Y)
				// With the row count the host copies; without it the
				// copy kernel does, reading the count on the device.
				if (i/2+it)%2 == 0 {
					a.Rows = n
				}
			} else {
				a.Y = r.WS.CombineInput().X
				if n > 0 {
					require.NoError(t, r.Dev.CopyIn(a.Y, emuBytes(cins[i].Y)))
				}
			}
			if c.weights {
				cins[i].Weights = make([]float32, n*c.topk)
				for j := range cins[i].Weights {
					cins[i].Weights[j] = float32(rng.NormFloat64())
				}
				if staged {
					a.Weights = emuUp(t, r.Dev, cins[i].Weights)
				} else {
					a.Weights = r.WS.CombineInput().Weights
					if n > 0 {
						require.NoError(t, r.Dev.CopyIn(a.Weights, emuBytes(cins[i].Weights)))
					}
				}
				a.OutWeights = emuUp(t, r.Dev, make([]float32, tok*c.topk))
				require.NoError(t, r.Dev.MemsetAsync(a.OutWeights, 0xEE, 4*tok*c.topk, nil))
			}
			if c.bias >= 1 {
				cins[i].Bias0 = emuRandBF16(rng, tok*c.hidden)
				a.Bias0 = emuUp(t, r.Dev, cins[i].Bias0)
			}
			if c.bias >= 2 {
				cins[i].Bias1 = emuRandBF16(rng, tok*c.hidden)
				a.Bias1 = emuUp(t, r.Dev, cins[i].Bias1)
			}
			a.Out = emuUp(t, r.Dev, make([]uint16, tok*c.hidden))
			require.NoError(t, r.Dev.MemsetAsync(a.Out, 0xEE, 2*tok*c.hidden, nil))
			cargs[i] = a
		}
		par(func(i int) error {
			if err := ranks[i].WS.Combine(ranks[i].Dev, nil, cargs[i], c.cfg); err != nil {
				return err
			}
			return ranks[i].Check()
		})
		wantC, err := intranode.ReferenceCombine(shape, c.tokens, want, cins)
		require.NoError(t, err)
		for i, r := range ranks {
			tok := c.tokens[i]
			emuEq(t, wantC[i].X, emuDown[uint16](t, r.Dev, cargs[i].Out, tok*c.hidden), fmt.Sprintf("iter %d rank %d combine", it, i))
			if c.weights {
				emuEq(t, emuF32bits(wantC[i].Weights), emuF32bits(emuDown[float32](t, r.Dev, cargs[i].OutWeights, tok*c.topk)),
					fmt.Sprintf("iter %d rank %d combine weights", it, i))
			}
		}
	}
	par(func(i int) error { return ranks[i].Close(context.Background()) })
}

func TestEmulatedKernels(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, c := range []emuCase{
		{ranks: 2, hidden: 128, topk: 2, experts: 4, tokens: []int{5, 7}, weights: true, bias: 2, iters: 2,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 64}},
		{ranks: 4, hidden: 384, topk: 4, experts: 16, tokens: []int{33, 0, 17, 40}, fp8: true, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 3, Threads: 64}, gen: routing.GenOptions{Masked: 9}, iters: 2},
		{ranks: 8, hidden: 64, topk: 8, experts: 64, tokens: []int{24, 3, 17, 0, 31, 8, 1, 20}, weights: true, bias: 1,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 32}, gen: routing.GenOptions{Masked: 30}, iters: 2, separateNotify: true},
		{ranks: 8, hidden: 256, topk: 4, experts: 32, tokens: []int{6, 6, 0, 9, 6, 1, 6, 12}, fp8: true, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 64}, gen: routing.GenOptions{EmptyRanks: []int{3}}, separateNotify: true},
		{ranks: 3, hidden: 136, topk: 9, experts: 27, tokens: []int{70, 1, 45}, weights: true, bias: 2,
			cfg: intranode.LaunchConfig{NumSMs: 1, Threads: 96}, separateNotify: true},
		{ranks: 4, hidden: 128, topk: 1, experts: 8, tokens: []int{16, 16, 16, 16},
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 64}, gen: routing.GenOptions{Always: []int{5}}, separateNotify: true},
		{ranks: 1, hidden: 256, topk: 3, experts: 8, tokens: []int{9}, weights: true, bias: 1,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 64}},
		{ranks: 2, hidden: 128, topk: 2, experts: 4, tokens: []int{0, 0}, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 32}},
		// Few tokens, wide rows: rows cut into slices over the warps.
		{ranks: 4, hidden: 2048, topk: 3, experts: 16, tokens: []int{3, 1, 2, 0}, weights: true, bias: 2,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 128}, iters: 2, separateNotify: true},
		{ranks: 3, hidden: 1152, topk: 4, experts: 12, tokens: []int{5, 7, 2}, fp8: true, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 3, Threads: 64}, iters: 2, stridedScales: true},
		{ranks: 8, hidden: 256, topk: 8, experts: 256, tokens: []int{100, 90, 80, 120, 64, 0, 1, 99}, weights: true, bias: 2,
			cfg: intranode.LaunchConfig{NumSMs: 3, Threads: 256}, gen: routing.GenOptions{Masked: 50}, iters: 3,
			separateNotify: true},
		{ranks: 8, hidden: 1024, topk: 8, experts: 64, tokens: []int{40, 40, 40, 40, 40, 40, 40, 40}, fp8: true, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 4, Threads: 128}, gen: routing.GenOptions{EmptyRanks: []int{3}},
			separateNotify: true},
		{ranks: 7, hidden: 128, topk: 5, experts: 35, tokens: []int{9, 0, 30, 4, 11, 2, 17}, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 2, Threads: 64}, iters: 2, separateNotify: true},
	} {
		t.Run(fmt.Sprintf("R%d-H%d-K%d-T%v-fp8=%v-strided=%v", c.ranks, c.hidden, c.topk, c.tokens, c.fp8, c.stridedScales), func(t *testing.T) {
			emuRunCase(t, c)
		})
	}
}

// Every intranode kernel ran above (the TMA dispatch is another module,
// Hopper-only, not emulated).
func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"intranode.cu"}, nil)
}
