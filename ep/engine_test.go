package ep_test

// Tests of issue 22 (what an engine can hold safely) and of the hardening
// classes 1, 2 and 7 of issue 18: per-call Done events, handle lifetimes,
// strided FP8 scales, ctx on every call, poisoned expired views, nil
// receivers and use after Close, overflow, timeouts.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// engineSpec is a small shape on the host backend and a DeepEP-like one on
// GPUs.
func engineSpec(kind ep.Kind, name string) spec {
	s := spec{name: name, ranks: 2, tokens: []int{12, 9}, hidden: 256, topk: 4, experts: 8, weights: true,
		gen: routing.GenOptions{Masked: 3}}
	if kind == ep.CUDA {
		s.tokens, s.hidden, s.experts = []int{1024, 700}, 7168, 64
	}
	return s
}

// setup allocates each rank's inputs of s.
func setup(t *testing.T, r *rig, s spec) []*rankIO {
	io := make([]*rankIO, s.ranks)
	for i := range io {
		d, n := r.devs[i], s.tokens[i]
		io[i] = &rankIO{ids: alloc(t, d, 8*n*s.topk), x: alloc(t, d, 2*n*s.hidden), weights: alloc(t, d, 4*n*s.topk)}
		if s.fp8 {
			io[i].scales = alloc(t, d, 4*n*s.hidden/128)
		}
	}
	return io
}

// newRound draws round it's routing and rows into io and returns the
// inputs the reference sees.
func newRound(t *testing.T, r *rig, s spec, io []*rankIO, it int) []intranode.RankInput {
	ins := make([]intranode.RankInput, s.ranks)
	for i := range io {
		gen := s.gen
		gen.Seed = uint64(1000*it + i + 1)
		rt, err := routing.Generate(routing.Shape{Tokens: s.tokens[i], K: s.topk, Experts: s.experts, Ranks: s.ranks}, gen)
		require.NoError(t, err)
		io[i].in = s.newInputs(t, r, i, uint64(it), rt.Idx)
		io[i].load(t, r.devs[i], s)
		ins[i] = io[i].in
	}
	return ins
}

// 1. Each call's Done event stays bound to that call: two results' events
// are distinct and are waited on out of order; an unreleased event is
// recycled only when the pool's ring wraps, and that is detected.
func TestDoneEventPerCall(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(variant(kind, "results"), func(t *testing.T) {
			s := engineSpec(kind, "events")
			cfg := s.config()
			cfg.Events = 4
			r := newRig(t, kind, s.ranks, cfg)
			io := setup(t, r, s)
			ctx := context.Background()
			var res [2][]ep.DispatchResult
			var want [2][]intranode.RankOutput
			outs := make([][2]*ep.DispatchOutputs, s.ranks)
			for round := 0; round < 2; round++ {
				ins := newRound(t, r, s, io, round)
				var err error
				want[round], err = intranode.ReferenceDispatch(s.shape(), ins, 0)
				require.NoError(t, err)
				res[round] = make([]ep.DispatchResult, s.ranks)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					a := io[i].args(s, i)
					outs[i][round] = s.outs(t, r.devs[i], b.MaxRecv())
					a.Stream, a.Out = r.streams[i], outs[i][round]
					var err error
					res[round][i], err = b.Dispatch(ctx, a)
					return err
				}))
			}
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				e0, e1 := res[0][i].Done, res[1][i].Done
				if e0 == nil || e1 == nil || e0 == e1 {
					return fmt.Errorf("two dispatches share a Done event (%p, %p)", e0, e1)
				}
				if kind == ep.CUDA && e0.Handle() == e1.Handle() {
					return errors.New("two live Done events share a CUevent")
				}
				// Out of order, on another stream: the later call first.
				st, err := r.devs[i].NewStream()
				if err != nil {
					return err
				}
				defer st.Close()
				if err := e1.Wait(st); err != nil {
					return err
				}
				if err := e0.Wait(st); err != nil {
					return err
				}
				if err := e0.SynchronizeContext(ctx); err != nil {
					return err
				}
				if err := e1.Synchronize(); err != nil {
					return err
				}
				return st.Synchronize()
			}))
			for round := 0; round < 2; round++ {
				for i := range r.bufs {
					checkCopies(t, s, r, i, outs[i][round], want[round][i], fmt.Sprintf("round %d", round))
				}
			}
			// The pool holds 4 events, 2 held so far: two more results held
			// (C, D) fill it, two more calls (E, F) wrap the ring and recycle
			// the two oldest (A, B), and that is detected.
			var more [2][]ep.DispatchResult
			for k := 0; k < 4; k++ {
				got := make([]ep.DispatchResult, s.ranks)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					a := io[i].args(s, i)
					a.Handle, a.TopK, a.Stream = res[1][i].Handle, ep.Tensor{}, r.streams[i]
					var err error
					got[i], err = b.Dispatch(ctx, a)
					return err
				}))
				if k < 2 {
					more[k] = got
				}
			}
			for i, b := range r.bufs {
				held, size, wraps := b.Events()
				require.Equal(t, 4, size)
				require.Equal(t, 4, held)
				require.Equal(t, uint64(2), wraps, "rank %d: 6 events held from a pool of 4", i)
				for _, e := range []*ep.Event{res[0][i].Done, res[1][i].Done} {
					require.ErrorIs(t, e.Wait(r.streams[i]), ep.ErrEventRecycled)
					require.ErrorIs(t, e.Synchronize(), ep.ErrEventRecycled)
					require.ErrorIs(t, e.Record(r.streams[i]), ep.ErrEventRecycled)
					require.Zero(t, e.Handle())
					e.Release() // nothing: it is recycled
				}
				for _, e := range []*ep.Event{more[0][i].Done, more[1][i].Done} {
					require.NoError(t, e.Wait(r.streams[i]), "rank %d: a held event within the pool's size", i)
					require.NoError(t, e.Synchronize())
				}
			}
			// A released event fails, and the pool takes it back.
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				more[0][i].Done.Release()
				if err := more[0][i].Done.Wait(r.streams[i]); !errors.Is(err, ep.ErrEventReleased) {
					return fmt.Errorf("a released event: want ErrEventReleased, got %v", err)
				}
				if held, _, wraps := b.Events(); held != 3 || wraps != 2 {
					return fmt.Errorf("%d events held, %d wraps after a release, want 3 and 2", held, wraps)
				}
				a := io[i].args(s, i)
				a.Handle, a.TopK, a.Stream = res[1][i].Handle, ep.Tensor{}, r.streams[i]
				if _, err := b.Dispatch(ctx, a); err != nil {
					return err
				}
				if held, _, wraps := b.Events(); held != 4 || wraps != 2 {
					return fmt.Errorf("%d events held, %d wraps: the released event should have been reused", held, wraps)
				}
				return r.streams[i].Synchronize()
			}))
		})
	}
}

// checkCopies compares a dispatch's caller copies with the reference.
func checkCopies(t *testing.T, s spec, r *rig, rank int, o *ep.DispatchOutputs, want intranode.RankOutput, what string) {
	t.Helper()
	d, n := r.devs[rank], want.Received()
	if s.fp8 {
		sameSlice(t, want.RecvXFP8, fromDev[uint8](t, d, o.X.Ptr, n*s.hidden), "%s: rank %d x", what, rank)
		sameFloats(t, want.RecvScales, fromDev[float32](t, d, o.Scales.Ptr, n*s.hidden/128), "%s: rank %d scales", what, rank)
	} else {
		sameSlice(t, want.RecvX, fromDev[uint16](t, d, o.X.Ptr, n*s.hidden), "%s: rank %d x", what, rank)
	}
	sameSlice(t, want.RecvTopK, fromDev[int64](t, d, o.TopK.Ptr, n*s.topk), "%s: rank %d top-k", what, rank)
	sameSlice(t, want.RecvSrcToken, fromDev[int32](t, d, o.SrcToken.Ptr, n), "%s: rank %d source tokens", what, rank)
	if s.weights {
		sameFloats(t, want.RecvWeights, fromDev[float32](t, d, o.Weights.Ptr, n*s.topk), "%s: rank %d weights", what, rank)
	}
}

// 2. A pipeline of 16 dispatches (handles kept, a new routing each)
// combined in reverse order, every combine exact; a 17th dispatch is
// refused at dispatch time; released handles free their slots.
func TestHandlePipeline(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(variant(kind, "reverse-combines"), func(t *testing.T) {
			s := engineSpec(kind, "pipeline")
			if kind == ep.CUDA {
				s.tokens, s.hidden = []int{256, 200}, 2048
			}
			cfg := s.config()
			cfg.Handles = 16
			r := newRig(t, kind, s.ranks, cfg)
			io := setup(t, r, s)
			ctx := context.Background()
			const depth = 16
			results := make([][]ep.DispatchResult, depth)
			wants := make([][]intranode.RankOutput, depth)
			for it := 0; it < depth; it++ {
				ins := newRound(t, r, s, io, it)
				var err error
				wants[it], err = intranode.ReferenceDispatch(s.shape(), ins, 0)
				require.NoError(t, err)
				results[it] = make([]ep.DispatchResult, s.ranks)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					a := io[i].args(s, i)
					a.Stream = r.streams[i]
					res, err := b.Dispatch(ctx, a)
					results[it][i] = res
					if err != nil {
						return err
					}
					res.Done.Release()
					return r.streams[i].Synchronize()
				}))
				for i := range results[it] {
					checkDispatch(t, s, r, i, results[it][i], wants[it][i], nil, true, fmt.Sprintf("dispatch %d", it))
				}
			}
			for i, b := range r.bufs {
				live, slots, bytes := b.Handles()
				require.Equal(t, depth, live, "rank %d", i)
				require.Equal(t, depth, slots)
				require.Equal(t, int64(depth*b.SizeHint().HandleSlot), bytes)
			}
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				_, err := b.Dispatch(ctx, io[i].args(s, i))
				if !errors.Is(err, ep.ErrNoHandleSlot) {
					return fmt.Errorf("a 17th live handle: want ErrNoHandleSlot at dispatch, got %v", err)
				}
				return b.Check()
			}))
			for it := depth - 1; it >= 0; it-- {
				runCombine(t, r, s, results[it], wants[it], uint64(100+it))
				for _, res := range results[it] {
					res.Handle.Release()
				}
			}
			for i, b := range r.bufs {
				live, _, bytes := b.Handles()
				require.Zero(t, live, "rank %d", i)
				require.Zero(t, bytes)
			}
			// The slots are free again.
			ins := newRound(t, r, s, io, depth)
			want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
			require.NoError(t, err)
			res := make([]ep.DispatchResult, s.ranks)
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				a := io[i].args(s, i)
				a.Stream = r.streams[i]
				var err error
				res[i], err = b.Dispatch(ctx, a)
				if err == nil {
					err = r.streams[i].Synchronize()
				}
				return err
			}))
			for i := range res {
				checkDispatch(t, s, r, i, res[i], want[i], nil, true, "after releasing the pipeline")
			}
		})
	}
}

// 3. FP8 scales in column-major, column-major with T padded for TMA, and
// padded-row layouts are read in place, byte-exact against the reference;
// bad strides are refused before launch.
func TestStridedScales(t *testing.T) {
	layouts := []struct {
		name    string
		strides func(t, s int) []int
	}{
		{"row-major", func(t, s int) []int { return []int{s, 1} }},
		{"padded-rows", func(t, s int) []int { return []int{s + 5, 1} }},
		{"column-major", func(t, s int) []int { return []int{1, max(t, 1)} }},
		{"column-major-tma", func(t, s int) []int { return []int{1, (t + 3) / 4 * 4} }},
	}
	for _, kind := range kinds(t) {
		for _, copyMode := range []ep.CopyMode{ep.CopyPlain, ep.CopyWide, ep.CopyTMA} {
			if kind == ep.Host && copyMode != ep.CopyPlain {
				continue
			}
			t.Run(fmt.Sprintf("%s/%v", variant(kind, "exact"), copyMode), func(t *testing.T) {
				s := engineSpec(kind, "strided-scales")
				s.fp8, s.tokens, s.launch = true, []int{13, 6}, &ep.LaunchConfig{Copy: copyMode}
				if kind == ep.CUDA {
					s.tokens = []int{1001, 512}
				}
				r := newRig(t, kind, s.ranks, s.config())
				io := setup(t, r, s)
				ctx := context.Background()
				sc := s.hidden / 128
				for li, l := range layouts {
					ins := newRound(t, r, s, io, li)
					want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
					require.NoError(t, err)
					args := make([]ep.DispatchArgs, s.ranks)
					for i := range io {
						n := s.tokens[i]
						st := l.strides(n, sc)
						span := (n-1)*st[0] + (sc-1)*st[1] + 1
						host := make([]float32, span)
						for j := range host {
							host[j] = float32(math.NaN()) // gaps are never read
						}
						for tok := 0; tok < n; tok++ {
							for c := 0; c < sc; c++ {
								host[tok*st[0]+c*st[1]] = ins[i].Scales[tok*sc+c]
							}
						}
						a := io[i].args(s, i)
						a.Scales = ep.NewTensor(toDev(t, r.devs[i], host), ep.F32, n, sc).WithStrides(st...)
						a.Stream = r.streams[i]
						args[i] = a
					}
					res := make([]ep.DispatchResult, s.ranks)
					require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
						var err error
						res[i], err = b.Dispatch(ctx, args[i])
						if err == nil {
							err = r.streams[i].Synchronize()
						}
						return err
					}))
					for i := range res {
						checkDispatch(t, s, r, i, res[i], want[i], nil, true, l.name)
						// A cached dispatch reads the strided scales too.
					}
					require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
						a := args[i]
						a.Handle, a.TopK = res[i].Handle, ep.Tensor{}
						c, err := b.Dispatch(ctx, a)
						if err == nil {
							err = r.streams[i].Synchronize()
						}
						res[i] = c
						return err
					}))
					for i := range res {
						checkDispatch(t, s, r, i, res[i], want[i], nil, false, l.name+" cached")
						res[i].Handle.Release()
					}
				}
				// Refused before launch: strides on a row-major-only argument,
				// zero or negative strides, the wrong count.
				b, d := r.bufs[0], r.devs[0]
				a := io[0].args(s, 0)
				n := s.tokens[0]
				for _, bad := range []struct {
					a    func(ep.DispatchArgs) ep.DispatchArgs
					want string
				}{
					{func(a ep.DispatchArgs) ep.DispatchArgs { a.Scales = a.Scales.WithStrides(0, 1); return a }, "positive strides"},
					{func(a ep.DispatchArgs) ep.DispatchArgs { a.Scales = a.Scales.WithStrides(-1, 1); return a }, "positive strides"},
					{func(a ep.DispatchArgs) ep.DispatchArgs { a.Scales = a.Scales.WithStrides(1); return a }, "1 strides"},
					{func(a ep.DispatchArgs) ep.DispatchArgs { a.X = a.X.WithStrides(1, n); return a }, "must be row-major"},
					{func(a ep.DispatchArgs) ep.DispatchArgs {
						a.Scales = ep.NewTensor(alloc(t, d, 64), ep.F32, n, sc).WithStrides(math.MaxInt/2, math.MaxInt/2)
						return a
					}, "fits in memory"},
				} {
					_, err := b.Dispatch(ctx, bad.a(a))
					require.ErrorIs(t, err, ep.ErrInvalidArgument)
					require.ErrorContains(t, err, bad.want)
				}
				require.NoError(t, b.Check())
			})
		}
	}
}

// 4, 7. A ctx that has ended is refused before anything is launched, by
// every call, and the Buffer stays usable (a later round is exact); a
// deadline is a timeout (errors.Is(err, ErrTimeout)).
func TestEndedContextRefusedBeforeLaunch(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(variant(kind, "refused"), func(t *testing.T) {
			s := engineSpec(kind, "ctx")
			r := newRig(t, kind, s.ranks, s.config())
			io := setup(t, r, s)
			ins := newRound(t, r, s, io, 0)
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel2()
			ctx := context.Background()
			res := make([]ep.DispatchResult, s.ranks)
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				var err error
				res[i], err = b.Dispatch(ctx, io[i].args(s, i))
				return err
			}))
			for i, b := range r.bufs {
				st := r.streams[i]
				calls := map[string]func(context.Context) error{
					"dispatch": func(c context.Context) error { _, err := b.Dispatch(c, io[i].args(s, i)); return err },
					"cached": func(c context.Context) error {
						a := io[i].args(s, i)
						a.Handle = res[i].Handle
						_, err := b.Dispatch(c, a)
						return err
					},
					"combine": func(c context.Context) error {
						_, err := b.Combine(c, ep.CombineArgs{X: res[i].RecvX, Handle: res[i].Handle, Stream: st})
						return err
					},
					"layout": func(c context.Context) error {
						_, err := b.Layout(c, ep.LayoutArgs{TopK: io[i].args(s, i).TopK})
						return err
					},
					"barrier": func(c context.Context) error { _, err := b.Barrier(c, st, nil); return err },
				}
				for name, call := range calls {
					err := call(cancelled)
					require.ErrorIs(t, err, context.Canceled, name)
					require.ErrorContains(t, err, "refused before launch", name)
					err = call(expired)
					require.ErrorIs(t, err, context.DeadlineExceeded, name)
					require.ErrorIs(t, err, ep.ErrTimeout, "%s: a deadline is a timeout", name)
					//nolint:staticcheck // a nil context is refused, not a panic
					require.ErrorIs(t, call(nil), ep.ErrInvalidArgument, name)
					require.NoError(t, b.Check(), "%s: refusals leave the Buffer usable", name)
				}
				held, _, _ := b.Events()
				require.Equal(t, 1, held, "rank %d: refused calls take no Done event", i)
			}
			// Nothing was launched: the ranks are still in step, and a round
			// is exact.
			want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
			require.NoError(t, err)
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				a := io[i].args(s, i)
				a.Handle, a.Stream = res[i].Handle, r.streams[i]
				var err error
				res[i], err = b.Dispatch(ctx, a)
				if err == nil {
					err = r.streams[i].Synchronize()
				}
				return err
			}))
			for i := range res {
				checkDispatch(t, s, r, i, res[i], want[i], nil, false, "after the refusals")
			}
			runCombine(t, r, s, res, want, 7)
		})
	}
}

// 5. GOEP_EP_POISON: a view read after it expired is garbage (NaN rows,
// 0x80 ids), so a test that checks it fails; without the debug mode the
// same misuse reads stale data that still looks right.
func TestPoisonedViews(t *testing.T) {
	for _, kind := range kinds(t) {
		for _, debug := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/poison=%v", variant(kind, "expired-views"), debug), func(t *testing.T) {
				if debug {
					t.Setenv(ep.PoisonEnv, "1")
				} else {
					t.Setenv(ep.PoisonEnv, "")
				}
				s := engineSpec(kind, "poison")
				r := newRig(t, kind, s.ranks, s.config())
				io := setup(t, r, s)
				ctx := context.Background()
				ins := newRound(t, r, s, io, 0)
				want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
				require.NoError(t, err)
				first := make([]ep.DispatchResult, s.ranks)
				comb := make([]ep.CombineResult, s.ranks)
				lay := make([]ep.LayoutResult, s.ranks)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					a := io[i].args(s, i)
					a.Stream = r.streams[i]
					var err error
					if first[i], err = b.Dispatch(ctx, a); err != nil {
						return err
					}
					if comb[i], err = b.Combine(ctx, ep.CombineArgs{X: first[i].RecvX, Handle: first[i].Handle, Stream: r.streams[i]}); err != nil {
						return err
					}
					if lay[i], err = b.Layout(ctx, ep.LayoutArgs{TopK: a.TopK, Stream: r.streams[i]}); err != nil {
						return err
					}
					return r.streams[i].Synchronize()
				}))
				for i := range first {
					checkDispatch(t, s, r, i, first[i], want[i], nil, true, "live views")
				}
				combined := make([][]uint16, s.ranks)
				for i := range comb {
					combined[i] = fromDev[uint16](t, r.devs[i], comb[i].X.Ptr, s.tokens[i]*s.hidden)
				}
				// The next calls of each kind: empty ones, so that nothing
				// overwrites the old rows but the poison.
				empty := s
				empty.tokens = fill(s.ranks, 0)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					a := io[i].args(empty, i)
					a.Stream = r.streams[i]
					res, err := b.Dispatch(ctx, a)
					if err != nil {
						return err
					}
					if _, err := b.Combine(ctx, ep.CombineArgs{X: res.RecvX, Handle: res.Handle, Stream: r.streams[i]}); err != nil {
						return err
					}
					if _, err := b.Layout(ctx, ep.LayoutArgs{TopK: a.TopK, Stream: r.streams[i]}); err != nil {
						return err
					}
					return r.streams[i].Synchronize()
				}))
				for i := range first {
					n := want[i].Received()
					require.Positive(t, n)
					x := fromDev[uint16](t, r.devs[i], first[i].RecvX.Ptr, n*s.hidden)
					ids := fromDev[int64](t, r.devs[i], first[i].RecvTopK.Ptr, n*s.topk)
					src := fromDev[int32](t, r.devs[i], first[i].RecvSrcToken.Ptr, n)
					cx := fromDev[uint16](t, r.devs[i], comb[i].X.Ptr, s.tokens[i]*s.hidden)
					inRank := fromDev[uint8](t, r.devs[i], lay[i].IsTokenInRank.Ptr, s.tokens[i]*s.ranks)
					if !debug {
						// Silent misuse: the stale rows still match.
						sameSlice(t, want[i].RecvX, x, "rank %d stale rows", i)
						sameSlice(t, combined[i], cx, "rank %d stale combine output", i)
						continue
					}
					for j, v := range x {
						require.Equal(t, uint16(0xffff), v, "rank %d: expired row element %d is not poisoned (NaN)", i, j)
					}
					for j, v := range ids {
						require.Equal(t, int64(-0x7f7f7f7f7f7f7f80), v, "rank %d: expired id %d", i, j)
					}
					for j, v := range src {
						require.Equal(t, int32(-0x7f7f7f80), v, "rank %d: expired source token %d", i, j)
					}
					for j, v := range cx {
						require.Equal(t, uint16(0xffff), v, "rank %d: expired combine output %d", i, j)
					}
					for j, v := range inRank {
						require.Equal(t, uint8(0x80), v, "rank %d: expired is_token_in_rank %d", i, j)
					}
				}
			})
		}
	}
}

// 1 (issue 18). Every method is safe on nil receivers and after Close;
// accessors polled from other goroutines while Close runs do not crash.
func TestNilAndClosed(t *testing.T) {
	ctx := context.Background()
	var nb *ep.Buffer
	var nh *ep.Handle
	var ne *ep.Event
	_, err := nb.Dispatch(ctx, ep.DispatchArgs{})
	require.Error(t, err)
	_, err = nb.Combine(ctx, ep.CombineArgs{})
	require.Error(t, err)
	_, err = nb.Layout(ctx, ep.LayoutArgs{})
	require.Error(t, err)
	_, err = nb.Barrier(ctx, nil, nil)
	require.Error(t, err)
	_, _, err = nb.CombineInput(nil)
	require.Error(t, err)
	_, err = nb.NewEvent()
	require.Error(t, err)
	_, err = nb.LaunchFor(ep.OpDispatch, nil)
	require.Error(t, err)
	require.Error(t, nb.Check())
	require.NoError(t, nb.InvalidIDs())
	require.NoError(t, nb.Close(ctx))
	require.Zero(t, nb.Rank()+nb.Ranks()+nb.MaxRecv()+nb.LocalExperts())
	require.Zero(t, nb.Memory())
	require.Nil(t, nb.Device())
	require.Nil(t, nb.Stream())
	require.Zero(t, nb.Config())
	require.Zero(t, nb.SizeHint())
	held, size, wraps := nb.Events()
	require.Zero(t, held+size+int(wraps))
	live, slots, bytes := nb.Handles()
	require.Zero(t, live+slots+int(bytes))

	require.Zero(t, nh.Tokens())
	require.Equal(t, -1, nh.NumRecv())
	require.Nil(t, nh.TokensPerExpert())
	require.False(t, nh.Live())
	require.Zero(t, nh.Bytes())
	require.Error(t, nh.Pin())
	nh.Release()

	require.Zero(t, ne.Handle())
	require.Error(t, ne.Record(nil))
	require.Error(t, ne.Wait(nil))
	require.Error(t, ne.Synchronize())
	ne.Release()
	require.NoError(t, ne.Close())

	for _, kind := range kinds(t) {
		t.Run(variant(kind, "after-close"), func(t *testing.T) {
			s := engineSpec(kind, "closed")
			r := newRig(t, kind, s.ranks, s.config())
			io := setup(t, r, s)
			newRound(t, r, s, io, 0)
			res := make([]ep.DispatchResult, s.ranks)
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				a := io[i].args(s, i)
				a.Stream = r.streams[i]
				var err error
				res[i], err = b.Dispatch(ctx, a)
				return err
			}))
			// Poll every accessor from other goroutines while Close runs.
			var stop atomic.Bool
			var wg sync.WaitGroup
			for i, b := range r.bufs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						_ = b.InvalidIDs()
						_ = b.Check()
						_ = b.Memory()
						_ = b.Stream()
						_, _, _ = b.Events()
						_, _, _ = b.Handles()
						_ = res[i].Handle.Live()
						_ = res[i].Handle.Bytes()
						_ = res[i].Done.Handle()
						_ = b.Rank() + b.MaxRecv()
					}
				}()
			}
			require.NoError(t, r.close())
			stop.Store(true)
			wg.Wait()
			for i, b := range r.bufs {
				_, err := b.Dispatch(ctx, io[i].args(s, i))
				require.ErrorIs(t, err, ep.ErrClosed)
				_, err = b.Combine(ctx, ep.CombineArgs{X: res[i].RecvX, Handle: res[i].Handle})
				require.ErrorIs(t, err, ep.ErrClosed)
				_, err = b.Layout(ctx, ep.LayoutArgs{TopK: io[i].args(s, i).TopK})
				require.ErrorIs(t, err, ep.ErrClosed)
				_, err = b.Barrier(ctx, nil, nil)
				require.ErrorIs(t, err, ep.ErrClosed)
				_, _, err = b.CombineInput(res[i].Handle)
				require.ErrorIs(t, err, ep.ErrClosed)
				_, err = b.NewEvent()
				require.ErrorIs(t, err, ep.ErrClosed)
				require.ErrorIs(t, b.Check(), ep.ErrClosed)
				require.NoError(t, b.InvalidIDs())
				require.Nil(t, b.Stream())
				require.Zero(t, b.Memory().Device)
				require.NoError(t, b.Close(ctx), "closing twice")
				h := res[i].Handle
				require.False(t, h.Live())
				require.ErrorIs(t, h.Pin(), ep.ErrExpiredHandle)
				h.Release()
				e := res[i].Done
				require.Zero(t, e.Handle())
				require.Error(t, e.Wait(nil))
				require.Error(t, e.Synchronize())
				e.Release()
				require.NoError(t, e.Close())
			}
		})
	}
}

// 7 (issue 18). A bootstrap timeout at Close (a peer that never closes)
// satisfies errors.Is(err, ErrTimeout), and Close still frees everything.
func TestCloseTimeoutIsErrTimeout(t *testing.T) {
	boots, err := bootstrap.NewInProcess(2, bootstrap.Config{Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	bufs := make([]*ep.Buffer, 2)
	devs := make([]*counting, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range bufs {
		d, err := ep.OpenDevice(ep.Host, i)
		require.NoError(t, err)
		devs[i] = newCounting(d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs[i], errs[i] = ep.NewBuffer(context.Background(), boots[i], devs[i], ep.Config{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 4})
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	err = bufs[0].Close(context.Background()) // rank 1 never closes in time
	require.ErrorIs(t, err, ep.ErrTimeout)
	a, m, imp := devs[0].live()
	require.Zero(t, a+m+imp, "Close freed everything despite the timeout")
	require.NoError(t, bufs[1].Close(context.Background())) // rank 0's message is there
	for i := range devs {
		require.NoError(t, devs[i].Device.Close())
		require.NoError(t, boots[i].Close())
	}
}

// 2 (issue 18). Huge sizes never wrap a byte count: configurations and
// tensors whose sizes overflow are refused, not a panic; a large expert
// alignment is refused rather than truncated to 32 bits.
func TestHugeSizes(t *testing.T) {
	for _, c := range []ep.Config{
		{MaxTokens: 8, Hidden: 1 << 62, TopK: 2, Experts: 4},
		{MaxTokens: 8, Hidden: math.MaxInt &^ 127, TopK: 2, Experts: 4, FP8: true},
		{MaxTokens: math.MaxInt, Hidden: 128, TopK: 2, Experts: 4},
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 4, Handles: math.MaxInt},
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 4, Events: math.MaxInt},
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 4, WorkspaceBytes: math.MaxInt},
	} {
		require.NotPanics(t, func() {
			_, err := ep.SizeHints(c, 2)
			if c.WorkspaceBytes == 0 {
				require.Error(t, err, "%+v", c)
			}
		})
	}
	for _, x := range []ep.Tensor{
		ep.NewTensor(1<<20, ep.BF16, 1<<40, 1<<40),
		ep.NewTensor(1<<20, ep.BF16, math.MaxInt, 2),
		ep.NewTensor(1<<20, ep.F32, -1, 2),
	} {
		require.Zero(t, x.Bytes(), "%v", x)
		_, ok := x.Span()
		require.False(t, ok, "%v", x)
	}

	r := newRig(t, ep.Host, 1, ep.Config{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 4})
	b, d := r.bufs[0], r.devs[0]
	ids := ep.NewTensor(toDev(t, d, []int64{0, 1, 2, 3}), ep.I64, 2, 2)
	x := ep.NewTensor(alloc(t, d, 2*2*128), ep.BF16, 2, 128)
	ctx := context.Background()
	for _, a := range []ep.DispatchArgs{
		{X: ep.NewTensor(x.Ptr, ep.BF16, 1<<40, 1<<40), TopK: ids},
		{X: x, TopK: ep.NewTensor(ids.Ptr, ep.I64, math.MaxInt/4, 2)},
		{X: ep.NewTensor(^uintptr(0)-63, ep.BF16, 2, 128), TopK: ids},
		{X: x, TopK: ids, ExpertAlignment: 1 << 32},
		{X: x, TopK: ids, ExpertAlignment: 1<<32 + 64},
		{X: x, TopK: ids, ExpertAlignment: ep.MaxExpertAlignment + 1},
	} {
		require.NotPanics(t, func() {
			_, err := b.Dispatch(ctx, a)
			require.ErrorIs(t, err, ep.ErrInvalidArgument, "%+v", a)
		})
	}
	require.NoError(t, b.Check())
	res, err := b.Dispatch(ctx, ep.DispatchArgs{X: x, TopK: ids, ExpertAlignment: ep.MaxExpertAlignment})
	require.NoError(t, err)
	require.Equal(t, []int{ep.MaxExpertAlignment, ep.MaxExpertAlignment, ep.MaxExpertAlignment, ep.MaxExpertAlignment}, res.TokensPerExpert)

}
