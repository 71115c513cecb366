package cuda

/*
#include "shim.h"
*/
import "C"

// WrapEvent wraps a CUevent created elsewhere (for example by an inference
// engine, a cudaEvent_t) that belongs to ctx, so that Stream.WaitEvent,
// Record, Query and Synchronize can use it. The Event does not own it:
// Destroy is a no-op and the CUevent stays the creator's. It takes ctx, like
// WrapStream, because every call binds the event's context.
func WrapEvent(ctx *Context, handle uintptr) *Event {
	return &Event{ctx: ctx, ch: ctx.h, h: C.uintptr_t(handle)}
}
