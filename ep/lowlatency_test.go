package ep_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/lowlatency"
)

func llBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

type llRank struct {
	dev device.Device
	buf *ep.LowLatencyBuffer
}

func newLLGroup(t *testing.T, kind device.Kind, n int, cfg ep.LowLatencyConfig) []*llRank {
	gpus := 1
	if kind == device.CUDA {
		var err error
		if gpus, err = device.CUDADeviceCount(); err != nil || gpus == 0 {
			t.Skipf("no CUDA GPU (%v)", err)
		}
	}
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	require.NoError(t, err)
	rs := make([]*llRank, n)
	llEach(t, rs, func(i int, _ *llRank) error {
		d, err := device.Open(kind, i%gpus)
		if kind == device.Host {
			d, err = device.OpenHost(i), nil
		}
		if err != nil {
			return err
		}
		b, err := ep.NewLowLatencyBuffer(context.Background(), boots[i], d, cfg)
		rs[i] = &llRank{dev: d, buf: b}
		return err
	})
	t.Cleanup(func() {
		llEach(t, rs, func(i int, r *llRank) error { return r.buf.Close(context.Background()) })
		for i, r := range rs {
			_ = r.dev.Close()
			_ = boots[i].Close()
		}
	})
	return rs
}

func llEach(t *testing.T, rs []*llRank, f func(i int, r *llRank) error) {
	t.Helper()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, rs[i]) }()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

func llUp[T any](t *testing.T, d device.Device, s []T) uintptr {
	b, err := d.Alloc(max(256, len(llBytes(s))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Free(b) })
	if len(s) > 0 {
		require.NoError(t, d.CopyIn(b.Ptr, llBytes(s)))
	}
	return b.Ptr
}

func llDown[T any](t *testing.T, d device.Device, p uintptr, n int) []T {
	out := make([]T, n)
	if n > 0 {
		require.NoError(t, d.CopyOut(llBytes(out), p))
	}
	return out
}

// Two micro-batches through the ep API: split dispatch (both sends, then
// both receives), experts writing into the zero-copy combine buffer, split
// combine; results against the lowlatency reference; sets alternate over
// several rounds; then a masked rank.
func TestLowLatencyRoundTripHost(t *testing.T) { llRoundTrip(t, device.Host, 4, 0) }

// 8 ranks sharing the GPUs present.
func TestLowLatencyRoundTripGPU(t *testing.T) { llRoundTrip(t, device.CUDA, 8, 0) }

// The same across 2 virtual nodes (the masked rank 1 is on the other node
// for ranks 2 and 3): the Buffer picks port channels for the other node,
// nothing else changes.
func TestLowLatencyNodesHost(t *testing.T) { llRoundTrip(t, device.Host, 4, 2) }

// 8 ranks in 2 virtual nodes sharing the GPUs present.
func TestLowLatencyNodesGPU(t *testing.T) { llRoundTrip(t, device.CUDA, 8, 2) }

func llRoundTrip(t *testing.T, kind device.Kind, ranks, nodes int) {
	const maxT, hidden, topk, experts = 6, 256, 3, 16
	cfg := ep.LowLatencyConfig{MaxTokens: maxT, Hidden: hidden, TopK: topk, Experts: experts, FP8: true, NumSMs: 2, Threads: 64,
		Timeout: 20 * time.Second, VirtualNodes: nodes}
	rs := newLLGroup(t, kind, ranks, cfg)
	lc := lowlatency.Config{Ranks: ranks, MaxTokens: maxT, Hidden: hidden, TopK: topk, LocalExperts: experts / ranks, FP8: true}
	le, slots := experts/ranks, ranks*maxT
	for round := 0; round < 3; round++ {
		masked := uint32(0)
		if round == 2 {
			masked = 1 << 1
			llEach(t, rs, func(i int, r *llRank) error { return r.buf.UpdateMask(nil, 1) })
		}
		format := []ep.LLFormat{ep.LLBF16, ep.LLFP8, ep.LLUE8M0}[round]
		ins := [2][]lowlatency.RankInput{}
		res := [2][]*ep.LLDispatchResult{}
		outs := [2][]uintptr{}
		for b := 0; b < 2; b++ {
			ins[b] = make([]lowlatency.RankInput, ranks)
			res[b] = make([]*ep.LLDispatchResult, ranks)
			outs[b] = make([]uintptr, ranks)
			for i := range rs {
				rng := rand.New(rand.NewPCG(uint64(round*2+b), uint64(i)))
				n := rng.IntN(maxT + 1)
				in := lowlatency.RankInput{X: make([]uint16, n*hidden), TopK: make([]int64, n*topk), Weights: make([]float32, n*topk)}
				for j := range in.X {
					in.X[j] = kernels.Float32ToBF16(float32(rng.NormFloat64()))
				}
				for j := range in.TopK {
					in.TopK[j] = int64(rng.IntN(experts+1)) - 1
					if rng.IntN(12) == 0 {
						in.TopK[j] = []int64{experts, -5, 1 << 40}[rng.IntN(3)] // out of range: ignored and counted
					}
					in.Weights[j] = rng.Float32()
				}
				ins[b][i] = in
			}
		}
		llEach(t, rs, func(i int, r *llRank) error {
			for b := 0; b < 2; b++ {
				in := ins[b][i]
				n := len(in.TopK) / topk
				d, err := r.buf.Dispatch(ep.LLDispatchArgs{X: ep.NewTensor(llUp(t, r.dev, in.X), ep.BF16, n, hidden),
					TopKIdx: ep.NewTensor(llUp(t, r.dev, in.TopK), ep.I64, n, topk), TopKWeights: ep.NewTensor(llUp(t, r.dev, in.Weights), ep.F32, n, topk),
					Format: format, ReturnRecv: true})
				if err != nil {
					return err
				}
				res[b][i] = d
			}
			for b := 0; b < 2; b++ {
				if _, err := r.buf.Recv(res[b][i].Handle, nil, nil, nil); err != nil {
					return err
				}
			}
			if err := r.buf.Stream().Synchronize(); err != nil {
				return err
			}
			// Out-of-range ids: counted per set, on the device (Invalid)
			// and through InvalidIDs, as the reference counts them.
			for b := 0; b < 2; b++ {
				want := lowlatency.ReferenceInvalidIDs(lc, ins[b])[i]
				if got := llDown[int32](t, r.dev, res[b][i].Invalid.Ptr, 1)[0]; int(got) != want {
					return fmt.Errorf("round %d mb %d rank %d: invalid ids on the device %d, want %d", round, b, i, got, want)
				}
				err := r.buf.InvalidIDs(res[b][i].Handle)
				var inv *ep.InvalidIDsError
				switch {
				case want == 0 && err != nil:
					return err
				case want > 0 && (!errors.As(err, &inv) || inv.Count != want || inv.Rank != i):
					return fmt.Errorf("round %d mb %d rank %d: InvalidIDs %v, want a count of %d", round, b, i, err, want)
				}
			}
			return nil
		})
		for b := 0; b < 2; b++ {
			want, err := lowlatency.ReferenceDispatch(lc, ins[b], lowlatency.Options{Format: lowlatency.Format(format), Masked: masked})
			require.NoError(t, err)
			cins := make([]lowlatency.CombineInput, ranks)
			for d, r := range rs {
				h := res[b][d].Handle
				counts, err := r.buf.HostCounts(h)
				require.NoError(t, err)
				wc := want[d].Count()
				for l := range counts {
					require.Equal(t, int(wc[l]), counts[l], "round %d mb %d rank %d expert %d", round, b, d, l)
				}
				// The received rows (first row of each expert) and the
				// experts' outputs y = 2x (BF16) written into the zero-copy buffer.
				y, err := r.buf.NextCombineBuffer(h)
				require.NoError(t, err)
				yb := make([]uint16, le*slots*hidden)
				cins[d].Y = make([][][]uint16, le)
				for l, rows := range want[d].Experts {
					for p, row := range rows {
						yr := make([]uint16, hidden)
						for x := range yr {
							yr[x] = kernels.Float32ToBF16(float32(p+1) * float32(x%7))
						}
						cins[d].Y[l] = append(cins[d].Y[l], yr)
						copy(yb[(l*slots+p)*hidden:], yr)
						if p == 0 && format == ep.LLBF16 {
							got := llDown[uint16](t, r.dev, res[b][d].RecvX.Ptr+uintptr(2*(l*slots)*hidden), hidden)
							require.Equal(t, row.X, got)
						}
					}
				}
				require.NoError(t, r.dev.CopyIn(y.Ptr, llBytes(yb)))
			}
			wantOut, err := lowlatency.ReferenceCombine(lc, ins[b], want, cins, false, lowlatency.Options{Masked: masked})
			require.NoError(t, err)
			llEach(t, rs, func(i int, r *llRank) error {
				h := res[b][i].Handle
				out := ep.NewTensor(llUp(t, r.dev, make([]uint16, h.Tokens()*hidden)), ep.BF16, h.Tokens(), hidden)
				outs[b][i] = out.Ptr
				y, err := r.buf.NextCombineBuffer(h)
				if err != nil {
					return err
				}
				if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: h, Y: y, Out: out, ReturnRecv: true}); err != nil {
					return err
				}
				if _, err := r.buf.CombineRecv(h, out, nil, nil, nil); err != nil {
					return err
				}
				return r.buf.Stream().Synchronize()
			})
			for i, r := range rs {
				require.Equal(t, wantOut[i], llDown[uint16](t, r.dev, outs[b][i], len(wantOut[i])), "round %d mb %d rank %d", round, b, i)
			}
		}
		if masked != 0 {
			llEach(t, rs, func(i int, r *llRank) error {
				m, err := r.buf.MaskedRanks()
				if err != nil {
					return err
				}
				if len(m) != 1 || m[0] != 1 {
					return errors.New("mask not reported")
				}
				return r.buf.ClearMask(nil)
			})
		}
	}
}

// Bad input: clear errors before any launch.
func TestLowLatencyBadInput(t *testing.T) {
	cfg := ep.LowLatencyConfig{MaxTokens: 4, Hidden: 64, TopK: 2, Experts: 4, NumSMs: 1, Threads: 64, Timeout: 5 * time.Second}
	rs := newLLGroup(t, device.Host, 2, cfg)
	llEach(t, rs, func(i int, r *llRank) error {
		x := ep.NewTensor(llUp(t, r.dev, make([]uint16, 5*64)), ep.BF16, 5, 64)
		ids := ep.NewTensor(llUp(t, r.dev, make([]int64, 5*2)), ep.I64, 5, 2)
		_, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids})
		if !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("tokens above the maximum accepted")
		}
		if err := r.buf.UpdateMask(nil, 2); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("mask outside the world accepted")
		}
		x, ids = x.Slice(0, 4), ids.Slice(0, 4)
		// Out-of-range ids are ignored by the kernels and reported.
		require.NoError(t, r.dev.CopyIn(ids.Ptr, llBytes([]int64{0, 99, -1, -7, 3, 1, 2, 2})))
		dx, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids})
		if err != nil {
			return err
		}
		if err := r.buf.Stream().Synchronize(); err != nil {
			return err
		}
		var inv *ep.InvalidIDsError
		if err := r.buf.InvalidIDs(dx.Handle); !errors.As(err, &inv) || inv.Count != 2 {
			return fmt.Errorf("invalid ids: %v", err)
		}
		yx, _ := r.buf.NextCombineBuffer(dx.Handle)
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: dx.Handle, Y: yx, Out: ep.NewTensor(llUp(t, r.dev, make([]uint16, 4*64)), ep.BF16, 4, 64)}); err != nil {
			return err
		}
		if _, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids, Format: ep.LLFP8}); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("FP8 without FP8 regions accepted")
		}
		d0, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids, ReturnRecv: true})
		if err != nil {
			return err
		}
		// d1 takes the other set; d0's is in flight: the next dispatch is refused.
		d1, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids})
		if err != nil {
			return err
		}
		if _, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids}); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("a set reused while in flight accepted")
		}
		out := ep.NewTensor(llUp(t, r.dev, make([]uint16, 4*64)), ep.BF16, 4, 64)
		y0, _ := r.buf.NextCombineBuffer(d0.Handle)
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d0.Handle, Y: y0, Out: out}); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("combine before the receive accepted")
		}
		if _, err := r.buf.Recv(d0.Handle, nil, nil, nil); err != nil {
			return err
		}
		bad := ep.NewTensor(y0.Ptr, ep.BF16, 1, 8, 64)
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d0.Handle, Y: bad, Out: out}); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("combine with another layout accepted")
		}
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d1.Handle, Y: y0, Out: out.Slice(0, 3)}); !errors.Is(err, ep.ErrInvalidArgument) {
			return errors.New("combine output of another shape accepted")
		}
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d0.Handle, Y: y0, Out: out}); err != nil {
			return err
		}
		y1, _ := r.buf.NextCombineBuffer(d1.Handle)
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d1.Handle, Y: y1, Out: out}); err != nil {
			return err
		}
		// The next dispatch reuses d0's set and expires d0.
		if _, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids}); err != nil {
			return err
		}
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: d0.Handle, Y: y0, Out: out}); !errors.Is(err, ep.ErrExpiredHandle) {
			return errors.New("an expired handle accepted")
		}
		return r.buf.Stream().Synchronize()
	})
	// A nil buffer and a closed one answer with errors, never a panic.
	var nilBuf *ep.LowLatencyBuffer
	_, err := nilBuf.Dispatch(ep.LLDispatchArgs{})
	require.Error(t, err)
	require.Error(t, nilBuf.Check())
	require.Zero(t, nilBuf.Slots())
	require.NoError(t, nilBuf.Close(context.Background()))
	cfg.Nodes = 3
	_, err = ep.LowLatencySizeHint(cfg, 2)
	require.ErrorContains(t, err, "do not split into 3 nodes")
}

// More bad input, each refused before any launch and leaving the buffer
// usable: ids of another shape, masks naming ranks outside the world, a
// combine whose layout (expert-major vs rank-major, FP8 where BF16 only)
// or handle (foreign, nil, already combined, no receive pending) does not
// match its dispatch, and a set reused while its combine is in flight.
func TestLowLatencyMismatchRefused(t *testing.T) {
	const ranks, maxT, hidden, topk, experts = 2, 4, 128, 2, 4
	cfg := ep.LowLatencyConfig{MaxTokens: maxT, Hidden: hidden, TopK: topk, Experts: experts, FP8: true, NumSMs: 1, Threads: 64,
		Timeout: 5 * time.Second}
	rs := newLLGroup(t, device.Host, ranks, cfg)
	le, slots := experts/ranks, ranks*maxT
	handles := make([]*ep.LLHandle, ranks)
	refused := func(what string, err error) error {
		if !errors.Is(err, ep.ErrInvalidArgument) {
			return fmt.Errorf("%s: accepted or another error: %v", what, err)
		}
		return nil
	}
	llEach(t, rs, func(i int, r *llRank) error {
		x := ep.NewTensor(llUp(t, r.dev, make([]uint16, maxT*hidden)), ep.BF16, maxT, hidden)
		ids := ep.NewTensor(llUp(t, r.dev, []int64{0, 1, 2, 3, 1, -1, 3, 0}), ep.I64, maxT, topk)
		out := ep.NewTensor(llUp(t, r.dev, make([]uint16, maxT*hidden)), ep.BF16, maxT, hidden)
		emY := ep.NewTensor(llUp(t, r.dev, make([]uint16, le*slots*hidden)), ep.BF16, le, slots, hidden)
		rmY := ep.NewTensor(llUp(t, r.dev, make([]uint16, ranks*maxT*hidden)), ep.BF16, ranks, maxT, hidden)
		fp8Y := ep.NewTensor(emY.Ptr, ep.FP8E4M3, le, slots, hidden)
		var errs []error
		check := func(what string, err error) { errs = append(errs, refused(what, err)) }
		_, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids.Slice(0, 3)})
		check("ids of another row count", err)
		check("unmask rank -1", r.buf.Unmask(nil, -1))
		check("mask rank 5 of 2", r.buf.UpdateMask(nil, 0, 5))
		// Rank-major dispatch on set 0.
		rm, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids, RankMajor: true})
		if err != nil {
			return err
		}
		handles[i] = rm.Handle
		_, err = r.buf.Recv(rm.Handle, nil, nil, nil)
		check("recv of a fused dispatch", err)
		_, err = r.buf.HostCounts(rm.Handle)
		check("expert-major counts of a rank-major dispatch", err)
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: rm.Handle, Y: emY, Out: out})
		check("expert-major y for a rank-major dispatch", err)
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: rm.Handle, Y: ep.NewTensor(rmY.Ptr, ep.FP8E4M3, ranks, maxT, hidden), Out: out})
		check("FP8 y for a rank-major dispatch", err)
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: nil, Y: rmY, Out: out})
		check("nil handle", err)
		// Split combine of set 0: its receive is pending.
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: rm.Handle, Y: rmY, Out: out, ReturnRecv: true}); err != nil {
			return err
		}
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: rm.Handle, Y: rmY, Out: out})
		check("a second combine of one dispatch", err)
		em, err := r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids}) // set 1
		if err != nil {
			return err
		}
		_, err = r.buf.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids})
		check("set 0 reused while its combine is in flight", err)
		_, err = r.buf.CombineRecv(em.Handle, out, nil, nil, nil)
		check("combine receive without a combine", err)
		_, err = r.buf.CombineRecv(rm.Handle, out.Slice(0, 3), nil, nil, nil)
		check("combine receive into another shape", err)
		if _, err := r.buf.CombineRecv(rm.Handle, out, nil, nil, nil); err != nil {
			return err
		}
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: em.Handle, Y: rmY, Out: out})
		check("rank-major y for an expert-major dispatch", err)
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: em.Handle, Y: fp8Y, Out: out})
		check("FP8 y without scales", err)
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: em.Handle, Y: emY, Out: ep.NewTensor(out.Ptr, ep.F32, maxT, hidden/2)})
		check("out of another dtype", err)
		if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: em.Handle, Y: emY, Out: out}); err != nil {
			return err
		}
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: em.Handle, Y: emY, Out: out})
		check("a combined dispatch combined again", err)
		if err := r.buf.Stream().Synchronize(); err != nil {
			return err
		}
		// Nothing refused reached the mask.
		if m, err := r.buf.MaskedRanks(); err != nil || len(m) != 0 {
			return fmt.Errorf("mask after refused updates: %v %v", m, err)
		}
		return errors.Join(errs...)
	})
	// Another rank's handle.
	r := rs[0]
	out := ep.NewTensor(llUp(t, r.dev, make([]uint16, maxT*hidden)), ep.BF16, maxT, hidden)
	_, err := r.buf.Combine(ep.LLCombineArgs{Handle: handles[1], Out: out})
	require.ErrorIs(t, err, ep.ErrForeignHandle)
	require.ErrorIs(t, r.buf.InvalidIDs(handles[1]), ep.ErrForeignHandle)
	_, err = r.buf.NextCombineBuffer(handles[1])
	require.ErrorIs(t, err, ep.ErrForeignHandle)
	require.NoError(t, r.buf.Check())
}
