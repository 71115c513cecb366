package ep

import (
	"fmt"
	"sync/atomic"
)

// Handle is what a non-cached dispatch learns about its routing (each
// token's position at every destination, where every source's rows start,
// how many rows arrive) and what cached dispatches and combines reuse. Its
// device memory is one of the Buffer's handle slots (Bytes; Config.Handles
// of them); it holds a copy of the routing, so a cached dispatch needs only
// x.
//
// Lifetime: a handle lives until Release, or until its Buffer closes;
// nothing else ends it. A non-cached dispatch takes a free slot, and when
// every slot holds a live handle it is refused before anything is launched
// (ErrNoHandleSlot, wrapping ErrInvalidArgument: the Buffer stays usable),
// so running out shows at dispatch time, never at combine time. Release
// the handle once its last cached dispatch and combine are issued: the
// next dispatch that takes the slot rewrites it in its own stream's order,
// so with several streams on one Buffer, work that still uses a released
// handle must have completed first. A released handle, or one of a closed
// Buffer, is refused (ErrExpiredHandle); a handle from another Buffer is
// refused (ErrForeignHandle). Handles of one Buffer are used by one
// goroutine at a time, like the Buffer; the accessors may be read from any
// goroutine, and every method is safe on a nil *Handle.
//
// Changed in this version: handles no longer expire when later dispatches
// need their slot (least recently used); Pin is a no-op kept for source
// compatibility.
type Handle struct {
	buf             *Buffer
	slot            int
	tokens          int
	numRecv         int // -1: not read on the host (worst case)
	tokensPerExpert []int
	state           atomic.Int32
}

// Handle states.
const (
	handleLive int32 = iota
	handleReleased
	handleClosed
)

// Tokens is the number of tokens this rank dispatched (0 for nil).
func (h *Handle) Tokens() int {
	if h == nil {
		return 0
	}
	return h.tokens
}

// NumRecv is the number of rows this rank received, or -1 when the
// dispatch did not wait on the host (worst case; also for nil): the count
// is then on the device (DispatchResult.RecvCount).
func (h *Handle) NumRecv() int {
	if h == nil {
		return -1
	}
	return h.numRecv
}

// TokensPerExpert is the received (token, local expert) pairs per local
// expert, rounded up to the expert alignment (nil in the worst case).
func (h *Handle) TokensPerExpert() []int {
	if h == nil {
		return nil
	}
	return h.tokensPerExpert
}

// Live reports whether the handle may be used: not released, and its
// Buffer not closed.
func (h *Handle) Live() bool { return h != nil && h.state.Load() == handleLive }

// Bytes is the device memory the handle holds while it lives: one handle
// slot (send positions, prefixes, counts and a copy of the routing,
// SizeHint.HandleSlot), 0 once released.
func (h *Handle) Bytes() int {
	if !h.Live() || h.buf == nil {
		return 0
	}
	return h.buf.b.SizeHint().HandleSlot
}

// Pin checks that the handle is live. Handles no longer expire by use, so
// there is nothing to pin; it is kept for source compatibility.
//
// Deprecated: a handle lives until Release.
func (h *Handle) Pin() error {
	if h == nil || h.buf == nil { // nil, or not made by a dispatch
		return &argError{fmt.Errorf("ep: pin: no handle")}
	}
	h.buf.mu.Lock()
	defer h.buf.mu.Unlock()
	return h.buf.own(h, "pin")
}

// Release frees the handle's slot now; the handle expires (later uses are
// refused with ErrExpiredHandle). Releasing twice, a nil handle, or one of
// a closed Buffer does nothing.
func (h *Handle) Release() {
	if h == nil || h.buf == nil {
		return
	}
	h.buf.mu.Lock()
	defer h.buf.mu.Unlock()
	if !h.state.CompareAndSwap(handleLive, handleReleased) {
		return
	}
	if h.buf.slots[h.slot] == h {
		h.buf.slots[h.slot] = nil
	}
}

// own checks that h is a live handle of b (b.mu held).
func (b *Buffer) own(h *Handle, op string) error {
	switch {
	case h == nil:
		return b.invalid(op, "no handle")
	case h.buf != b:
		return &argError{fmt.Errorf("ep: rank %d: %s: %w (handle of rank %d's buffer %p, this is %p)", b.rank, op, ErrForeignHandle, h.buf.rank, h.buf, b)}
	case h.state.Load() == handleClosed:
		return &argError{fmt.Errorf("ep: rank %d: %s: %w: its Buffer was closed", b.rank, op, ErrExpiredHandle)}
	case h.state.Load() != handleLive || b.slots[h.slot] != h:
		return &argError{fmt.Errorf("ep: rank %d: %s: %w: it was released", b.rank, op, ErrExpiredHandle)}
	}
	return nil
}

// Handles reports the handles alive on this Buffer, the slots there are
// (Config.Handles), and the device memory the live ones hold.
func (b *Buffer) Handles() (live, slots int, bytes int64) {
	if b == nil {
		return 0, 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.slots {
		if h != nil {
			live++
		}
	}
	return live, len(b.slots), int64(live) * int64(b.b.SizeHint().HandleSlot)
}

// takeSlot gives a new handle a free slot; when every slot holds a live
// handle the dispatch is refused, before anything is launched.
func (b *Buffer) takeSlot(op string, tokens int) (*Handle, error) {
	for i, s := range b.slots {
		if s == nil {
			h := &Handle{buf: b, slot: i, tokens: tokens, numRecv: -1}
			b.slots[i] = h
			return h, nil
		}
	}
	return nil, &argError{fmt.Errorf("ep: rank %d: %s: %w: all %d slots hold live handles (%d bytes each): Release the handles whose combines are issued, or raise Config.Handles",
		b.rank, op, ErrNoHandleSlot, len(b.slots), b.b.SizeHint().HandleSlot)}
}
