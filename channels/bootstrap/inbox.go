package bootstrap

import (
	"context"
	"sync"
	"time"
)

// qkey addresses one ordered queue: messages from one peer with one tag.
type qkey struct {
	peer int
	tag  int64
}

// inbox holds the messages that arrived but were not received yet, and what
// is known about each peer being gone. Waiters sleep on one broadcast channel
// that is replaced on every change; bootstrap traffic is light, so spurious
// wake-ups are cheaper than per-queue bookkeeping.
type inbox[T any] struct {
	mu      sync.Mutex
	queues  map[qkey][]T
	peerErr []error // non-nil once the peer is gone
	closed  error   // non-nil once the local side is closed
	changed chan struct{}
}

func newInbox[T any](size int) *inbox[T] {
	return &inbox[T]{
		queues:  make(map[qkey][]T),
		peerErr: make([]error, size),
		changed: make(chan struct{}),
	}
}

// notifyLocked wakes every waiter. Callers hold mu.
func (b *inbox[T]) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// push appends v to the (peer, tag) queue. It reports false when the local
// side is closed and v was dropped.
func (b *inbox[T]) push(peer int, tag int64, v T) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		return false
	}
	k := qkey{peer, tag}
	b.queues[k] = append(b.queues[k], v)
	b.notifyLocked()
	return true
}

// failPeer records that peer is gone. The first reason wins: later ones are
// usually consequences (a write error after the reader saw EOF).
func (b *inbox[T]) failPeer(peer int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.peerErr[peer] == nil {
		b.peerErr[peer] = err
		b.notifyLocked()
	}
}

func (b *inbox[T]) peerError(peer int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peerErr[peer]
}

// close fails all waiters with err and returns what was still queued, so
// owners of resources (file descriptors) can release them.
func (b *inbox[T]) close(err error) []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed != nil {
		return nil
	}
	b.closed = err
	var left []T
	for _, q := range b.queues {
		left = append(left, q...)
	}
	b.queues = nil
	b.notifyLocked()
	return left
}

// collect pops one message with tag from each rank in peers and hands it to put.
// It returns when all are there (nil), when one of the peers is gone (its
// *PeerClosedError; queued messages are still delivered first), when the
// inbox is closed, or when ctx is done or expired fires (errWaitInterrupted).
// missing lists, in order, the peers whose message had not arrived.
func (b *inbox[T]) collect(ctx context.Context, expired <-chan time.Time, tag int64, peers []int, put func(peer int, v T)) (missing []int, err error) {
	pending := append([]int(nil), peers...)
	for {
		b.mu.Lock()
		if b.closed != nil {
			b.mu.Unlock()
			return pending, b.closed
		}
		left := pending[:0]
		var gone error
		for _, p := range pending {
			k := qkey{p, tag}
			if q := b.queues[k]; len(q) > 0 {
				put(p, q[0])
				var zero T
				q[0] = zero // let the payload be collected once received
				if len(q) == 1 {
					delete(b.queues, k)
				} else {
					b.queues[k] = q[1:]
				}
				continue
			}
			if gone == nil && b.peerErr[p] != nil {
				gone = b.peerErr[p]
			}
			left = append(left, p)
		}
		pending = left
		wake := b.changed
		b.mu.Unlock()

		if len(pending) == 0 {
			return nil, nil
		}
		if gone != nil {
			return pending, gone
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return pending, errWaitInterrupted
		case <-expired:
			return pending, errWaitInterrupted
		}
	}
}

// errWaitInterrupted is internal: the caller turns it into a TimeoutError or
// a cancellation with waitError, which knows the operation and the deadline.
var errWaitInterrupted = &waitInterrupted{}

type waitInterrupted struct{}

func (*waitInterrupted) Error() string { return "wait interrupted" }
