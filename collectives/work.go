package collectives

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// Work is the handle of one collective call. The call's GPU work was
// enqueued on the caller's stream; Work lets other streams wait for it on
// the GPU (Wait), lets the host poll it (Done) and reports a failure (Err):
// a device-side wait that timed out, naming the rank it waited on, or an
// NCCL error.
//
// A call captured into a CUDA graph runs only when the graph is launched:
// its Work is Captured, Done reports true at once, and Wait (during the
// same capture) joins another capturing stream to it.
type Work struct {
	c        *Communicator
	kind     Kind
	algo     string
	stream   device.Stream
	ev       *pooledEvent
	gen      uint64
	captured bool
	done     bool
	err      error // an error found while issuing (none today: calls fail instead)
}

// Algorithm is the algorithm that ran the call ("ll", "scratch", "nccl"...).
func (w *Work) Algorithm() string {
	if w == nil {
		return ""
	}
	return w.algo
}

// Kind is the collective.
func (w *Work) Kind() Kind {
	if w == nil {
		return 0
	}
	return w.kind
}

// Captured reports whether the call was captured into a CUDA graph.
func (w *Work) Captured() bool { return w != nil && w.captured }

// closedLocked reports whether the communicator of w has been closed (its
// events destroyed: nothing of w may be touched then). The caller holds
// the communicator's lock.
func (w *Work) closedLocked() bool { return w.c.closed }

// Wait makes future work on s wait, on the GPU, for the call (the host does
// not block). s may be any stream of this rank's device.
func (w *Work) Wait(s device.Stream) error {
	if w == nil || w.c == nil {
		return ErrNil
	}
	g := w.c.gpu
	if g == nil || w.done {
		return nil
	}
	if s == nil {
		s = w.c.dev.DefaultStream()
	}
	if s.Handle() == w.stream.Handle() {
		return nil // the same stream is ordered already
	}
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if w.closedLocked() {
		return w.c.errorf("work wait: %w", ErrClosed)
	}
	target := g.stream(s)
	if !w.captured && w.ev.gen == w.gen {
		if err := target.WaitEvent(w.ev.ev); err != nil {
			return w.c.errorf("work wait: %w", err)
		}
		return nil
	}
	// Captured, or the event was reused for a later call: mark the call's
	// stream now (at or after the call) and wait for that.
	ev, err := cuda.NewEvent(g.ctx, cuda.EventDisableTiming)
	if err != nil {
		return w.c.errorf("work wait: %w", err)
	}
	defer ev.Destroy()
	if err := ev.Record(g.stream(w.stream)); err != nil {
		return w.c.errorf("work wait: %w", err)
	}
	if err := target.WaitEvent(ev); err != nil {
		return w.c.errorf("work wait: %w", err)
	}
	return nil
}

// Done reports whether the call has completed on the GPU (without
// blocking). A call that failed is done; see Err.
func (w *Work) Done() bool {
	if w == nil || w.c == nil || w.done || w.c.gpu == nil || w.captured {
		return true
	}
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if w.closedLocked() {
		// Close waited for every stream first: the call has completed.
		w.done = true
		return true
	}
	var ok bool
	var err error
	if w.ev.gen == w.gen {
		ok, err = w.ev.ev.Query()
	} else {
		// The event now marks a later call; the call's stream being idle
		// means the call is done (a conservative answer).
		ok, err = w.c.gpu.stream(w.stream).Query()
	}
	if err != nil {
		w.err = w.c.errorf("%s: %w", w.kind, err)
		w.done = true
		return true
	}
	w.done = ok
	return ok
}

// Err reports a failure: a device-side wait of the communicator that timed
// out (the error names the collective's peer that never arrived and the
// stage), an NCCL error, or a driver error while polling. nil otherwise,
// also while the call is still running.
func (w *Work) Err() error {
	if w == nil || w.c == nil {
		return ErrNil
	}
	if w.err != nil {
		return w.err
	}
	if err := w.c.Check(); err != nil {
		return err
	}
	return nil
}

// Sync blocks the calling goroutine until the call is done (polling), then
// returns Err. It gives up when ctx ends. Meant for tests and tools; engines
// use Wait.
func (w *Work) Sync(ctx context.Context) error {
	if w == nil || w.c == nil {
		return ErrNil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	for i := 0; !w.Done(); i++ {
		if err := w.Err(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return w.c.errorf("%s (%s): waiting for the call: %w", w.kind, w.algo, err)
		}
		if i > 100 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return w.Err()
}

// ---------------------------------------------------------------------------
// Events behind Work handles: a ring reused round-robin, so a call records
// one event and creates none. An event is reused after the ring has gone
// round; a Work whose event was reused answers from its stream instead
// (conservatively), see Done and Wait.

type pooledEvent struct {
	ev  *cuda.Event
	gen uint64 // recordings so far
}

type eventPool struct {
	g    *gpuState
	ring []*pooledEvent
	next int
	// window, when not 0, bounds the calls this rank has in flight: before
	// recording call n, call n-window must have finished. Set when ranks share
	// a GPU: their streams share the GPU's hardware queues, and a rank that
	// queues hundreds of calls ahead can fill a queue with kernels waiting for
	// a peer whose own launch then cannot be queued (seen: 8 ranks on one GPU,
	// 1000 back-to-back LL allreduces stalled at call 341 every run).
	window int
	calls  uint64
}

// sharedGPUWindow is eventPool.window for ranks sharing a GPU.
const sharedGPUWindow = 32

func newEventPool(g *gpuState, n int) (*eventPool, error) {
	p := &eventPool{g: g}
	if g == nil {
		return p, nil
	}
	for i := 0; i < n; i++ {
		ev, err := cuda.NewEvent(g.ctx, cuda.EventDisableTiming)
		if err != nil {
			return nil, errors.Join(err, p.close())
		}
		p.ring = append(p.ring, &pooledEvent{ev: ev})
	}
	return p, nil
}

// record records the next event of the ring on s (the caller holds the
// communicator's lock).
func (p *eventPool) record(s device.Stream) (*pooledEvent, uint64, error) {
	if p.g == nil {
		return nil, 0, nil
	}
	if w := min(p.window, len(p.ring)); w > 0 && p.calls >= uint64(w) {
		// Device waits are bounded by the watchdog, so this ends.
		if err := p.ring[(p.next+len(p.ring)-w)%len(p.ring)].ev.Synchronize(); err != nil {
			return nil, 0, fmt.Errorf("waiting for the call %d before: %w", w, err)
		}
	}
	p.calls++
	e := p.ring[p.next]
	p.next = (p.next + 1) % len(p.ring)
	if err := e.ev.Record(p.g.stream(s)); err != nil {
		return nil, 0, err
	}
	e.gen++
	return e, e.gen, nil
}

func (p *eventPool) close() error {
	var errs []error
	for _, e := range p.ring {
		if err := e.ev.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	p.ring = nil
	return errors.Join(errs...)
}
