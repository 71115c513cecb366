package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"sync/atomic"
)

// Context is one reference to a device's primary context, obtained with
// Device.Retain. Every operation that needs a current context takes one
// (directly, or through the stream, event, module or buffer it works on) and
// makes it current inside the same C call; see doc.go. A Context may be used
// from any goroutine.
type Context struct {
	h        C.uintptr_t // CUcontext
	dev      Device
	released atomic.Bool
}

var errReleased = errors.New("cuda: context already released")

// Device returns the context's device.
func (c *Context) Device() Device {
	if c == nil {
		return Device{}
	}
	return c.dev
}

// Handle returns the CUcontext.
func (c *Context) Handle() uintptr {
	if c == nil {
		return 0
	}
	return uintptr(c.h)
}

// Release drops this reference to the primary context
// (cuDevicePrimaryCtxRelease). The context is destroyed when the last
// reference is gone; everything allocated in it must be freed before.
// Releasing twice returns an error and has no effect.
func (c *Context) Release() error {
	if c == nil {
		return nil
	}
	if !c.released.CompareAndSwap(false, true) {
		return errReleased
	}
	return check("cuDevicePrimaryCtxRelease", C.gc_primary_ctx_release(c.dev.h))
}

// Synchronize waits for all work in the context.
func (c *Context) Synchronize() error {
	if c == nil {
		return errNil("Context")
	}
	return check("cuCtxSynchronize", C.gc_ctx_synchronize(c.h))
}

// EnablePeerAccess lets kernels and copies in c access memory allocated in
// peer (cuCtxEnablePeerAccess). Access that is already enabled is not an
// error. Peer access is one-way: enable it in both directions if needed.
func (c *Context) EnablePeerAccess(peer *Context) error {
	if c == nil {
		return errNil("Context")
	}
	r := C.gc_ctx_enable_peer_access(c.h, peer.h)
	if r == C.int(ErrPeerAccessAlreadyEnabled) {
		return nil
	}
	return check("cuCtxEnablePeerAccess", r)
}

// DisablePeerAccess undoes EnablePeerAccess.
func (c *Context) DisablePeerAccess(peer *Context) error {
	if c == nil {
		return errNil("Context")
	}
	return check("cuCtxDisablePeerAccess", C.gc_ctx_disable_peer_access(c.h, peer.h))
}

// MemGetInfo returns the free and total device memory in bytes.
func (c *Context) MemGetInfo() (free, total int, err error) {
	if c == nil {
		return 0, 0, errNil("Context")
	}
	r := C.gc_ctx_mem_get_info(c.h)
	if r.r != 0 {
		return 0, 0, newError("cuMemGetInfo", r.r)
	}
	return int(r.a), int(r.b), nil
}

// StreamPriorityRange returns the numerical range of stream priorities:
// least is the lowest priority (usually 0) and greatest the highest (a
// negative number); lower numbers mean higher priority.
func (c *Context) StreamPriorityRange() (least, greatest int, err error) {
	if c == nil {
		return 0, 0, errNil("Context")
	}
	r := C.gc_ctx_stream_priority_range(c.h)
	if r.r != 0 {
		return 0, 0, newError("cuCtxGetStreamPriorityRange", r.r)
	}
	return int(int64(r.a)), int(int64(r.b)), nil
}

// NullStream returns the context's legacy default (NULL) stream as a
// non-owned Stream. Work on it synchronizes with all blocking streams of the
// context.
func (c *Context) NullStream() *Stream {
	if c == nil {
		return nil
	}
	return WrapStream(c, 0)
}
