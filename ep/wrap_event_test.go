package ep_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// WrapEvent's refusals, and a wrapped event on the host backend: a marker
// that Record, Wait, Synchronize and Close accept.
// On the host backend a wrapped event is a marker that orders nothing: this
// checks the API (nil device refused, a closed event refused), not ordering.
func TestWrapEventHostMarkerAPI(t *testing.T) {
	_, err := ep.WrapEvent(nil, 1)
	require.Error(t, err)
	d, err := ep.OpenDevice(ep.Host, 0)
	require.NoError(t, err)
	defer d.Close()
	e, err := ep.WrapEvent(d, 0)
	require.NoError(t, err)
	require.Zero(t, e.Handle())
	require.NoError(t, e.Record(d.DefaultStream()))
	require.NoError(t, e.Wait(d.DefaultStream()))
	require.NoError(t, e.Synchronize())
	require.NoError(t, e.Close())
	require.Error(t, e.Wait(nil), "a closed event is refused")
}

// An engine's own event as After: the engine fills the ids on its stream
// (after a long stretch of other work on the GPU), records its CUevent and
// wraps the handle; the dispatch runs on the Buffer's own stream after it,
// with the wrapped event as Done too. Had the Buffer's stream not waited,
// notify would have read the placeholder ids (all -1: nothing sent).
// GPUs check the ordering (TestWrapEventAfterDispatch/cuda); the host
// backend (a marker, streams run work as issued) only the results
// (host-results).
func TestWrapEventAfterDispatch(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(variant(kind, "results"), func(t *testing.T) {
			s := spec{name: "wrap", ranks: 2, tokens: []int{40, 30}, hidden: 256, topk: 4, experts: 8, weights: true, i32: true}
			if kind == ep.CUDA {
				s.tokens, s.hidden = []int{2048, 1536}, 2048
			}
			r := newRig(t, kind, s.ranks, s.config())
			ins := make([]intranode.RankInput, s.ranks)
			io := make([]*rankIO, s.ranks)
			staging := make([]uintptr, s.ranks)
			for i := range io {
				d, n := r.devs[i], s.tokens[i]
				rt, err := routing.Generate(routing.Shape{Tokens: n, K: s.topk, Experts: s.experts, Ranks: s.ranks},
					routing.GenOptions{Seed: uint64(i + 3), Masked: n / 2})
				require.NoError(t, err)
				io[i] = &rankIO{ids: alloc(t, d, 8*n*s.topk), x: alloc(t, d, 2*n*s.hidden), weights: alloc(t, d, 4*n*s.topk)}
				io[i].in = s.newInputs(t, r, i, 1, rt.Idx)
				io[i].load(t, d, s)
				ins[i] = io[i].in
				staging[i] = toDev(t, d, narrow(rt.Idx))
				require.NoError(t, d.MemsetAsync(io[i].ids, 0xff, 4*n*s.topk, nil)) // -1: no expert
				require.NoError(t, d.DefaultStream().Synchronize())
			}
			const busy = 256 << 20
			big := make([]uintptr, s.ranks)
			if kind == ep.CUDA {
				for i := range big {
					big[i] = alloc(t, r.devs[i], busy)
				}
			}
			res := make([]ep.DispatchResult, s.ranks)
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				d, st := r.devs[i], r.streams[i]
				var handle uintptr
				var own *cuda.Event
				if kind == ep.CUDA {
					ctx := r.counts[i].Context()
					var err error
					if own, err = cuda.NewEvent(ctx, cuda.EventDisableTiming); err != nil {
						return err
					}
					defer own.Destroy()
					handle = own.Handle()
					// Keep the engine's stream busy for a while first.
					for range 16 {
						if err := d.MemsetAsync(big[i], 1, busy, st); err != nil {
							return err
						}
					}
				}
				n := s.tokens[i]
				if err := d.CopyAsync(io[i].ids, staging[i], 4*n*s.topk, st); err != nil {
					return err
				}
				if own != nil {
					if err := own.Record(cuda.WrapStream(r.counts[i].Context(), st.Handle())); err != nil {
						return err
					}
				}
				ev, err := ep.WrapEvent(r.counts[i], handle)
				if err != nil {
					return err
				}
				if ev.Handle() != handle {
					return fmt.Errorf("wrapped handle %#x, want %#x", ev.Handle(), handle)
				}
				a := io[i].args(s, i)
				a.After, a.Done = ev, ev // Stream nil: the Buffer's own
				if res[i], err = b.Dispatch(context.Background(), a); err != nil {
					return err
				}
				if res[i].Done != ev {
					return errors.New("Done is not the wrapped event")
				}
				if err := ev.Synchronize(); err != nil {
					return err
				}
				if err := ev.Close(); err != nil {
					return err
				}
				if own != nil { // still the engine's after Close
					if err := own.Record(cuda.WrapStream(r.counts[i].Context(), st.Handle())); err != nil {
						return err
					}
				}
				return st.Synchronize()
			}))
			want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
			require.NoError(t, err)
			for i := range res {
				require.Positive(t, want[i].Received())
				checkDispatch(t, s, r, i, res[i], want[i], nil, true, "after a wrapped event")
			}
		})
	}
}
