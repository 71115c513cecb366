package buffer

import (
	"errors"
	"fmt"
	"sync"

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
// Record, Wait and Synchronize may be called from any goroutine, but the
// event holds one recorded point at a time: a Record replaces it.
type Event struct {
	ctx *cuda.Context // nil on the host backend
	ev  *cuda.Event

	mu     sync.Mutex
	closed bool
}

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

// Handle is the CUevent (0 on the host backend).
func (e *Event) Handle() uintptr {
	if e == nil || e.ev == nil {
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

var errEventClosed = errors.New("event is closed")

func (e *Event) use() error {
	if e == nil {
		return errors.New("nil event")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errEventClosed
	}
	return nil
}

// Record makes the event mark the work issued on s so far.
func (e *Event) Record(s device.Stream) error {
	if err := e.use(); err != nil || e.ev == nil {
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
	if err := e.use(); err != nil || e.ev == nil {
		return err
	}
	if err := e.stream(s).WaitEvent(e.ev); err != nil {
		return fmt.Errorf("event wait: %w", err)
	}
	return nil
}

// Synchronize blocks the calling goroutine until the recorded work is done.
func (e *Event) Synchronize() error {
	if err := e.use(); err != nil || e.ev == nil {
		return err
	}
	return e.ev.Synchronize()
}

// Close destroys the event (a wrapped one's CUevent stays its owner's);
// later calls fail. Closing twice is a no-op.
func (e *Event) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.ev == nil {
		return nil
	}
	return e.ev.Destroy()
}
