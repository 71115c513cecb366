package buffer

import (
	"context"

	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/routing"
)

// The internode mode on CUDA devices: package internode's device-pointer
// form. Dispatch enqueues, on the caller's stream, the routing copy into
// the handle slot (int32 ids widened there), the notify kernel (which
// writes the slot's received count, rank prefix and per-expert counts, and
// into host-mapped memory the invalid ids and, for a host wait, the
// received count) and the dispatch kernel, which reads the caller's x,
// scales and weights in place and unpacks the received rows into the
// receive region. Combine enqueues the combine kernel, which reads the
// caller's expert outputs and biases and writes the caller's outputs.
// Nothing passes through the host and the ranks never meet on the host:
// the kernels' counters order the steps across ranks, the stream on each
// rank. A wait that gives up shows in Check (the watchdog's record).
//
// What package internode's kernels keep between calls decides two things
// (as for the host twins, buffer/internode.go):
//   - a cached dispatch of the handle whose routing was dispatched last
//     runs no notify round (internode.DeviceDispatch.Cached: the kernel
//     reads that round's layout, still in place, and waits for its peers'
//     earlier steps instead); a cached dispatch of another handle runs a
//     notify round again with the slot's copy of the routing (the counts
//     are exchanged again, the outcome is the same);
//   - a combine of any dispatch but the latest first replays the handle's
//     notify round and a route-only dispatch (relay rows and slots, no
//     payload, no receive outputs), on the same stream; a second combine
//     of the latest needs the route-only dispatch only, cached. Every rank
//     makes the same choice from the same call order.
//
// Each notify round writes its slot's kept layout (DeviceNotify.Layout).
// internode.Notify.Resume could make an older handle's layout current
// without a notify round; the Buffer does not use it yet. Session 17's CI
// found that a resumed dispatch republished its receive bases while a node
// peer's combine still read them (the dispatch kernel now waits for the
// local ranks' earlier steps first, cached bit 2), and that kernel change
// has not run on a GPU yet (internode/DESIGN.md, "Session 17").

// dispatchInternodeDevice is Dispatch in the internode mode on CUDA.
func (b *Buffer) dispatchInternodeDevice(ctx context.Context, c DispatchCall) (DispatchOutcome, error) {
	const op = "internode dispatch"
	out := DispatchOutcome{NumRecv: -1}
	in := b.inter
	k := b.cfg.TopK
	s, l := c.Stream, b.hint.Recv
	slot := b.slot(c.Slot, c.Tokens)
	st := &in.slots[c.Slot]
	if c.Cached && (!st.valid || st.tokens != c.Tokens) {
		return out, b.errorf("%s: handle slot %d holds a routing of %d tokens, the call has %d", op, c.Slot, st.tokens, c.Tokens)
	}
	if c.WorstCase {
		// Rows past the received count read as "no expert".
		if err := b.dev.MemsetAsync(b.recvPtr(l.TopK), 0xff, 8*l.Rows*k, s); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	}
	// The slot keeps an int64 copy of the routing: notify and dispatch
	// read it, and cached dispatches and combine replays reuse it.
	if !c.Cached && c.Tokens > 0 {
		var err error
		if c.TopKI32 {
			err = routing.LaunchWidenIDs(b.dev, s, c.TopK, slot.topk, c.Tokens*k)
		} else {
			err = b.dev.CopyAsync(slot.topk, c.TopK, 8*c.Tokens*k, s)
		}
		if err != nil {
			return out, b.Fail(b.errorf("%s: the routing into handle slot %d: %w", op, c.Slot, err))
		}
	}
	dn := internode.DeviceNotify{TopK: slot.topk, Tokens: c.Tokens, Layout: c.Slot}
	if !c.Cached {
		dn.ExpertAlignment = c.ExpertAlignment
		dn.NumRecv, dn.RankPrefix, dn.ExpertCounts = slot.handle.NumRecv, slot.handle.RankPrefix, slot.expertCounts
		dn.HostInvalid = b.mapped.Dev + mappedNotifyInvalid
		if c.HostWait {
			b.storeMapped(mappedRecvCount, -1)
			dn.HostRecvCount, dn.HostExpertCounts = b.mapped.Dev+mappedRecvCount, b.mapped.Dev+mappedExpertCounts
		}
	}
	cachedHere := c.Cached && in.last == st.seq
	if !cachedHere {
		if err := in.notify.RunAsync(s, dn); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	}
	dd := internode.DeviceDispatch{Cached: cachedHere, X: c.X, FP8: c.FP8, Scales: c.Scales, ScaleStrides: c.ScaleStrides, Weights: c.Weights,
		RecvX: b.recvPtr(l.X), RecvTopK: b.recvPtr(l.TopK), RecvSrcToken: b.recvPtr(l.SrcToken)}
	if c.FP8 {
		dd.RecvScales = b.recvPtr(l.Scales)
	}
	if c.Weights != 0 {
		dd.RecvWeights = b.recvPtr(l.Weights)
	}
	if err := in.notify.DispatchAsync(s, dd); err != nil {
		return out, b.Fail(b.errorf("%s: %w", op, err))
	}
	if !c.Cached {
		in.seq++
		*st = interSlot{valid: true, seq: in.seq, tokens: c.Tokens, recv: -1}
	}
	in.last, in.combined = st.seq, false
	if c.Cached || !c.HostWait {
		return out, nil
	}
	n, err := b.waitRecvCount(ctx, op)
	if err != nil {
		return out, err
	}
	st.recv = n
	// The internode hint has no intranode layout: its local experts are
	// the world's share.
	counts := make([]int, b.cfg.Experts/b.ranks)
	for i := range counts {
		counts[i] = int(b.mappedI32(mappedExpertCounts + 4*i).Load())
	}
	out.NumRecv, out.TokensPerExpert, out.InvalidIDs = n, counts, b.NotifyInvalid()
	return out, nil
}

// combineInternodeDevice is Combine in the internode mode on CUDA.
func (b *Buffer) combineInternodeDevice(c CombineCall) error {
	const op = "internode combine"
	in := b.inter
	st := in.slots[c.Slot]
	if !st.valid || st.tokens != c.Tokens {
		return b.errorf("%s: handle slot %d holds a routing of %d tokens, the call has %d", op, c.Slot, st.tokens, c.Tokens)
	}
	if in.last != st.seq || in.combined {
		// A second combine of the handle dispatched last needs only a
		// cached route-only dispatch (its layout is the latest notify
		// round's); another handle's needs its notify round again.
		cached := in.last == st.seq
		if !cached {
			slot := b.slot(c.Slot, c.Tokens)
			if err := in.notify.RunAsync(c.Stream, internode.DeviceNotify{TopK: slot.topk, Tokens: st.tokens, Layout: c.Slot}); err != nil {
				return b.Fail(b.errorf("%s: replaying the handle's notify: %w", op, err))
			}
		}
		if err := in.notify.DispatchAsync(c.Stream, internode.DeviceDispatch{RouteOnly: true, Cached: cached}); err != nil {
			return b.Fail(b.errorf("%s: replaying the handle's dispatch: %w", op, err))
		}
		in.last = st.seq
	}
	in.combined = true
	dc := internode.DeviceCombine{Y: c.X, Weights: c.Weights, Bias0: c.Bias0, Bias1: c.Bias1, Out: c.Out,
		OutWeights: c.OutWeights, Partial: internode.PartialBF16}
	if err := in.notify.CombineAsync(c.Stream, dc); err != nil {
		return b.Fail(b.errorf("%s: %w", op, err))
	}
	return nil
}
