package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// MaxKernelParams is the most parameters a launch may pass.
const MaxKernelParams = C.GC_MAX_PARAMS

// Dim3 is a grid or block shape. A zero Y or Z counts as 1, so Dim3{X: n}
// is a 1-D shape; X must be positive.
type Dim3 struct{ X, Y, Z uint32 }

func (d Dim3) yz() (C.uint, C.uint) {
	y, z := d.Y, d.Z
	if y == 0 {
		y = 1
	}
	if z == 0 {
		z = 1
	}
	return C.uint(y), C.uint(z)
}

// KernelArgs packs kernel parameters into one byte buffer, each at its
// natural alignment (relative to the buffer start, which Go's allocator
// aligns to at least 8 bytes), and records where each one starts. The values
// are copied by the driver at launch, so a KernelArgs can be Reset and
// refilled for the next launch at once. After the first few uses no method
// allocates. The order and sizes must match the kernel's parameter list
// exactly: the driver reads as many bytes at each offset as the kernel's
// parameter declares. A KernelArgs must not be used from two goroutines at
// once.
type KernelArgs struct {
	buf  []byte
	offs []uint32
}

// NewKernelArgs returns an empty KernelArgs with room for typical kernels.
func NewKernelArgs() *KernelArgs {
	return &KernelArgs{buf: make([]byte, 0, 256), offs: make([]uint32, 0, 16)}
}

// Reset empties the builder, keeping its storage.
func (a *KernelArgs) Reset() *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	a.buf = a.buf[:0]
	a.offs = a.offs[:0]
	return a
}

// Len returns the number of parameters packed so far.
func (a *KernelArgs) Len() int {
	if a == nil {
		return 0
	}
	return len(a.offs)
}

// Size returns the number of bytes packed so far, padding included.
func (a *KernelArgs) Size() int {
	if a == nil {
		return 0
	}
	return len(a.buf)
}

// Offset returns the byte offset of parameter i (-1 for no such
// parameter).
func (a *KernelArgs) Offset(i int) int {
	if a == nil || i < 0 || i >= len(a.offs) {
		return -1
	}
	return int(a.offs[i])
}

// Bytes returns the packed buffer (a view, valid until the next change).
func (a *KernelArgs) Bytes() []byte {
	if a == nil {
		return nil
	}
	return a.buf
}

// slot reserves size bytes at the next multiple of align (a power of two),
// zeroes the padding, records the offset and returns the slot.
func (a *KernelArgs) slot(size, align int) []byte {
	start := len(a.buf)
	off := (start + align - 1) &^ (align - 1)
	end := off + size
	if end > cap(a.buf) {
		nb := make([]byte, start, max(2*cap(a.buf), end, 64))
		copy(nb, a.buf)
		a.buf = nb
	}
	a.buf = a.buf[:end]
	clear(a.buf[start:off])
	a.offs = append(a.offs, uint32(off))
	return a.buf[off:end]
}

// Ptr appends a device pointer (8 bytes).
func (a *KernelArgs) Ptr(p DevicePtr) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	binary.NativeEndian.PutUint64(a.slot(8, 8), uint64(p))
	return a
}

// Uintptr appends a raw 64-bit address.
func (a *KernelArgs) Uintptr(p uintptr) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	binary.NativeEndian.PutUint64(a.slot(8, 8), uint64(p))
	return a
}

// U8 appends an 8-bit unsigned integer.
func (a *KernelArgs) U8(v uint8) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	a.slot(1, 1)[0] = v
	return a
}

// U16 appends a 16-bit unsigned integer.
func (a *KernelArgs) U16(v uint16) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	binary.NativeEndian.PutUint16(a.slot(2, 2), v)
	return a
}

// U32 appends a 32-bit unsigned integer.
func (a *KernelArgs) U32(v uint32) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	binary.NativeEndian.PutUint32(a.slot(4, 4), v)
	return a
}

// I32 appends a 32-bit signed integer.
func (a *KernelArgs) I32(v int32) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	return a.U32(uint32(v))
}

// U64 appends a 64-bit unsigned integer.
func (a *KernelArgs) U64(v uint64) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	binary.NativeEndian.PutUint64(a.slot(8, 8), v)
	return a
}

// I64 appends a 64-bit signed integer.
func (a *KernelArgs) I64(v int64) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	return a.U64(uint64(v))
}

// F32 appends a float.
func (a *KernelArgs) F32(v float32) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	return a.U32(math.Float32bits(v))
}

// F64 appends a double.
func (a *KernelArgs) F64(v float64) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	return a.U64(math.Float64bits(v))
}

// Struct appends a by-value struct parameter: its bytes as the kernel lays
// them out, placed at a multiple of align (the struct's alignment in the
// kernel). It panics if align is not a positive power of two.
func (a *KernelArgs) Struct(data []byte, align int) *KernelArgs {
	if a == nil {
		a = new(KernelArgs) // the zero value works: the chain keeps its values
	}
	if align <= 0 || align&(align-1) != 0 {
		panic(fmt.Sprintf("cuda: KernelArgs.Struct: alignment %d is not a power of two", align))
	}
	copy(a.slot(len(data), align), data)
	return a
}

// Launch launches fn on s (nil: the NULL stream of fn's context) with
// sharedMem bytes of dynamic shared memory. args may be nil for a kernel
// without parameters.
func Launch(fn *Function, grid, block Dim3, sharedMem int, s *Stream, args *KernelArgs) error {
	if r := launch(fn, grid, block, sharedMem, s, args, 0); r != 0 {
		return launchError("cuLaunchKernel", r, args)
	}
	return nil
}

// LaunchCooperative is Launch through cuLaunchCooperativeKernel: all blocks
// are guaranteed to be resident at once, so they may synchronize with each
// other. The grid must fit (see Function.MaxActiveBlocksPerMultiprocessor).
func LaunchCooperative(fn *Function, grid, block Dim3, sharedMem int, s *Stream, args *KernelArgs) error {
	if r := launch(fn, grid, block, sharedMem, s, args, 1); r != 0 {
		return launchError("cuLaunchCooperativeKernel", r, args)
	}
	return nil
}

// errTooManyParams is a result code no driver uses, mapped to a Go error.
const errTooManyParams = -1

func launch(fn *Function, grid, block Dim3, sharedMem int, s *Stream, args *KernelArgs, coop C.int) C.int {
	if sharedMem < 0 || fn == nil {
		return C.GC_ERROR_INVALID_VALUE
	}
	var sh C.uintptr_t
	if s != nil {
		sh = s.h
	}
	var (
		bufp *C.uchar
		offp *C.uint32_t
		n    int
	)
	if args != nil && len(args.offs) > 0 {
		n = len(args.offs)
		if n > MaxKernelParams {
			return errTooManyParams
		}
		if len(args.buf) > 0 {
			bufp = (*C.uchar)(unsafe.Pointer(&args.buf[0]))
		}
		offp = (*C.uint32_t)(unsafe.Pointer(&args.offs[0]))
	}
	gy, gz := grid.yz()
	by, bz := block.yz()
	return C.gc_launch(fn.ch, fn.h, C.uint(grid.X), gy, gz, C.uint(block.X), by, bz,
		C.uint(sharedMem), sh, bufp, offp, C.int(n), coop)
}

func launchError(op string, r C.int, args *KernelArgs) error {
	if r == errTooManyParams {
		return fmt.Errorf("cuda: %s: %d kernel parameters, at most %d", op, args.Len(), MaxKernelParams)
	}
	return newError(op, r)
}
