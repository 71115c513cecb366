package ep

import (
	"fmt"
)

// Handle is what a non-cached dispatch learns about its routing (each
// token's position at every destination, where every source's rows start,
// how many rows arrive) and what cached dispatches and combines reuse. Its
// device memory is one of the Buffer's handle slots; it holds a copy of the
// routing, so a cached dispatch needs only x.
//
// A handle stays valid until Config.Handles later non-cached dispatches of
// its Buffer have taken every other slot and then its own (least recently
// used first; pinned handles are never taken), until Release, or until the
// Buffer closes; an expired handle is refused (ErrExpiredHandle), never
// silently misused. A handle from another Buffer is refused
// (ErrForeignHandle). A dispatch that takes a slot rewrites it in its own
// stream's order: with several streams on one Buffer, work that still uses
// the slot's old handle must have completed first (or Pin the handle).
// Handles of one Buffer are used by one goroutine at a time, like the
// Buffer.
type Handle struct {
	buf             *Buffer
	slot            int
	tokens          int
	numRecv         int // -1: not read on the host (worst case)
	tokensPerExpert []int
	expired         bool
}

// Tokens is the number of tokens this rank dispatched.
func (h *Handle) Tokens() int { return h.tokens }

// NumRecv is the number of rows this rank received, or -1 when the
// dispatch did not wait on the host (worst case): the count is then on the
// device (DispatchResult.RecvCount).
func (h *Handle) NumRecv() int { return h.numRecv }

// TokensPerExpert is the received (token, local expert) pairs per local
// expert, rounded up to the expert alignment (nil in the worst case).
func (h *Handle) TokensPerExpert() []int { return h.tokensPerExpert }

// Pin keeps the handle's slot from being taken by later dispatches (a
// handle used by a captured graph must stay pinned while the graph may be
// replayed; a non-cached dispatch captured into a graph pins its handle
// itself). Release unpins.
func (h *Handle) Pin() error {
	h.buf.mu.Lock()
	defer h.buf.mu.Unlock()
	if err := h.buf.own(h, "pin"); err != nil {
		return err
	}
	h.buf.slots[h.slot].pinned = true
	return nil
}

// Release frees the handle's slot now; the handle expires.
func (h *Handle) Release() {
	h.buf.mu.Lock()
	defer h.buf.mu.Unlock()
	if h.expired {
		return
	}
	h.expired = true
	h.buf.slots[h.slot] = slotState{}
}

// own checks that h is a live handle of b.
func (b *Buffer) own(h *Handle, op string) error {
	switch {
	case h == nil:
		return b.invalid(op, "no handle")
	case h.buf != b:
		return &argError{fmt.Errorf("ep: rank %d: %s: %w (handle of rank %d's buffer %p, this is %p)", b.rank, op, ErrForeignHandle, h.buf.rank, h.buf, b)}
	case h.expired || b.slots[h.slot].owner != h:
		return &argError{fmt.Errorf("ep: rank %d: %s: %w: its slot was taken by a later dispatch or it was released (Config.Handles is %d; Pin handles kept long)",
			b.rank, op, ErrExpiredHandle, len(b.slots))}
	}
	b.tick++
	b.slots[h.slot].used = b.tick
	return nil
}

// takeSlot gives a new handle a slot: a free one, else the least recently
// used unpinned one, whose handle expires.
func (b *Buffer) takeSlot(op string, tokens int, pin bool) (*Handle, error) {
	best := -1
	for i, s := range b.slots {
		if s.owner == nil {
			best = i
			break
		}
		if !s.pinned && (best < 0 || s.used < b.slots[best].used) {
			best = i
		}
	}
	if best < 0 {
		return nil, b.invalid(op, "all %d handle slots hold pinned handles (Release some, or raise Config.Handles)", len(b.slots))
	}
	if old := b.slots[best].owner; old != nil {
		old.expired = true
	}
	b.tick++
	h := &Handle{buf: b, slot: best, tokens: tokens, numRecv: -1}
	b.slots[best] = slotState{owner: h, used: b.tick, pinned: pin}
	return h, nil
}
