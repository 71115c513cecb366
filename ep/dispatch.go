package ep

import (
	"context"
	"errors"
	"fmt"

	"github.com/goep-dev/goep/buffer"
)

// DispatchArgs are the inputs of Dispatch.
type DispatchArgs struct {
	// X is this rank's tokens: BF16 [T, Hidden], or FP8E4M3 [T, Hidden]
	// with Scales; 16-byte aligned. T <= Config.MaxTokens; T may be 0.
	X Tensor
	// Scales is F32 [T, Hidden/128], FP8 only, 4-byte aligned, with any
	// positive element strides (Tensor.Strides; nil: row-major), read by
	// the dispatch kernel in place: row-major, rows padded to a larger
	// stride, column-major ([1, T] strides, as grouped-GEMM kernels write
	// them) and column-major with T padded for TMA ([1, align(T, 4)]) all
	// work without a copy. Strides are in elements, like torch's stride().
	Scales Tensor
	// TopK is the routing, I64 [T, TopK] (what torch.topk returns) or I32
	// [T, TopK]: global expert ids, -1 for none. Required unless Handle is
	// given (then optional: the handle keeps a copy). I32 ids are widened
	// to int64 on the call's stream first (into the handle's copy of the
	// routing, or for a cached dispatch into the Buffer's id scratch), with
	// the same results as I64 ids in every mode.
	//
	// Ids outside [-1, Experts) cannot be checked on the host without a
	// copy: the kernels treat them as -1 and count them; Dispatch returns
	// the count as an *InvalidIDsError with a valid result (worst case:
	// Buffer.InvalidIDs after Done). Callers with host-side ids can check
	// them first with ValidateTopK.
	TopK Tensor
	// Weights is F32 [T, TopK], optional: sent with the rows (0 where the
	// expert is on another rank).
	Weights Tensor
	// ExpertAlignment rounds each local expert's received count up to a
	// multiple of it (0 or 1: no rounding). Non-cached only.
	ExpertAlignment int
	// Handle, when given, makes a cached dispatch: the routing of the
	// dispatch that returned it is reused (no count exchange, no host
	// wait); X must have its T.
	Handle *Handle
	// WorstCase skips the host wait for the received count: outputs are
	// sized for the worst case (Buffer.MaxRecv rows, RecvTopK -1 in rows
	// past the count), the count and per-expert counts stay on the device
	// (RecvCount, TokensPerExpertDevice). No host synchronisation at all,
	// so the call can be captured into a CUDA graph. It costs a memset of
	// the received top-k region per call.
	WorstCase bool
	// Out, when given, receives a copy of the received rows (stream
	// ordered, after the dispatch), so that they outlive the next
	// dispatch. Each present tensor needs at least NumRecv rows (MaxRecv
	// in the worst case).
	Out *DispatchOutputs
	// Stream is where the work is enqueued (nil: the Buffer's stream). It
	// first waits for After, when given.
	Stream Stream
	After  *Event
	// Done, when given, is recorded after the dispatch and returned; else
	// a Done event of the Buffer's pool is, bound to this call alone (see
	// Event: Release it when no longer needed).
	Done *Event
	// Launch overrides Config.Dispatch for this call (tuning).
	Launch *LaunchConfig
}

// DispatchOutputs are caller-owned copies of the received rows; absent
// tensors are not copied.
type DispatchOutputs struct {
	X        Tensor // BF16 or FP8E4M3 [>=N, Hidden]
	Scales   Tensor // F32 [>=N, Hidden/128]
	TopK     Tensor // I64 [>=N, TopK]
	Weights  Tensor // F32 [>=N, TopK]
	SrcToken Tensor // I32 [>=N]
}

// DispatchResult is what this rank received. The Recv tensors are views
// into this rank's NVLink workspace, where the other ranks' kernels wrote
// the rows directly. A view stays valid for work ordered before the next
// Dispatch on this Buffer (in stream order on this rank: peers write into
// it again only after this rank's stream has entered the next dispatch).
//
// Rows are ordered by source rank, then by token index at the source;
// RankPrefix gives the source boundaries.
type DispatchResult struct {
	// RecvX is BF16 or FP8E4M3 [N, Hidden]; RecvScales F32 [N, Hidden/128]
	// after an FP8 dispatch.
	RecvX, RecvScales Tensor
	// RecvTopK is I64 [N, TopK]: local expert ids (global id minus
	// rank*LocalExperts), -1 for experts on other ranks; RecvWeights is
	// F32 [N, TopK] when weights were sent (0 where RecvTopK is -1).
	RecvTopK, RecvWeights Tensor
	// RecvSrcToken is I32 [N]: each row's token index at its source.
	RecvSrcToken Tensor
	// RecvCount is I32 [1] on the device: N (also in the worst case).
	RecvCount Tensor
	// RankPrefix is I32 [Ranks] on the device: rows received from sources
	// 0..s, inclusive.
	RankPrefix Tensor
	// NumRecv is N on the host, or -1 in the worst case, where the views
	// have Buffer.MaxRecv rows.
	NumRecv int
	// TokensPerExpert is the received (token, local expert) pairs per
	// local expert, rounded up to ExpertAlignment, on the host (nil in the
	// worst case and for cached dispatches of a worst-case handle);
	// TokensPerExpertDevice is the same as I32 [LocalExperts] on the
	// device after a worst-case non-cached dispatch.
	TokensPerExpert       []int
	TokensPerExpertDevice Tensor
	// Handle is the new handle (non-cached) or the one passed in. A new
	// handle lives until Handle.Release.
	Handle *Handle
	// Done is recorded after the dispatch: DispatchArgs.Done, or an event
	// bound to this call (Release it when done with it).
	Done *Event
}

// Dispatch sends every token of this rank to each rank that holds one of
// its experts, with its weights, local expert ids and FP8 scales, and
// returns what this rank received. Collective: every rank calls it, in
// the same mode (cached or not).
//
// Non-cached (Handle nil): a notify kernel exchanges the counts and builds
// a new handle, the dispatch kernel moves the rows, and unless WorstCase
// the host waits for the received count (as DeepEP does) to size the
// views. Cached (Handle given): only the dispatch kernel runs; nothing
// waits on the host.
//
// Every argument is checked before anything is launched; a bad one is an
// error wrapping ErrInvalidArgument and the Buffer stays usable. Two
// errors come with a valid result, because the collective completed on
// every rank: an *InvalidIDsError (top-k ids outside [-1, Experts), treated
// as -1) and Out tensors found too small once the received count is known.
// A failure after the launch starts (a device-side timeout naming the rank
// that never arrived, a launch error) makes the Buffer refuse calls until
// Close.
func (b *Buffer) Dispatch(ctx context.Context, a DispatchArgs) (DispatchResult, error) {
	if b == nil {
		return DispatchResult{}, errNilBuffer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	const op = "dispatch"
	if err := b.usable(ctx, op); err != nil {
		return DispatchResult{}, err
	}
	t, fp8, err := b.checkDispatch(a)
	if err != nil {
		return DispatchResult{}, err
	}
	launch, err := b.launchConfig(a.Launch, OpDispatch)
	if err != nil {
		return DispatchResult{}, err
	}
	if a.Handle == nil && !b.freeSlot() { // refused at dispatch time, not at combine time
		_, err := b.takeSlot(op, t)
		return DispatchResult{}, err
	}
	// Only a non-cached dispatch cares whether it is being captured (a
	// host wait cannot be).
	if a.Handle == nil {
		capturing, err := b.b.IsCapturing(b.stream(a.Stream))
		if err != nil {
			return DispatchResult{}, err
		}
		if capturing && !a.WorstCase {
			return DispatchResult{}, b.invalid(op, "a non-cached dispatch that waits on the host cannot be captured into a graph: set WorstCase")
		}
	}
	s, err := b.begin(ctx, op, a.Stream, a.After)
	if err != nil {
		return DispatchResult{}, err
	}
	// The last dispatch's views expire here, in stream order.
	if err := b.poisonExpired(s, &b.lastDispatch); err != nil {
		return DispatchResult{}, b.fail(op, err)
	}
	h := a.Handle
	if h == nil {
		if h, err = b.takeSlot(op, t); err != nil {
			return DispatchResult{}, err
		}
	}
	// Worst-case views: a dispatch that does not wait on the host, or a
	// cached one whose handle never did.
	worst := a.WorstCase || (a.Handle != nil && h.numRecv < 0)
	call := buffer.DispatchCall{Stream: s, Tokens: t, X: a.X.Ptr, Scales: a.Scales.Ptr, FP8: fp8,
		TopK: a.TopK.Ptr, TopKI32: a.TopK.DType == I32, Weights: a.Weights.Ptr, Slot: h.slot,
		Cached: a.Handle != nil, HostWait: a.Handle == nil && !a.WorstCase, WorstCase: worst,
		ExpertAlignment: a.ExpertAlignment, Launch: launch}
	if fp8 {
		call.ScaleStrides = scaleStrides(a.Scales)
	}
	got, err := b.b.Dispatch(ctx, call)
	if err != nil {
		if a.Handle == nil && b.b.Usable() == nil { // refused before launch: the slot is free again
			h.state.Store(handleReleased)
			b.slots[h.slot] = nil
		}
		return DispatchResult{}, err
	}
	var soft []error // the collective completed: the result is valid
	if call.HostWait {
		h.numRecv, h.tokensPerExpert = got.NumRecv, got.TokensPerExpert
		if got.InvalidIDs > 0 {
			soft = append(soft, &InvalidIDsError{Rank: b.rank, Op: "dispatch", Count: got.InvalidIDs, Experts: b.cfg.Experts})
		}
	}
	res := b.views(h, fp8, a.Weights.Present(), worst)
	if a.Handle == nil && a.WorstCase {
		res.TokensPerExpertDevice = NewTensor(b.b.RecvViews(h.slot).ExpertCounts, I32, b.LocalExperts())
	}
	b.lastDispatch = b.viewsToPoison(res.RecvX, res.RecvScales, res.RecvWeights, res.RecvTopK, res.RecvSrcToken)
	if a.Out != nil {
		if err := b.copyOut(s, res, a.Out); err != nil {
			if b.b.Usable() != nil {
				return DispatchResult{}, err
			}
			soft = append(soft, err)
		}
	}
	if res.Done, err = b.finish(op, s, a.Done); err != nil {
		return DispatchResult{}, err
	}
	return res, errors.Join(soft...)
}

// freeSlot reports whether a non-cached dispatch would find a slot.
func (b *Buffer) freeSlot() bool {
	for _, h := range b.slots {
		if h == nil {
			return true
		}
	}
	return false
}

// scaleStrides is the element strides of validated FP8 scales [T, S].
func scaleStrides(t Tensor) [2]int64 {
	if t.Strides == nil {
		return [2]int64{int64(t.Shape[1]), 1}
	}
	return [2]int64{int64(t.Strides[0]), int64(t.Strides[1])}
}

// views describes the receive region as the result's tensors.
func (b *Buffer) views(h *Handle, fp8, weights, worst bool) DispatchResult {
	v := b.b.RecvViews(h.slot)
	n := h.numRecv
	rows := n
	if n < 0 || worst {
		rows = b.MaxRecv()
	}
	k, hid := b.cfg.TopK, b.cfg.Hidden
	r := DispatchResult{
		RecvTopK:        NewTensor(v.TopK, I64, rows, k),
		RecvSrcToken:    NewTensor(v.SrcToken, I32, rows),
		RecvCount:       NewTensor(v.NumRecv, I32, 1),
		RankPrefix:      NewTensor(v.RankPrefix, I32, b.ranks),
		NumRecv:         n,
		TokensPerExpert: h.tokensPerExpert,
		Handle:          h,
	}
	if worst {
		r.NumRecv, r.TokensPerExpert = -1, nil
	}
	if fp8 {
		r.RecvX = NewTensor(v.X, FP8E4M3, rows, hid)
		r.RecvScales = NewTensor(v.Scales, F32, rows, hid/buffer.FP8Block)
	} else {
		r.RecvX = NewTensor(v.X, BF16, rows, hid)
	}
	if weights {
		r.RecvWeights = NewTensor(v.Weights, F32, rows, k)
	}
	return r
}

// checkDispatch validates a before anything is launched; it returns T and
// whether the rows are FP8.
func (b *Buffer) checkDispatch(a DispatchArgs) (t int, fp8 bool, err error) {
	const op = "dispatch"
	c := b.cfg
	if !a.X.Present() {
		return 0, false, b.invalid(op, "no x")
	}
	if len(a.X.Shape) == 2 {
		t = a.X.Shape[0]
	}
	if err := (check{"x", []DType{BF16, FP8E4M3}, []int{-1, c.Hidden}, false, 16}).validate(a.X); err != nil {
		return 0, false, b.invalid(op, "%v", err)
	}
	if t > c.MaxTokens {
		return 0, false, b.invalid(op, "%d tokens: the buffer was sized for at most %d (Config.MaxTokens)", t, c.MaxTokens)
	}
	fp8 = a.X.DType == FP8E4M3
	switch {
	case fp8 && !c.FP8:
		return 0, false, b.invalid(op, "FP8 x, but the buffer has no room for FP8 scales (Config.FP8)")
	case fp8 && !a.Scales.Present():
		return 0, false, b.invalid(op, "FP8 x needs scales, F32 [%d, %d]", t, c.Hidden/buffer.FP8Block)
	case fp8:
		if err := (check{"scales", []DType{F32}, []int{t, c.Hidden / buffer.FP8Block}, false, 4}).validateStrided(a.Scales, true); err != nil {
			return 0, false, b.invalid(op, "%v", err)
		}
	case a.Scales.Present():
		return 0, false, b.invalid(op, "scales given for BF16 x")
	}
	idsCheck := check{"top-k ids", []DType{I64, I32}, []int{t, c.TopK}, false, uintptr(max(a.TopK.DType.Size(), 1))}
	switch {
	case a.TopK.Present():
		if err := idsCheck.validate(a.TopK); err != nil {
			return 0, false, b.invalid(op, "%v", err)
		}
	case a.Handle == nil:
		return 0, false, b.invalid(op, "no top-k ids (a non-cached dispatch needs the routing)")
	}
	if a.Weights.Present() {
		if err := (check{"top-k weights", []DType{F32}, []int{t, c.TopK}, false, 4}).validate(a.Weights); err != nil {
			return 0, false, b.invalid(op, "%v", err)
		}
	}
	if a.ExpertAlignment < 0 || a.ExpertAlignment > MaxExpertAlignment {
		return 0, false, b.invalid(op, "expert alignment %d: want 0..%d", a.ExpertAlignment, MaxExpertAlignment)
	}
	if a.Handle != nil {
		if err := b.own(a.Handle, op); err != nil {
			return 0, false, err
		}
		if a.Handle.tokens != t {
			return 0, false, b.invalid(op, "x has %d tokens, the handle was built for %d", t, a.Handle.tokens)
		}
	}
	if a.Out != nil {
		rows := b.MaxRecv()
		if a.Handle != nil && a.Handle.numRecv >= 0 && !a.WorstCase {
			rows = a.Handle.numRecv
		} else if a.Handle == nil && !a.WorstCase {
			rows = 0 // known after the host wait; checked again then
		}
		if err := b.checkOut(a.Out, rows, fp8, a.Weights.Present()); err != nil {
			return 0, false, err
		}
	}
	return t, fp8, nil
}

func (b *Buffer) checkOut(o *DispatchOutputs, rows int, fp8, weights bool) error {
	const op = "dispatch"
	c := b.cfg
	xt := BF16
	if fp8 {
		xt = FP8E4M3
	}
	checks := []struct {
		t     Tensor
		c     check
		allow bool
	}{
		{o.X, check{"out x", []DType{xt}, []int{rows, c.Hidden}, true, 1}, true},
		{o.Scales, check{"out scales", []DType{F32}, []int{rows, c.Hidden / buffer.FP8Block}, true, 1}, fp8},
		{o.TopK, check{"out top-k ids", []DType{I64}, []int{rows, c.TopK}, true, 1}, true},
		{o.Weights, check{"out weights", []DType{F32}, []int{rows, c.TopK}, true, 1}, weights},
		{o.SrcToken, check{"out source tokens", []DType{I32}, []int{rows}, true, 1}, true},
	}
	for _, x := range checks {
		if !x.t.Present() {
			continue
		}
		if !x.allow {
			return b.invalid(op, "%s given, but this dispatch has none", x.c.name)
		}
		if err := x.c.validate(x.t); err != nil {
			return b.invalid(op, "%v", err)
		}
	}
	return nil
}

// copyOut copies the received rows into the caller's tensors on s.
func (b *Buffer) copyOut(s Stream, r DispatchResult, o *DispatchOutputs) error {
	const op = "dispatch"
	rows := r.RecvX.Rows()
	if err := b.checkOut(o, rows, r.RecvX.DType == FP8E4M3, r.RecvWeights.Present()); err != nil {
		// Only reachable when the count came from the host wait: the
		// collective is complete and the Buffer stays usable.
		return err
	}
	dev := b.b.Device()
	for _, p := range []struct{ dst, src Tensor }{
		{o.X, r.RecvX}, {o.Scales, r.RecvScales}, {o.TopK, r.RecvTopK}, {o.Weights, r.RecvWeights}, {o.SrcToken, r.RecvSrcToken},
	} {
		if !p.dst.Present() || p.src.Bytes() == 0 {
			continue
		}
		if err := dev.CopyAsync(p.dst.Ptr, p.src.Ptr, p.src.Bytes(), s); err != nil {
			return b.fail(op, fmt.Errorf("copy out: %w", err))
		}
	}
	return nil
}

// launchConfig resolves a per-call override against the Buffer's config.
func (b *Buffer) launchConfig(o *LaunchConfig, op Op) (LaunchConfig, error) {
	c, err := b.LaunchFor(op, o)
	if err != nil {
		return LaunchConfig{}, b.invalid(string(op), "%v", err)
	}
	return c, nil
}

// LaunchFor is the launch configuration a call of op with the override o
// (nil: none) uses: o's non-zero fields over Config's over the defaults,
// every field filled in. On a GPU that several ranks share, the defaults
// shrink to this rank's share of its SMs and an override above it is
// refused (every rank's kernels must be resident at once).
func (b *Buffer) LaunchFor(op Op, o *LaunchConfig) (LaunchConfig, error) {
	if b == nil {
		return LaunchConfig{}, errNilBuffer
	}
	return b.b.LaunchFor(op, o)
}

// MaxExpertAlignment is the largest DispatchArgs.ExpertAlignment (the
// kernels round counts up in 32 bits).
const MaxExpertAlignment = buffer.MaxExpertAlignment
