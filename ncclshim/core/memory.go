package core

import (
	"context"
	"sync"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/internal/device"
)

// allocs are ncclMemAlloc's allocations: goep device memory, which goep can
// register for zero-copy algorithms and plans.
var allocs struct {
	mu sync.Mutex
	m  map[uintptr]allocation
}

type allocation struct {
	buf     device.Buffer
	dev     device.Device
	ordinal int // -1: the host backend
}

var hostAllocDev = sync.OnceValue(func() device.Device { return device.OpenHost(0) })

// MemAlloc allocates size bytes on the calling thread's GPU (ncclMemAlloc).
func MemAlloc(size uint64) (uintptr, error) {
	if size == 0 || size > 1<<50 {
		return 0, errorf(InvalidArgument, "ncclMemAlloc: size %d", size)
	}
	kind, err := backend()
	if err != nil {
		return 0, err
	}
	a := allocation{ordinal: -1}
	if kind == device.CUDA {
		a.ordinal = currentOrdinal()
		if a.dev, err = acquireCUDA(a.ordinal); err != nil {
			return 0, errorf(UnhandledCudaError, "ncclMemAlloc: %v", err)
		}
	} else {
		a.dev = hostAllocDev()
	}
	if a.buf, err = a.dev.Alloc(int(size)); err != nil {
		if a.ordinal >= 0 {
			releaseCUDA(a.ordinal)
		}
		return 0, errorf(UnhandledCudaError, "ncclMemAlloc(%d bytes): %v", size, err)
	}
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	if allocs.m == nil {
		allocs.m = map[uintptr]allocation{}
	}
	allocs.m[a.buf.Ptr] = a
	return a.buf.Ptr, nil
}

// MemFree frees memory from MemAlloc (ncclMemFree).
func MemFree(p uintptr) error {
	if p == 0 {
		return nil
	}
	allocs.mu.Lock()
	a, ok := allocs.m[p]
	delete(allocs.m, p)
	allocs.mu.Unlock()
	if !ok {
		return errorf(InvalidArgument, "ncclMemFree(%#x): not from ncclMemAlloc", p)
	}
	err := a.dev.Free(a.buf)
	if a.ordinal >= 0 {
		if rerr := releaseCUDA(a.ordinal); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return errorf(UnhandledCudaError, "ncclMemFree(%#x): %v", p, err)
	}
	return nil
}

// registration is one ncclCommRegister: goep's when the buffer is a whole
// ncclMemAlloc allocation of the communicator's GPU, else a local record.
type registration struct {
	ptr  uintptr
	size int
	reg  *collectives.Registration
}

// Register registers [p, p+size) (ncclCommRegister). A whole allocation
// from ncclMemAlloc on a GPU is registered with goep, which is collective:
// every rank registers such a buffer at the same point (as PyTorch's
// memory pool registration does). Anything else is recorded only.
func (c *Comm) Register(p uintptr, size uint64) (uint64, error) {
	if c == nil {
		return 0, errNilComm("ncclCommRegister")
	}
	if p == 0 || size == 0 {
		return 0, errorf(InvalidArgument, "ncclCommRegister: buffer %#x, size %d", p, size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errorf(InvalidArgument, "ncclCommRegister: the communicator is destroyed")
	}
	r := &registration{ptr: p, size: int(size)}
	allocs.mu.Lock()
	a, ok := allocs.m[p]
	allocs.mu.Unlock()
	if ok && c.coll != nil && c.kind == device.CUDA && a.dev == c.dev && uint64(a.buf.Size) == size {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		reg, err := c.coll.Register(ctx, a.buf)
		if err != nil {
			return 0, errorf(InternalError, "ncclCommRegister: %v", err)
		}
		r.reg = reg
	}
	c.nextReg++
	c.regs[c.nextReg] = r
	return c.nextReg, nil
}

// Deregister undoes Register (ncclCommDeregister).
func (c *Comm) Deregister(h uint64) error {
	if c == nil {
		return errNilComm("ncclCommDeregister")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.regs[h]
	if !ok {
		return errorf(InvalidArgument, "ncclCommDeregister: unknown handle")
	}
	delete(c.regs, h)
	if r.reg != nil {
		r.reg.Deregister()
	}
	return nil
}

// registered reports whether x's buffers lie in goep registrations (the
// zero-copy algorithms and GPU plans need that), as whole registrations
// for plans.
func (c *Comm) registered(x Call) bool {
	in := func(p uintptr) bool {
		for _, r := range c.regs {
			if r.reg != nil && p >= r.ptr && p < r.ptr+uintptr(r.size) {
				return true
			}
		}
		return false
	}
	return in(x.Send) && in(x.Recv)
}

// planBuffers reports whether a plan can run x on the GPU: collectives runs
// plans on whole registrations (the larger buffer's, in place; both,
// otherwise), and would otherwise pass the call on to its own selector.
func (c *Comm) planBuffers(x Call) bool {
	start := func(p uintptr) bool {
		for _, r := range c.regs {
			if r.reg != nil && p == r.ptr {
				return true
			}
		}
		return false
	}
	part := uintptr(uint64(c.rank) * x.Count * uint64(x.Type.Size()))
	switch {
	case x.Send == x.Recv:
		return start(x.Send)
	case x.Kind == AllGather && x.Send == x.Recv+part:
		return start(x.Recv) // in place: send lies in recv
	case x.Kind == ReduceScatter && x.Recv == x.Send+part:
		return start(x.Send) // in place: recv lies in send
	}
	return start(x.Send) && start(x.Recv)
}
