package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// DevicePtr is a CUdeviceptr: an address in the unified virtual address space.
type DevicePtr uintptr

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int) DevicePtr { return p + DevicePtr(off) }

var errNegativeSize = errors.New("cuda: negative size")

// AsBytes views a slice of plain data (numbers, or structs of numbers: no Go
// pointers) as bytes, for the copy functions. No copy is made.
func AsBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// MemAlloc allocates size bytes of device memory in ctx (cuMemAlloc).
func MemAlloc(ctx *Context, size int) (DevicePtr, error) {
	if size < 0 {
		return 0, errNegativeSize
	}
	r := C.gc_mem_alloc(ctx.h, C.size_t(size))
	if r.r != 0 {
		return 0, newError("cuMemAlloc", r.r)
	}
	return DevicePtr(r.v), nil
}

// MemFree frees memory from MemAlloc.
func MemFree(ctx *Context, p DevicePtr) error {
	return check("cuMemFree", C.gc_mem_free(ctx.h, C.uint64_t(p)))
}

// MemAllocAsync allocates size bytes from the device's current memory pool,
// ordered on s (cuMemAllocAsync).
func MemAllocAsync(size int, s *Stream) (DevicePtr, error) {
	if s == nil {
		return 0, errNilStream
	}
	if size < 0 {
		return 0, errNegativeSize
	}
	r := C.gc_mem_alloc_async(s.ch, C.size_t(size), s.h)
	if r.r != 0 {
		return 0, newError("cuMemAllocAsync", r.r)
	}
	return DevicePtr(r.v), nil
}

// MemFreeAsync frees p (from MemAllocAsync) once the work queued on s before
// it is done.
func MemFreeAsync(p DevicePtr, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	return check("cuMemFreeAsync", C.gc_mem_free_async(s.ch, C.uint64_t(p), s.h))
}

// MemsetD8 sets n bytes at dst to v.
func MemsetD8(ctx *Context, dst DevicePtr, v uint8, n int) error {
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemsetD8", C.gc_memset_d8(ctx.h, C.uint64_t(dst), C.uchar(v), C.size_t(n)))
}

// MemsetD32 sets n 32-bit words at dst (4-byte aligned) to v.
func MemsetD32(ctx *Context, dst DevicePtr, v uint32, n int) error {
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemsetD32", C.gc_memset_d32(ctx.h, C.uint64_t(dst), C.uint(v), C.size_t(n)))
}

// MemsetD8Async is MemsetD8 ordered on s.
func MemsetD8Async(dst DevicePtr, v uint8, n int, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemsetD8Async", C.gc_memset_d8_async(s.ch, C.uint64_t(dst), C.uchar(v), C.size_t(n), s.h))
}

// MemsetD32Async is MemsetD32 ordered on s.
func MemsetD32Async(dst DevicePtr, v uint32, n int, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemsetD32Async", C.gc_memset_d32_async(s.ch, C.uint64_t(dst), C.uint(v), C.size_t(n), s.h))
}

// MemcpyHtoD copies len(src) bytes from host memory to dst and returns when
// the copy is done.
func MemcpyHtoD(ctx *Context, dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoD",
		C.gc_memcpy_htod(ctx.h, C.uint64_t(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src))))
}

// MemcpyDtoH copies len(dst) bytes from src to host memory and returns when
// the copy is done.
func MemcpyDtoH(ctx *Context, dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoH",
		C.gc_memcpy_dtoh(ctx.h, unsafe.Pointer(unsafe.SliceData(dst)), C.uint64_t(src), C.size_t(len(dst))))
}

// MemcpyDtoD copies n bytes between device buffers (any devices, through
// unified addressing).
func MemcpyDtoD(ctx *Context, dst, src DevicePtr, n int) error {
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemcpyDtoD", C.gc_memcpy_dtod(ctx.h, C.uint64_t(dst), C.uint64_t(src), C.size_t(n)))
}

// MemcpyHtoDAsync queues a copy of len(src) bytes from host memory to dst on s.
//
// src should be pinned memory (HostBuffer.Bytes): then the copy is truly
// asynchronous and src is C memory the GPU may read after this returns. With
// ordinary Go memory the driver stages the data, but the slice must still
// stay alive and unmodified until the stream has passed the copy.
func MemcpyHtoDAsync(dst DevicePtr, src []byte, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync",
		C.gc_memcpy_htod_async(s.ch, C.uint64_t(dst), unsafe.Pointer(unsafe.SliceData(src)), C.size_t(len(src)), s.h))
}

// MemcpyDtoHAsync queues a copy of len(dst) bytes from src to host memory on
// s. dst should be pinned memory (HostBuffer.Bytes); with pageable Go memory
// the call only returns once the copy is done.
func MemcpyDtoHAsync(dst []byte, src DevicePtr, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoHAsync",
		C.gc_memcpy_dtoh_async(s.ch, unsafe.Pointer(unsafe.SliceData(dst)), C.uint64_t(src), C.size_t(len(dst)), s.h))
}

// MemcpyDtoDAsync queues a device-to-device copy of n bytes on s.
func MemcpyDtoDAsync(dst, src DevicePtr, n int, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemcpyDtoDAsync",
		C.gc_memcpy_dtod_async(s.ch, C.uint64_t(dst), C.uint64_t(src), C.size_t(n), s.h))
}

// HasMemcpyBatch reports whether the driver has cuMemcpyBatchAsync (CUDA
// 12.8+), which MemcpyBatchAsync needs.
func HasMemcpyBatch() bool { return C.gc_has_memcpy_batch() != 0 }

// MemcpyBatchAsync queues len(dsts) device copies (dsts[i] <- srcs[i],
// sizes[i] bytes) on s as one batch (cuMemcpyBatchAsync): the batch runs
// in stream order, the copies in it in no particular order, so none may
// depend on another. preferOverlap asks the driver to overlap them with
// kernels (CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE). ErrNotSupported
// where the driver lacks the call (HasMemcpyBatch).
func MemcpyBatchAsync(dsts, srcs []DevicePtr, sizes []int, preferOverlap bool, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if len(srcs) != len(dsts) || len(sizes) != len(dsts) {
		return fmt.Errorf("cuda: batch copy: %d destinations, %d sources, %d sizes", len(dsts), len(srcs), len(sizes))
	}
	if len(dsts) == 0 {
		return nil
	}
	cs := make([]C.size_t, len(sizes))
	for i, n := range sizes {
		if n < 0 {
			return errNegativeSize
		}
		cs[i] = C.size_t(n)
	}
	var flags C.uint
	if preferOverlap {
		flags = 1 // CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
	}
	var fail C.size_t
	r := C.gc_memcpy_batch_async(s.ch, (*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(dsts))), (*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(srcs))),
		unsafe.SliceData(cs), C.size_t(len(dsts)), flags, s.h, &fail)
	if err := check("cuMemcpyBatchAsync", r); err != nil {
		if int(fail) >= 0 && int(fail) < len(dsts) {
			return fmt.Errorf("%w (copy %d of %d)", err, int(fail), len(dsts))
		}
		return err
	}
	return nil
}

// MemcpyPeer copies n bytes from src in srcCtx to dst in dstCtx (another
// device) and returns when done. Peer access need not be enabled.
func MemcpyPeer(dst DevicePtr, dstCtx *Context, src DevicePtr, srcCtx *Context, n int) error {
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemcpyPeer",
		C.gc_memcpy_peer(dstCtx.h, C.uint64_t(dst), dstCtx.h, C.uint64_t(src), srcCtx.h, C.size_t(n)))
}

// MemcpyPeerAsync is MemcpyPeer queued on s.
func MemcpyPeerAsync(dst DevicePtr, dstCtx *Context, src DevicePtr, srcCtx *Context, n int, s *Stream) error {
	if s == nil {
		return errNilStream
	}
	if n < 0 {
		return errNegativeSize
	}
	return check("cuMemcpyPeerAsync",
		C.gc_memcpy_peer_async(s.ch, C.uint64_t(dst), dstCtx.h, C.uint64_t(src), srcCtx.h, C.size_t(n), s.h))
}

// HostAllocFlags are cuMemHostAlloc flags.
type HostAllocFlags uint32

const (
	HostAllocPortable      HostAllocFlags = 0x1 // CU_MEMHOSTALLOC_PORTABLE: pinned for all contexts
	HostAllocDeviceMap     HostAllocFlags = 0x2 // CU_MEMHOSTALLOC_DEVICEMAP: mapped into the device address space
	HostAllocWriteCombined HostAllocFlags = 0x4 // CU_MEMHOSTALLOC_WRITECOMBINED: fast for the GPU to read, slow for the CPU
)

// HostBuffer is pinned (page-locked) host memory from cuMemHostAlloc. It is
// C memory: slices over it may be handed to async copies and kept by the
// GPU, and the garbage collector never moves or frees it.
type HostBuffer struct {
	ctx  *Context
	p    unsafe.Pointer
	size int
}

// HostAlloc allocates size bytes of pinned host memory.
func HostAlloc(ctx *Context, size int, flags HostAllocFlags) (*HostBuffer, error) {
	if size <= 0 {
		return nil, errors.New("cuda: HostAlloc size must be positive")
	}
	r := C.gc_mem_host_alloc(ctx.h, C.size_t(size), C.uint(flags))
	if r.r != 0 {
		return nil, newError("cuMemHostAlloc", r.r)
	}
	return &HostBuffer{ctx: ctx, p: r.p, size: size}, nil
}

// Bytes returns the buffer as a byte slice (valid until Free).
func (b *HostBuffer) Bytes() []byte {
	if b == nil {
		return nil
	}
	if b.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.p), b.size)
}

// Pointer returns the host address of the buffer.
func (b *HostBuffer) Pointer() unsafe.Pointer {
	if b == nil {
		return nil
	}
	return b.p
}

// Size returns the size in bytes.
func (b *HostBuffer) Size() int {
	if b == nil {
		return 0
	}
	return b.size
}

// DevicePointer returns the address at which kernels reach the buffer; it
// needs HostAllocDeviceMap (cuMemHostGetDevicePointer).
func (b *HostBuffer) DevicePointer() (DevicePtr, error) {
	if b == nil {
		return 0, errNil("HostBuffer")
	}
	r := C.gc_mem_host_get_device_pointer(b.ctx.h, b.p)
	if r.r != 0 {
		return 0, newError("cuMemHostGetDevicePointer", r.r)
	}
	return DevicePtr(r.v), nil
}

// Free releases the buffer. Slices returned by Bytes must not be used after.
func (b *HostBuffer) Free() error {
	if b == nil {
		return nil
	}
	if b.p == nil {
		return nil
	}
	p := b.p
	b.p = nil
	return check("cuMemFreeHost", C.gc_mem_free_host(b.ctx.h, p))
}

// HostRegisterFlags are cuMemHostRegister flags.
type HostRegisterFlags uint32

const (
	HostRegisterPortable  HostRegisterFlags = 0x1 // CU_MEMHOSTREGISTER_PORTABLE: pinned for all contexts
	HostRegisterDeviceMap HostRegisterFlags = 0x2 // CU_MEMHOSTREGISTER_DEVICEMAP: mapped into the device address space
)

// HostRegister page-locks size bytes of existing host memory at p (page
// aligned, e.g. an mmap'd shared segment) so that the GPU can reach it.
// The memory must stay mapped until HostUnregister.
func HostRegister(ctx *Context, p unsafe.Pointer, size int, flags HostRegisterFlags) error {
	if p == nil || size <= 0 {
		return errors.New("cuda: HostRegister of an empty range")
	}
	return check("cuMemHostRegister", C.gc_mem_host_register(ctx.h, p, C.size_t(size), C.uint(flags)))
}

// HostUnregister undoes HostRegister.
func HostUnregister(ctx *Context, p unsafe.Pointer) error {
	return check("cuMemHostUnregister", C.gc_mem_host_unregister(ctx.h, p))
}

// HostDevicePointer is where kernels reach registered (DeviceMap) host
// memory at p.
func HostDevicePointer(ctx *Context, p unsafe.Pointer) (DevicePtr, error) {
	r := C.gc_mem_host_get_device_pointer(ctx.h, p)
	if r.r != 0 {
		return 0, newError("cuMemHostGetDevicePointer", r.r)
	}
	return DevicePtr(r.v), nil
}

// MemoryType is a CUmemorytype.
type MemoryType int

const (
	MemoryTypeHost    MemoryType = 1 // CU_MEMORYTYPE_HOST
	MemoryTypeDevice  MemoryType = 2 // CU_MEMORYTYPE_DEVICE
	MemoryTypeArray   MemoryType = 3 // CU_MEMORYTYPE_ARRAY
	MemoryTypeUnified MemoryType = 4 // CU_MEMORYTYPE_UNIFIED
)

func (t MemoryType) String() string {
	switch t {
	case MemoryTypeHost:
		return "host"
	case MemoryTypeDevice:
		return "device"
	case MemoryTypeArray:
		return "array"
	case MemoryTypeUnified:
		return "unified"
	}
	return "unknown"
}

// PointerAttribute is a CUpointer_attribute.
type PointerAttribute int

const (
	PointerAttrContext                PointerAttribute = 1  // CU_POINTER_ATTRIBUTE_CONTEXT
	PointerAttrMemoryType             PointerAttribute = 2  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
	PointerAttrDevicePointer          PointerAttribute = 3  // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
	PointerAttrHostPointer            PointerAttribute = 4  // CU_POINTER_ATTRIBUTE_HOST_POINTER
	PointerAttrIsManaged              PointerAttribute = 8  // CU_POINTER_ATTRIBUTE_IS_MANAGED
	PointerAttrDeviceOrdinal          PointerAttribute = 9  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
	PointerAttrIsLegacyCudaIpcCapable PointerAttribute = 10 // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
	PointerAttrRangeStartAddr         PointerAttribute = 11 // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
	PointerAttrRangeSize              PointerAttribute = 12 // CU_POINTER_ATTRIBUTE_RANGE_SIZE
	PointerAttrMapped                 PointerAttribute = 13 // CU_POINTER_ATTRIBUTE_MAPPED
)

// PointerGetAttribute reads a pointer attribute whose value is at most 8
// bytes wide (all of the constants above), zero-extended to 64 bits. Prefer
// the typed helpers below.
func PointerGetAttribute(attr PointerAttribute, p DevicePtr) (uint64, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	r := C.gc_pointer_attribute(C.int(attr), C.uint64_t(p))
	if r.r != 0 {
		return 0, newError("cuPointerGetAttribute", r.r)
	}
	return uint64(r.v), nil
}

// PointerMemoryType returns where p lives (device memory, pinned host memory...).
func PointerMemoryType(p DevicePtr) (MemoryType, error) {
	v, err := PointerGetAttribute(PointerAttrMemoryType, p)
	return MemoryType(uint32(v)), err
}

// PointerDeviceOrdinal returns the ordinal of the device p was allocated on
// (for host memory, the device of the allocating context).
func PointerDeviceOrdinal(p DevicePtr) (int, error) {
	v, err := PointerGetAttribute(PointerAttrDeviceOrdinal, p)
	return int(int32(uint32(v))), err
}

// PointerRange returns the start and size of the allocation containing p.
func PointerRange(p DevicePtr) (start DevicePtr, size int, err error) {
	v, err := PointerGetAttribute(PointerAttrRangeStartAddr, p)
	if err != nil {
		return 0, 0, err
	}
	n, err := PointerGetAttribute(PointerAttrRangeSize, p)
	if err != nil {
		return 0, 0, err
	}
	return DevicePtr(v), int(n), nil
}
