package ep

import (
	"context"
	"fmt"

	"github.com/goep-dev/goep/routing"
)

// LayoutArgs are the inputs of Layout.
type LayoutArgs struct {
	// TopK is the routing, I64 or I32 [T, TopK], T <= MaxTokens; ids
	// outside [-1, Experts) are ignored and counted (Buffer.InvalidIDs).
	TopK Tensor
	// Stream (nil: the Buffer's stream), After and Done (else an event
	// bound to this call) are as in DispatchArgs.
	Stream Stream
	After  *Event
	Done   *Event
}

// LayoutResult is DeepEP's get_dispatch_layout: views into the Buffer,
// valid until the next Layout. Dispatch does not need them (its notify
// kernel counts from the routing itself); they are for the engine.
type LayoutResult struct {
	TokensPerRank   Tensor // I32 [Ranks]: tokens with at least one expert on each rank
	TokensPerExpert Tensor // I32 [Experts]: top-k entries naming each expert
	IsTokenInRank   Tensor // U8 [T, Ranks]: 1 when the token goes to the rank (torch.bool)
	Done            *Event
}

// Layout runs the dispatch-layout kernel on this rank's routing. Local (no
// other rank takes part), no host synchronisation: it can be captured. A
// ctx that has already ended is refused before anything is enqueued.
//
// Changed in this version: Layout takes a ctx (every blocking call does).
func (b *Buffer) Layout(ctx context.Context, a LayoutArgs) (LayoutResult, error) {
	if b == nil {
		return LayoutResult{}, errNilBuffer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	const op = "layout"
	if err := b.usable(ctx, op); err != nil {
		return LayoutResult{}, err
	}
	c := b.cfg
	if !a.TopK.Present() {
		return LayoutResult{}, b.invalid(op, "no top-k ids")
	}
	t := a.TopK.Rows()
	if err := (check{"top-k ids", []DType{I64, I32}, []int{-1, c.TopK}, false, uintptr(max(a.TopK.DType.Size(), 1))}).validate(a.TopK); err != nil {
		return LayoutResult{}, b.invalid(op, "%v", err)
	}
	if t > c.MaxTokens {
		return LayoutResult{}, b.invalid(op, "%d tokens: the buffer was sized for at most %d (Config.MaxTokens)", t, c.MaxTokens)
	}
	s, err := b.begin(ctx, op, a.Stream, a.After)
	if err != nil {
		return LayoutResult{}, err
	}
	// The last layout's outputs expire here, in stream order.
	if err := b.poisonExpired(s, &b.lastLayout); err != nil {
		return LayoutResult{}, b.fail(op, err)
	}
	out, err := b.b.Layout(s, a.TopK.Ptr, a.TopK.DType == I32, t, c.Layout)
	if err != nil {
		return LayoutResult{}, err
	}
	res := LayoutResult{
		TokensPerRank:   NewTensor(out.TokensPerRank, I32, b.ranks),
		TokensPerExpert: NewTensor(out.TokensPerExpert, I32, c.Experts),
		IsTokenInRank:   NewTensor(out.IsTokenInRank, U8, t, b.ranks),
	}
	b.lastLayout = b.viewsToPoison(res.TokensPerRank, res.TokensPerExpert, res.IsTokenInRank)
	if res.Done, err = b.finish(op, s, a.Done); err != nil {
		return LayoutResult{}, err
	}
	return res, nil
}

// ValidateTopK checks host-side top-k ids (int32 or int64, [tokens, topk]
// row-major) against a Config's shape before they are uploaded: the error
// names the first bad token and slot. The kernels cannot report bad ids
// before they run; callers that have the ids on the host can.
func ValidateTopK[I routing.Index](ids []I, c Config, ranks int) error {
	if c.TopK < 1 || len(ids)%c.TopK != 0 {
		return fmt.Errorf("ep: %d top-k ids for top-%d", len(ids), c.TopK)
	}
	s := routing.Shape{Tokens: len(ids) / c.TopK, K: c.TopK, Experts: c.Experts, Ranks: ranks}
	if err := routing.ValidateIndices(ids, s); err != nil {
		return fmt.Errorf("ep: %w", err)
	}
	return nil
}
