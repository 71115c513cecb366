package buffer

import (
	"context"
	"fmt"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// The call sequences of the Buffer's mode. Package ep validates every
// argument once, before it calls here: these methods trust their inputs
// (shapes, dtypes, alignment, slot indices) and own the order of the
// launches, the host waits and what a failure mid-collective leaves.

// DispatchCall is one rank's part of a dispatch, validated by the caller.
type DispatchCall struct {
	// Stream is where the work is enqueued (never nil: the caller picks).
	Stream device.Stream
	// Tokens is this rank's T.
	Tokens int
	// X is BF16 [T][Hidden], or FP8 E4M3 bytes [T][Hidden] with Scales
	// float32 [T][Hidden/FP8Block] when FP8.
	X, Scales uintptr
	FP8       bool
	// TopK is the routing [T][TopK], int64 or int32 (TopKI32); 0 in a
	// cached dispatch that reuses the copy its handle slot keeps.
	TopK    uintptr
	TopKI32 bool
	// Weights is float32 [T][TopK], optional.
	Weights uintptr
	// Slot is the handle slot: built by a non-cached dispatch, reused by a
	// cached one (Cached).
	Slot   int
	Cached bool
	// HostWait (non-cached only) makes the host wait for the received
	// count, as DeepEP does, so the outcome has exact counts.
	HostWait bool
	// WorstCase marks the received top-k region "no expert" first, so that
	// views sized for MaxRecv rows read -1 past the received count.
	WorstCase bool
	// ExpertAlignment rounds each local expert's count up (non-cached),
	// 0..MaxExpertAlignment.
	ExpertAlignment int
	// ScaleStrides are the FP8 scales' element strides {token, column}
	// (zero: row-major, {Hidden/FP8Block, 1}).
	ScaleStrides [2]int64
	// Launch is the resolved launch configuration (LaunchConfig.Resolve).
	Launch LaunchConfig
}

// MaxExpertAlignment is the largest DispatchCall.ExpertAlignment.
const MaxExpertAlignment = intranode.MaxExpertAlignment

// DispatchOutcome is what a dispatch learnt on the host.
type DispatchOutcome struct {
	// NumRecv is the rows received, or -1 when the host did not wait.
	NumRecv int
	// TokensPerExpert are the received (token, local expert) pairs per
	// local expert, rounded up to the alignment (host wait only).
	TokensPerExpert []int
	// InvalidIDs counts this rank's top-k ids outside [-1, Experts),
	// treated as -1 (host wait only; else read NotifyInvalid after Done).
	InvalidIDs int
}

// Dispatch runs a dispatch: for a non-cached call the routing copy into
// the slot (or int32 ids widened there), notify and dispatch in one launch
// sequence, then the host wait when asked; for a cached call the dispatch
// kernel alone. A failure once the launch sequence has started makes the
// Buffer unusable (peers may already wait on this rank).
func (b *Buffer) Dispatch(ctx context.Context, c DispatchCall) (DispatchOutcome, error) {
	const op = "dispatch"
	out := DispatchOutcome{NumRecv: -1}
	if b == nil {
		return out, errNil
	}
	b.calls.RLock()
	defer b.calls.RUnlock()
	if err := b.Usable(); err != nil {
		return out, err
	}
	if ctx == nil {
		return out, b.errorf("%s: nil context", op)
	}
	if err := ctx.Err(); err != nil { // refused before anything is enqueued
		return out, ctxError(fmt.Sprintf("buffer: rank %d: %s: refused before launch", b.rank, op), err)
	}
	if c.Slot < 0 || c.Slot >= b.cfg.handles() {
		return out, b.errorf("%s: handle slot %d of %d", op, c.Slot, b.cfg.handles())
	}
	if c.ExpertAlignment < 0 || c.ExpertAlignment > intranode.MaxExpertAlignment {
		return out, b.errorf("%s: expert alignment %d: want 0..%d", op, c.ExpertAlignment, intranode.MaxExpertAlignment)
	}
	if b.mode == Internode {
		return b.dispatchInternode(ctx, c)
	}
	s, l := c.Stream, b.hint.Layout
	slot := b.slot(c.Slot, c.Tokens)
	if c.WorstCase {
		// Rows past the received count read as "no expert".
		if err := b.dev.MemsetAsync(b.ws.Ptr+uintptr(l.RecvTopK.Offset), 0xff, l.RecvTopK.Size, s); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	}
	topk := c.TopK
	if topk == 0 { // cached: the handle's copy of the routing
		topk = slot.topk
	}
	// int32 ids are widened first: straight into the slot's copy of the
	// routing when building a handle (the int64 ids notify and dispatch
	// read), else into the id scratch.
	if c.TopK != 0 && c.TopKI32 {
		topk = b.ids.Ptr
		if !c.Cached {
			topk = slot.topk
		}
		if err := routing.LaunchWidenIDs(b.dev, s, c.TopK, topk, c.Tokens*b.cfg.TopK); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	}
	da := intranode.DispatchArgs{X: c.X, FP8: c.FP8, Scales: c.Scales, ScaleStrides: c.ScaleStrides, TopK: topk,
		Weights: c.Weights, Handle: slot.handle}
	launch := c.Launch.intranode()
	if c.Cached {
		if err := b.work.Dispatch(b.dev, s, da, launch); err != nil {
			return out, b.Fail(b.errorf("%w", err))
		}
		return out, nil
	}
	if c.Tokens > 0 && !c.TopKI32 {
		if err := b.dev.CopyAsync(slot.topk, c.TopK, 8*c.Tokens*b.cfg.TopK, s); err != nil {
			return out, b.Fail(b.errorf("%s: %w", op, err))
		}
	}
	na := intranode.NotifyArgs{TopK: topk, Handle: slot.handle, ExpertAlignment: c.ExpertAlignment,
		ExpertCounts: slot.expertCounts, Invalid: b.mapped.Dev + mappedNotifyInvalid}
	if c.HostWait {
		b.storeMapped(mappedRecvCount, -1)
		na.RecvCount, na.ExpertCounts = b.mapped.Dev+mappedRecvCount, b.mapped.Dev+mappedExpertCounts
	}
	// One launch sequence: the dispatch skips its entry wait, which
	// notify's barrier already implies.
	if err := b.work.NotifyDispatch(b.dev, s, na, da, launch); err != nil {
		return out, b.Fail(b.errorf("%w", err))
	}
	if !c.HostWait {
		return out, nil
	}
	n, err := b.waitRecvCount(ctx, op)
	if err != nil {
		return out, err
	}
	out.NumRecv, out.TokensPerExpert, out.InvalidIDs = n, b.expertCounts(), b.NotifyInvalid()
	return out, nil
}

// CombineCall is one rank's part of a combine, validated by the caller.
type CombineCall struct {
	Stream device.Stream
	// Slot is the handle slot of the dispatch being reversed, built for
	// Tokens tokens; Rows is its received count when the host knows it,
	// else 0 (inputs outside the workspace are then staged by a kernel
	// that reads the count on the device).
	Slot, Tokens, Rows int
	// X is BF16 [N][Hidden] (0 when nothing was received), Weights float32
	// [N][TopK] optional; Bias0, Bias1 BF16 [T][Hidden] optional.
	X, Weights, Bias0, Bias1 uintptr
	// Out is BF16 [T][Hidden]; OutWeights float32 [T][TopK] (with Weights).
	Out, OutWeights uintptr
	Launch          LaunchConfig
}

// Combine runs a combine. A failed launch makes the Buffer unusable.
func (b *Buffer) Combine(c CombineCall) error {
	const op = "combine"
	if b == nil {
		return errNil
	}
	b.calls.RLock()
	defer b.calls.RUnlock()
	if err := b.Usable(); err != nil {
		return err
	}
	if c.Slot < 0 || c.Slot >= b.cfg.handles() {
		return b.errorf("%s: handle slot %d of %d", op, c.Slot, b.cfg.handles())
	}
	if b.mode == Internode {
		return b.combineInternode(c)
	}
	y := c.X
	if y == 0 { // no rows: the kernel reads none, but wants a pointer
		y = b.work.Recv().X
	}
	ca := intranode.CombineArgs{Y: y, Weights: c.Weights, Bias0: c.Bias0, Bias1: c.Bias1, Out: c.Out,
		OutWeights: c.OutWeights, Handle: b.slot(c.Slot, c.Tokens).handle, Rows: c.Rows}
	if err := b.work.Combine(b.dev, c.Stream, ca, c.Launch.intranode()); err != nil {
		return b.Fail(b.errorf("%w", err))
	}
	return nil
}

// Layout runs the dispatch-layout kernel on tokens rows of int64 (or
// int32) top-k ids on s and returns its outputs, views into the Buffer
// valid until the next Layout. Local: no other rank takes part.
func (b *Buffer) Layout(s device.Stream, topk uintptr, i32 bool, tokens int, cfg routing.LayoutConfig) (routing.LayoutOutput, error) {
	if b == nil {
		return routing.LayoutOutput{}, errNil
	}
	b.calls.RLock()
	defer b.calls.RUnlock()
	if err := b.Usable(); err != nil {
		return routing.LayoutOutput{}, err
	}
	shape := routing.Shape{Tokens: tokens, K: b.cfg.TopK, Experts: b.cfg.Experts, Ranks: b.ranks}
	out := b.layoutOutputs()
	in := routing.LayoutInput{TopK: topk, Int32: i32, Shape: shape}
	if err := routing.LaunchLayout(b.dev, s, in, out, cfg); err != nil {
		// A failed launch leaves no peer waiting, but the layout workspace
		// may hold partial sums.
		return routing.LayoutOutput{}, b.Fail(b.errorf("layout: %w", err))
	}
	return out, nil
}

// Recv are the dispatch outputs of a handle slot: views into this rank's
// receive region (valid until the next dispatch) and the slot's counts.
type Recv struct {
	X        uintptr // BF16 [N][Hidden], or FP8 bytes [N][Hidden] after an FP8 dispatch
	Scales   uintptr // float32 [N][Hidden/FP8Block] (FP8 buffers)
	SrcToken uintptr // int32 [N]: token index at the source
	TopK     uintptr // int64 [N][TopK]: local expert ids, -1 for experts on other ranks
	Weights  uintptr // float32 [N][TopK]
	// NumRecv is int32 [1] (N), RankPrefix int32 [Ranks] (rows received
	// from sources 0..s), ExpertCounts int32 [LocalExperts] (written by a
	// dispatch without host wait), all in the slot's device memory.
	NumRecv, RankPrefix, ExpertCounts uintptr
}

// RecvViews returns the receive region and slot i's counts (zero for a
// slot out of range, a nil Buffer, or once closed).
func (b *Buffer) RecvViews(slot int) Recv {
	if !b.isOpen() || slot < 0 || slot >= b.cfg.handles() {
		return Recv{}
	}
	s := b.slot(slot, 0)
	if b.mode == Internode {
		l := b.hint.Recv
		r := Recv{X: b.recvPtr(l.X), SrcToken: b.recvPtr(l.SrcToken), TopK: b.recvPtr(l.TopK), Weights: b.recvPtr(l.Weights),
			NumRecv: s.handle.NumRecv, RankPrefix: s.handle.RankPrefix, ExpertCounts: s.expertCounts}
		if b.cfg.FP8 {
			r.Scales = b.recvPtr(l.Scales)
		}
		return r
	}
	v := b.work.Recv()
	return Recv{X: v.X, Scales: v.Scales, SrcToken: v.SrcToken, TopK: v.TopK, Weights: v.Weights,
		NumRecv: s.handle.NumRecv, RankPrefix: s.handle.RankPrefix, ExpertCounts: s.expertCounts}
}

// CombineInput is this rank's combine input region: BF16 [MaxRecv][Hidden]
// and float32 [MaxRecv][TopK], read in place by Combine.
func (b *Buffer) CombineInput() (x, weights uintptr) {
	if !b.isOpen() {
		return 0, 0
	}
	if b.mode == Internode {
		return b.recvPtr(b.hint.Recv.CombineX), b.recvPtr(b.hint.Recv.CombineWeights)
	}
	v := b.work.CombineInput()
	return v.X, v.Weights
}

// CombineOutputs are the default combine outputs: BF16 [MaxTokens][Hidden]
// and float32 [MaxTokens][TopK].
func (b *Buffer) CombineOutputs() (x, weights uintptr) {
	if !b.isOpen() {
		return 0, 0
	}
	return b.combine.Ptr, b.combine.Ptr + uintptr(alignUp(2*b.cfg.MaxTokens*b.cfg.Hidden))
}

// isOpen reports a Buffer not closed (perhaps failed): its memory is
// still there, so views may still be described.
func (b *Buffer) isOpen() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.closed
}

// slotMem is handle slot i's device memory as the kernels see it.
type slotMem struct {
	handle intranode.Handle
	// topk is int64 [MaxTokens][TopK]: a copy of the routing the handle was
	// built from, so cached dispatches need only x.
	topk uintptr
	// expertCounts is int32 [LocalExperts]: received (token, local expert)
	// pairs, for dispatches that do not wait on the host.
	expertCounts uintptr
}

func (b *Buffer) slot(i, tokens int) slotMem {
	p, s := b.slots.Ptr+uintptr(i*b.slotPlan.size), b.slotPlan
	return slotMem{
		handle: intranode.Handle{Tokens: tokens, SendPos: p + uintptr(s.sendPos), RankPrefix: p + uintptr(s.rankPrefix),
			RecvBase: p + uintptr(s.recvBase), NumRecv: p + uintptr(s.numRecv)},
		topk:         p + uintptr(s.topk),
		expertCounts: p + uintptr(s.expertCounts),
	}
}

// layoutOutputs are the dispatch-layout kernel's outputs in the Buffer,
// with its invalid-id count in host-mapped memory.
func (b *Buffer) layoutOutputs() routing.LayoutOutput {
	p := b.layout.Ptr
	return routing.LayoutOutput{
		TokensPerRank:   p + uintptr(b.outPlan.perRank),
		TokensPerExpert: p + uintptr(b.outPlan.perExpert),
		IsTokenInRank:   p + uintptr(b.outPlan.inRank),
		Invalid:         b.mapped.Dev + mappedLayoutInvalid,
		Workspace:       p + uintptr(b.outPlan.workspace),
	}
}
