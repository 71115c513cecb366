package cuda

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// EventFlags are cuEventCreate flags.
type EventFlags uint32

const (
	EventDefault       EventFlags = 0x0 // CU_EVENT_DEFAULT
	EventBlockingSync  EventFlags = 0x1 // CU_EVENT_BLOCKING_SYNC: Synchronize sleeps instead of spinning
	EventDisableTiming EventFlags = 0x2 // CU_EVENT_DISABLE_TIMING: cheaper; required for Interprocess
	EventInterprocess  EventFlags = 0x4 // CU_EVENT_INTERPROCESS: may be shared with GetIpcHandle (needs DisableTiming)
)

// IpcHandleSize is the size of CUipcMemHandle and CUipcEventHandle.
const IpcHandleSize = 64

// Event is a CUevent together with its context.
type Event struct {
	ctx   *Context
	ch    C.uintptr_t
	h     C.uintptr_t // CUevent
	owned bool
}

// NewEvent creates an event in ctx.
func NewEvent(ctx *Context, flags EventFlags) (*Event, error) {
	r := C.gc_event_create(ctx.h, C.uint(flags))
	if r.r != 0 {
		return nil, newError("cuEventCreate", r.r)
	}
	return &Event{ctx: ctx, ch: ctx.h, h: C.uintptr_t(r.v), owned: true}, nil
}

// Handle returns the CUevent.
func (e *Event) Handle() uintptr {
	if e == nil {
		return 0
	}
	return uintptr(e.h)
}

// Record captures the work queued on s so far; Query, Synchronize and
// Stream.WaitEvent then refer to that point. A nil stream records on the
// legacy NULL stream of the event's context.
func (e *Event) Record(s *Stream) error {
	if e == nil {
		return errNil("Event")
	}
	var sh C.uintptr_t
	if s != nil {
		sh = s.h
	}
	return check("cuEventRecord", C.gc_event_record(e.ch, e.h, sh))
}

// Synchronize blocks until the recorded work is done.
func (e *Event) Synchronize() error {
	if e == nil {
		return errNil("Event")
	}
	return check("cuEventSynchronize", C.gc_event_synchronize(e.ch, e.h))
}

// Query reports whether the recorded work is done (true also for an event
// never recorded). Not-ready is not an error.
func (e *Event) Query() (bool, error) {
	if e == nil {
		return false, errNil("Event")
	}
	r := C.gc_event_query(e.ch, e.h)
	switch r {
	case 0:
		return true, nil
	case C.int(ErrNotReady):
		return false, nil
	}
	return false, newError("cuEventQuery", r)
}

// ElapsedTime returns the time in milliseconds between two recorded,
// completed events (both created without EventDisableTiming).
func ElapsedTime(start, end *Event) (float32, error) {
	r := C.gc_event_elapsed_time(start.ch, start.h, end.h)
	if r.r != 0 {
		return 0, newError("cuEventElapsedTime", r.r)
	}
	return float32(r.v), nil
}

// Destroy destroys the event. Events opened from an IPC handle are destroyed
// the same way (this process's reference only).
func (e *Event) Destroy() error {
	if e == nil {
		return nil
	}
	if !e.owned || e.h == 0 {
		return nil
	}
	h := e.h
	e.h = 0
	e.owned = false
	return check("cuEventDestroy", C.gc_event_destroy(e.ch, h))
}

// GetIpcHandle returns a handle another process can pass to
// OpenIpcEventHandle. The event must have been created with
// EventInterprocess|EventDisableTiming.
func (e *Event) GetIpcHandle() ([IpcHandleSize]byte, error) {
	if e == nil {
		return [IpcHandleSize]byte{}, errNil("Event")
	}
	var h [IpcHandleSize]byte
	err := check("cuIpcGetEventHandle",
		C.gc_ipc_get_event_handle(e.ch, e.h, (*C.uchar)(unsafe.Pointer(&h[0]))))
	return h, err
}

// OpenIpcEventHandle opens an event exported by another process. Record,
// Synchronize, Query and Stream.WaitEvent work on it; Destroy closes it.
func OpenIpcEventHandle(ctx *Context, handle [IpcHandleSize]byte) (*Event, error) {
	r := C.gc_ipc_open_event_handle(ctx.h, (*C.uchar)(unsafe.Pointer(&handle[0])))
	if r.r != 0 {
		return nil, newError("cuIpcOpenEventHandle", r.r)
	}
	return &Event{ctx: ctx, ch: ctx.h, h: C.uintptr_t(r.v), owned: true}, nil
}
