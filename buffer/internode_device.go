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
// What package internode's kernels keep between calls: the layout of one
// notify round per handle slot (NotifyConfig.Layouts; a round writes the
// one of its slot, DeviceNotify.Layout), the relay rows and slots of the
// latest dispatch only. So:
//   - a cached dispatch runs no notify round: of the handle dispatched
//     last it is a cached dispatch straight away (internode.DeviceDispatch
//     .Cached: the kernel reads that round's layout and waits for its
//     peers' earlier steps instead of a notify round); of another handle
//     it first makes the handle's kept layout current (Notify.Resume);
//   - a combine of any dispatch but the latest, or a second combine of
//     the latest, first replays a cached route-only dispatch (relay rows
//     and slots, no payload, no receive outputs) on the same stream,
//     after Resume where the handle is not the latest. Every rank makes
//     the same choice from the same call order.

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
	switch {
	case !c.Cached:
		if err := in.notify.RunAsync(s, dn); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	case in.last != st.seq:
		if err := in.notify.Resume(c.Slot); err != nil {
			return out, b.Fail(b.errorf("%s: handle slot %d: %w", op, c.Slot, err))
		}
	}
	dd := internode.DeviceDispatch{Cached: c.Cached, X: c.X, FP8: c.FP8, Scales: c.Scales, ScaleStrides: c.ScaleStrides, Weights: c.Weights,
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
		// A combine follows a dispatch of its route: the relay rows in
		// place are another handle's, or (a second combine) the combine
		// must wait, as a cached dispatch does, until the node's
		// forwarders finished reading the receive rows the first one
		// copied in (internode/DESIGN.md). Replay the route, cached, after
		// making this handle's kept layout current if it is not.
		if in.last != st.seq {
			if err := in.notify.Resume(c.Slot); err != nil {
				return b.Fail(b.errorf("%s: handle slot %d: %w", op, c.Slot, err))
			}
		}
		if err := in.notify.DispatchAsync(c.Stream, internode.DeviceDispatch{RouteOnly: true, Cached: true}); err != nil {
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
