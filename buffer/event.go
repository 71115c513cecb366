package buffer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// Event is a point in a stream that other streams (the engine's) can wait
// for: a CUevent on the CUDA backend (created without timing, the cheap
// kind), nothing on the host backend, whose streams run work as it is
// issued. Handle gives engines the CUevent to wait on with their own CUDA
// bindings (cudaStreamWaitEvent takes it as a cudaEvent_t); Record and Wait
// do the same from Go.
//
// Three kinds: NewEvent's (owned by the Buffer, closed with it), WrapEvent's
// (the engine's CUevent), and a call's Done event (CallEvent: from the
// Buffer's pool, bound to that one call). A Done event is never recorded
// again by another call: it goes back to the pool when the engine Releases
// it, or, when the engine keeps more than the pool holds, the oldest one
// still held is recycled (the pool is a bounded ring). A recycled event is
// detected: its methods return ErrEventRecycled and Handle returns 0.
//
// Record, Wait and Synchronize may be called from any goroutine, but the
// event holds one recorded point at a time: a Record replaces it. All
// methods are safe on a nil *Event (an error, or 0 from Handle) and after
// Close (an error).
type Event struct {
	ctx *cuda.Context // nil on the host backend

	mu       sync.Mutex
	ev       *cuda.Event // nil on the host backend and once recycled or closed
	pool     *eventPool  // the pool a Done event came from (nil otherwise)
	closed   bool
	recycled bool // the pool gave the CUevent to a later call
	released bool
}

// Errors of events.
var (
	// ErrEventRecycled: a call's Done event that the pool gave to a later
	// call because the engine held more Done events than the pool has
	// (Config.Events) without releasing them.
	ErrEventRecycled = errors.New("done event recycled: the engine held more unreleased Done events than Config.Events")
	// ErrEventReleased: a Done event used after Release.
	ErrEventReleased = errors.New("done event used after Release")
	errEventClosed   = errors.New("event is closed")
)

func newEvent(ctx *cuda.Context) (*Event, error) {
	e := &Event{ctx: ctx}
	if ctx == nil {
		return e, nil
	}
	ev, err := cuda.NewEvent(ctx, cuda.EventDisableTiming)
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	e.ev = ev
	return e, nil
}

// WrapEvent makes an engine's own CUevent (a cudaEvent_t of dev's context)
// usable as an Event: Wait makes a stream wait on it with cuStreamWaitEvent
// (no host block), Record and Synchronize work on it too. The Event does not
// own the CUevent: Close does not destroy it, and the engine must keep it
// alive while work that waits on it is being enqueued. It belongs to no
// Buffer. On the host backend, whose streams run work as it is issued, it is
// a marker that orders nothing and handle is ignored.
func WrapEvent(dev device.Device, handle uintptr) (*Event, error) {
	if dev == nil {
		return nil, errors.New("buffer: WrapEvent needs a device")
	}
	ctx := cudaContext(dev)
	if ctx == nil {
		if dev.Info().Kind == device.CUDA {
			return nil, errors.New("buffer: WrapEvent: a CUDA device must have Context() (a wrapping Device must forward it)")
		}
		return &Event{}, nil
	}
	if handle == 0 {
		return nil, errors.New("buffer: WrapEvent: null CUevent")
	}
	return &Event{ctx: ctx, ev: cuda.WrapEvent(ctx, handle)}, nil
}

// Handle is the CUevent (0 on the host backend, for a nil event, and once
// the event is closed, released or recycled).
func (e *Event) Handle() uintptr {
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil || e.closed || e.recycled || e.released {
		return 0
	}
	return e.ev.Handle()
}

// stream wraps a device.Stream for the driver (nil: the legacy stream).
func (e *Event) stream(s device.Stream) *cuda.Stream {
	var h uintptr
	if s != nil {
		h = s.Handle()
	}
	return cuda.WrapStream(e.ctx, h)
}

// lock takes e.mu and reports why e may not be used (nil: usable; e.ev
// then stays valid until unlock, as Close and recycling take e.mu too).
func (e *Event) lock() error {
	if e == nil {
		return errors.New("nil event")
	}
	e.mu.Lock()
	switch {
	case e.closed:
		return errEventClosed
	case e.recycled:
		return ErrEventRecycled
	case e.released:
		return ErrEventReleased
	}
	return nil
}

// Record makes the event mark the work issued on s so far.
func (e *Event) Record(s device.Stream) error {
	err := e.lock()
	if e == nil {
		return err
	}
	defer e.mu.Unlock()
	if err != nil || e.ev == nil {
		return err
	}
	if err := e.ev.Record(e.stream(s)); err != nil {
		return fmt.Errorf("event record: %w", err)
	}
	return nil
}

// Wait makes work issued on s from now on wait for the event's recorded
// point (it does not block the host). Waiting on an event never recorded
// waits for nothing.
func (e *Event) Wait(s device.Stream) error {
	err := e.lock()
	if e == nil {
		return err
	}
	defer e.mu.Unlock()
	if err != nil || e.ev == nil {
		return err
	}
	if err := e.stream(s).WaitEvent(e.ev); err != nil {
		return fmt.Errorf("event wait: %w", err)
	}
	return nil
}

// Synchronize blocks the calling goroutine until the recorded work is done.
func (e *Event) Synchronize() error { return e.SynchronizeContext(context.Background()) }

// SynchronizeContext blocks until the recorded work is done or ctx ends
// (then it returns ctx's error, wrapping channels.ErrTimeout on a
// deadline). It polls the event, so a cancelled ctx is honoured within
// tens of microseconds; the recorded work itself is not cancelled.
func (e *Event) SynchronizeContext(ctx context.Context) error {
	if ctx == nil {
		return errors.New("event synchronize: nil context")
	}
	start := time.Now()
	for {
		done, err := e.query()
		if err != nil || done {
			return err
		}
		if err := ctx.Err(); err != nil {
			return ctxError("event synchronize", err)
		}
		if time.Since(start) < busyPoll {
			time.Sleep(0)
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// query reports whether the recorded work is done (always on the host).
func (e *Event) query() (bool, error) {
	err := e.lock()
	if e == nil {
		return false, err
	}
	defer e.mu.Unlock()
	if err != nil {
		return false, err
	}
	if e.ev == nil {
		return true, nil
	}
	return e.ev.Query()
}

// Release gives a call's Done event back to its Buffer's pool: the engine
// no longer waits on it, and a later call may record its CUevent. Later
// uses of e fail with ErrEventReleased. Releasing an event that is not a
// Done event (NewEvent's, WrapEvent's), a nil one, or one released,
// recycled or closed already does nothing.
func (e *Event) Release() {
	if e == nil {
		return
	}
	e.mu.Lock()
	p := e.pool
	ok := p != nil && !e.closed && !e.recycled && !e.released
	if ok {
		e.released = true
	}
	ev := e.ev
	e.mu.Unlock()
	if ok {
		p.put(e, ev)
	}
}

// Close destroys the event (a wrapped one's CUevent stays its owner's; a
// Done event goes back to its pool); later calls fail. Closing twice, or a
// nil event, is a no-op.
func (e *Event) Close() error {
	if e == nil {
		return nil
	}
	if e.pool != nil {
		e.Release()
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	ev := e.ev
	e.ev = nil
	if ev == nil {
		return nil
	}
	return ev.Destroy()
}

// DefaultEvents is the size of a Buffer's pool of Done events when
// Config.Events is 0.
const DefaultEvents = 64

// eventPool holds a Buffer's Done events: CUevents made once in New (none
// on the host backend), handed to one call each. A call takes a free one;
// when none is free the ring wraps and the oldest held one is recycled.
type eventPool struct {
	ctx *cuda.Context

	mu     sync.Mutex
	free   []*cuda.Event // nil entries on the host backend
	held   []*Event      // handed out, oldest first
	all    []*cuda.Event // every CUevent, destroyed at close
	wraps  uint64        // events recycled while held
	closed bool
}

func newEventPool(ctx *cuda.Context, n int) (*eventPool, error) {
	p := &eventPool{ctx: ctx}
	for i := 0; i < n; i++ {
		var ev *cuda.Event
		if ctx != nil {
			var err error
			if ev, err = cuda.NewEvent(ctx, cuda.EventDisableTiming); err != nil {
				return p, fmt.Errorf("done event %d of %d: %w", i, n, err)
			}
			p.all = append(p.all, ev)
		}
		p.free = append(p.free, ev)
	}
	return p, nil
}

// get hands a CUevent to a new call's Event: a free one, else the oldest
// held one, whose Event is marked recycled.
func (p *eventPool) get() (*Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errEventClosed
	}
	var ev *cuda.Event
	switch {
	case len(p.free) > 0:
		ev = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	case len(p.held) > 0:
		old := p.held[0]
		p.held = p.held[1:]
		old.mu.Lock()
		ev, old.ev, old.recycled = old.ev, nil, true
		old.mu.Unlock()
		p.wraps++
	default:
		return nil, errors.New("the Done event pool is empty")
	}
	e := &Event{ctx: p.ctx, ev: ev, pool: p}
	p.held = append(p.held, e)
	return e, nil
}

// put takes back a released Event's CUevent.
func (p *eventPool) put(e *Event, ev *cuda.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for i, h := range p.held {
		if h == e {
			p.held = append(p.held[:i], p.held[i+1:]...)
			e.mu.Lock()
			e.ev = nil
			e.mu.Unlock()
			p.free = append(p.free, ev)
			return
		}
	}
}

// stats is how many Done events are held and how often the ring wrapped.
func (p *eventPool) stats() (held, size int, wraps uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held), len(p.held) + len(p.free), p.wraps
}

// close marks every held Event closed and destroys the CUevents.
func (p *eventPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, e := range p.held {
		e.mu.Lock()
		e.closed, e.ev = true, nil
		e.mu.Unlock()
	}
	p.held, p.free = nil, nil
	var errs []error
	for _, ev := range p.all {
		errs = append(errs, ev.Destroy())
	}
	p.all = nil
	return errors.Join(errs...)
}
