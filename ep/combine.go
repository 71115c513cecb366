package ep

import (
	"context"

	"github.com/goep-dev/goep/buffer"
)

// CombineArgs are the inputs of Combine.
type CombineArgs struct {
	// X is BF16 [N, Hidden]: one row per row this rank received in the
	// dispatch that built Handle, in the same order; at least N rows
	// (Buffer.MaxRecv when the handle's N is not known on the host);
	// 16-byte aligned. Combine does not weight rows: multiply by the top-k
	// weights beforehand.
	//
	// The ranks that own the tokens read X over NVLink, so it is fastest
	// in this rank's workspace: the CombineInput view (write the experts'
	// outputs there) or DispatchResult.RecvX itself. Any other X is first
	// copied there on the stream (N rows; when N is not known on the host,
	// by a small kernel that reads it on the device).
	X Tensor
	// Handle is the handle of that dispatch (required).
	Handle *Handle
	// Weights is F32 [N, TopK], optional; if one rank passes weights, every
	// rank must. Their sums per token come back in the result. The same
	// placement applies (CombineInput, DispatchResult.RecvWeights, or a
	// copy).
	Weights Tensor
	// Bias are BF16 [T, Hidden], optional, added after the sum over ranks.
	Bias [2]Tensor
	// Out is BF16 [T, Hidden] for the combined tokens, optional (else a
	// view into the Buffer, valid until the next Combine); OutWeights is
	// F32 [T, TopK], optional likewise (with Weights).
	Out, OutWeights Tensor
	// Stream (nil: the Buffer's stream), After, Done (else an event bound
	// to this call) and Launch are as in DispatchArgs.
	Stream Stream
	After  *Event
	Done   *Event
	Launch *LaunchConfig
}

// CombineResult is this rank's tokens, combined.
type CombineResult struct {
	// X is BF16 [T, Hidden]: every token summed in fp32 over the ranks it
	// went to (ascending rank order), plus the biases, rounded to nearest
	// even.
	X Tensor
	// Weights is F32 [T, TopK]: the sum of the weights the ranks sent back
	// (when Weights were given).
	Weights Tensor
	Done    *Event
}

// CombineInput returns this rank's combine input region as X (BF16 [N,
// Hidden]) and Weights (F32 [N, TopK]) for the handle's N (Buffer.MaxRecv
// when N is not known on the host): an engine that writes its experts'
// outputs there lets Combine read them in place, with no staging copy. The
// region is free to write once this rank's previous Combine has completed
// on its stream (the other ranks have read it by then), and must not be
// written again until the Combine that reads it has.
func (b *Buffer) CombineInput(h *Handle) (x, weights Tensor, err error) {
	if b == nil {
		return Tensor{}, Tensor{}, errNilBuffer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.b.Usable(); err != nil {
		return Tensor{}, Tensor{}, err
	}
	if err := b.own(h, "combine input"); err != nil {
		return Tensor{}, Tensor{}, err
	}
	rows := h.numRecv
	if rows < 0 {
		rows = b.MaxRecv()
	}
	px, pw := b.b.CombineInput()
	return NewTensor(px, BF16, rows, b.cfg.Hidden), NewTensor(pw, F32, rows, b.cfg.TopK), nil
}

// Combine is the reverse of the handle's dispatch: every token's owner
// reads the rows the ranks it went to computed for it (over NVLink, from
// their combine inputs) and sums them in fp32. Collective. It never waits on the host, so it can be captured into a CUDA
// graph. Arguments are checked before any launch, as in Dispatch; a ctx
// that has already ended is refused before anything is enqueued.
func (b *Buffer) Combine(ctx context.Context, a CombineArgs) (CombineResult, error) {
	if b == nil {
		return CombineResult{}, errNilBuffer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	const op = "combine"
	if err := b.usable(ctx, op); err != nil {
		return CombineResult{}, err
	}
	c := b.cfg
	if err := b.own(a.Handle, op); err != nil {
		return CombineResult{}, err
	}
	h := a.Handle
	t, n := h.tokens, h.numRecv
	if n < 0 {
		n = b.MaxRecv()
	}
	if !a.X.Present() {
		return CombineResult{}, b.invalid(op, "no x")
	}
	if err := (check{"x", []DType{BF16}, []int{n, c.Hidden}, true, 16}).validate(a.X); err != nil {
		return CombineResult{}, b.invalid(op, "%v", err)
	}
	if a.Weights.Present() {
		if err := (check{"weights", []DType{F32}, []int{n, c.TopK}, true, 4}).validate(a.Weights); err != nil {
			return CombineResult{}, b.invalid(op, "%v", err)
		}
	}
	for i, bias := range a.Bias {
		if bias.Present() {
			if err := (check{[]string{"bias 0", "bias 1"}[i], []DType{BF16}, []int{t, c.Hidden}, false, 16}).validate(bias); err != nil {
				return CombineResult{}, b.invalid(op, "%v", err)
			}
		}
	}
	outX, outW := b.b.CombineOutputs()
	res := CombineResult{X: NewTensor(outX, BF16, t, c.Hidden)}
	if a.Out.Present() {
		if err := (check{"out", []DType{BF16}, []int{t, c.Hidden}, false, 16}).validate(a.Out); err != nil {
			return CombineResult{}, b.invalid(op, "%v", err)
		}
		res.X = a.Out
	}
	switch {
	case a.OutWeights.Present() && !a.Weights.Present():
		return CombineResult{}, b.invalid(op, "out weights given, but no weights to combine")
	case a.OutWeights.Present():
		if err := (check{"out weights", []DType{F32}, []int{t, c.TopK}, false, 4}).validate(a.OutWeights); err != nil {
			return CombineResult{}, b.invalid(op, "%v", err)
		}
		res.Weights = a.OutWeights
	case a.Weights.Present():
		res.Weights = NewTensor(outW, F32, t, c.TopK)
	}
	launch, err := b.launchConfig(a.Launch, OpCombine)
	if err != nil {
		return CombineResult{}, err
	}
	s, err := b.begin(ctx, op, a.Stream, a.After)
	if err != nil {
		return CombineResult{}, err
	}
	// The last combine's default output expires here, in stream order.
	if err := b.poisonExpired(s, &b.lastCombine); err != nil {
		return CombineResult{}, b.fail(op, err)
	}
	call := buffer.CombineCall{Stream: s, Slot: h.slot, Tokens: t, Rows: max(h.numRecv, 0), X: a.X.Ptr,
		Weights: a.Weights.Ptr, Bias0: a.Bias[0].Ptr, Bias1: a.Bias[1].Ptr, Out: res.X.Ptr, OutWeights: res.Weights.Ptr,
		Launch: launch}
	if err := b.b.Combine(call); err != nil {
		return CombineResult{}, err
	}
	if !a.Out.Present() {
		b.lastCombine = b.viewsToPoison(res.X)
	}
	if !a.OutWeights.Present() {
		b.lastCombine = append(b.lastCombine, b.viewsToPoison(res.Weights)...)
	}
	if res.Done, err = b.finish(op, s, a.Done); err != nil {
		return CombineResult{}, err
	}
	return res, nil
}
