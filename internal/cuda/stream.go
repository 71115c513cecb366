package cuda

/*
#include "shim.h"
*/
import "C"

import "errors"

// StreamFlags are cuStreamCreate flags.
type StreamFlags uint32

const (
	StreamDefault     StreamFlags = 0 // CU_STREAM_DEFAULT: synchronizes with the legacy NULL stream
	StreamNonBlocking StreamFlags = 1 // CU_STREAM_NON_BLOCKING: does not synchronize with the NULL stream
)

// WaitValueFlags are cuStreamWaitValue32/64 flags: one comparison, optionally
// ORed with WaitValueFlush.
type WaitValueFlags uint32

const (
	WaitValueGEQ   WaitValueFlags = 0x0     // CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, wrap-around safe
	WaitValueEQ    WaitValueFlags = 0x1     // CU_STREAM_WAIT_VALUE_EQ: *addr == value
	WaitValueAnd   WaitValueFlags = 0x2     // CU_STREAM_WAIT_VALUE_AND: (*addr & value) != 0
	WaitValueNor   WaitValueFlags = 0x3     // CU_STREAM_WAIT_VALUE_NOR: ~(*addr | value) != 0
	WaitValueFlush WaitValueFlags = 1 << 30 // CU_STREAM_WAIT_VALUE_FLUSH: flush remote writes (needs AttrCanFlushRemoteWrites)
)

// WriteValueFlags are cuStreamWriteValue32/64 flags.
type WriteValueFlags uint32

// (CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is not offered: the v2 entry
// points we resolve reject it with CUDA_ERROR_INVALID_VALUE.)
const (
	WriteValueDefault WriteValueFlags = 0x0 // CU_STREAM_WRITE_VALUE_DEFAULT: the write is a release (memory barrier before it)
)

// CaptureMode is a CUstreamCaptureMode.
type CaptureMode int

const (
	CaptureModeGlobal      CaptureMode = 0 // CU_STREAM_CAPTURE_MODE_GLOBAL
	CaptureModeThreadLocal CaptureMode = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
	CaptureModeRelaxed     CaptureMode = 2 // CU_STREAM_CAPTURE_MODE_RELAXED
)

// CaptureStatus is a CUstreamCaptureStatus.
type CaptureStatus int

const (
	CaptureStatusNone        CaptureStatus = 0 // CU_STREAM_CAPTURE_STATUS_NONE
	CaptureStatusActive      CaptureStatus = 1 // CU_STREAM_CAPTURE_STATUS_ACTIVE
	CaptureStatusInvalidated CaptureStatus = 2 // CU_STREAM_CAPTURE_STATUS_INVALIDATED
)

// Stream is a CUstream together with its context.
type Stream struct {
	ctx   *Context
	ch    C.uintptr_t // ctx.h, kept here to save a load on hot paths
	h     C.uintptr_t // CUstream; 0 is the legacy NULL stream
	owned bool
}

var errNilStream = errors.New("cuda: nil *Stream (use Context.NullStream for the default stream)")

// NewStream creates a stream in ctx. priority 0 is the default; see
// Context.StreamPriorityRange for the valid range (lower is higher priority).
func NewStream(ctx *Context, flags StreamFlags, priority int) (*Stream, error) {
	r := C.gc_stream_create(ctx.h, C.uint(flags), C.int(priority))
	if r.r != 0 {
		return nil, newError("cuStreamCreateWithPriority", r.r)
	}
	return &Stream{ctx: ctx, ch: ctx.h, h: C.uintptr_t(r.v), owned: true}, nil
}

// WrapStream wraps a CUstream created elsewhere (for example by an inference
// engine) that belongs to ctx. The Stream does not own it: Destroy is a no-op.
func WrapStream(ctx *Context, handle uintptr) *Stream {
	return &Stream{ctx: ctx, ch: ctx.h, h: C.uintptr_t(handle)}
}

// Handle returns the CUstream.
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return uintptr(s.h)
}

// Context returns the stream's context.
func (s *Stream) Context() *Context {
	if s == nil {
		return nil
	}
	return s.ctx
}

// Synchronize blocks until all work queued on the stream is done.
func (s *Stream) Synchronize() error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamSynchronize", C.gc_stream_synchronize(s.ch, s.h))
}

// Query reports whether all work queued on the stream is done. Not-ready is
// not an error.
func (s *Stream) Query() (bool, error) {
	if s == nil {
		return false, errNilStream
	}
	r := C.gc_stream_query(s.ch, s.h)
	switch r {
	case 0:
		return true, nil
	case C.int(ErrNotReady):
		return false, nil
	}
	return false, newError("cuStreamQuery", r)
}

// WaitEvent makes future work on s wait for the last Record of e. The event
// may belong to another context or device.
func (s *Stream) WaitEvent(e *Event) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamWaitEvent", C.gc_stream_wait_event(s.ch, s.h, e.h, 0))
}

// Destroy destroys an owned stream (work already queued still completes).
// On a wrapped stream it does nothing.
func (s *Stream) Destroy() error {
	if s == nil {
		return nil
	}
	if !s.owned || s.h == 0 {
		return nil
	}
	h := s.h
	s.h = 0
	s.owned = false
	return check("cuStreamDestroy", C.gc_stream_destroy(s.ch, h))
}

// WriteValue32 queues a 32-bit write of v to addr (device memory, or mapped
// host memory via its device pointer).
func (s *Stream) WriteValue32(addr DevicePtr, v uint32, flags WriteValueFlags) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamWriteValue32",
		C.gc_stream_write_value32(s.ch, s.h, C.uint64_t(addr), C.uint32_t(v), C.uint(flags)))
}

// WriteValue64 queues a 64-bit write of v to addr (8-byte aligned); see
// WaitValue64 for when it is supported.
func (s *Stream) WriteValue64(addr DevicePtr, v uint64, flags WriteValueFlags) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamWriteValue64",
		C.gc_stream_write_value64(s.ch, s.h, C.uint64_t(addr), C.uint64_t(v), C.uint(flags)))
}

// WaitValue32 makes the stream wait until the 32-bit word at addr satisfies
// the comparison in flags against v.
func (s *Stream) WaitValue32(addr DevicePtr, v uint32, flags WaitValueFlags) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamWaitValue32",
		C.gc_stream_wait_value32(s.ch, s.h, C.uint64_t(addr), C.uint32_t(v), C.uint(flags)))
}

// WaitValue64 is WaitValue32 for a 64-bit word (8-byte aligned). 64-bit
// stream memory operations need AttrCanUse64BitStreamMemOps; without it the
// driver returns ErrNotSupported.
func (s *Stream) WaitValue64(addr DevicePtr, v uint64, flags WaitValueFlags) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamWaitValue64",
		C.gc_stream_wait_value64(s.ch, s.h, C.uint64_t(addr), C.uint64_t(v), C.uint(flags)))
}

// BeginCapture starts capturing the work queued on s into a graph.
func (s *Stream) BeginCapture(mode CaptureMode) error {
	if s == nil {
		return errNilStream
	}
	return check("cuStreamBeginCapture", C.gc_stream_begin_capture(s.ch, s.h, C.int(mode)))
}

// EndCapture ends the capture started by BeginCapture and returns the graph.
func (s *Stream) EndCapture() (*Graph, error) {
	if s == nil {
		return nil, errNilStream
	}
	r := C.gc_stream_end_capture(s.ch, s.h)
	if r.r != 0 {
		return nil, newError("cuStreamEndCapture", r.r)
	}
	return &Graph{ctx: s.ctx, h: C.uintptr_t(r.v)}, nil
}

// CaptureStatus reports whether s is being captured.
func (s *Stream) CaptureStatus() (CaptureStatus, error) {
	if s == nil {
		return 0, errNilStream
	}
	r := C.gc_stream_is_capturing(s.ch, s.h)
	if r.r != 0 {
		return CaptureStatusNone, newError("cuStreamIsCapturing", r.r)
	}
	return CaptureStatus(r.v), nil
}
