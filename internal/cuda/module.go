package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"unsafe"
)

// Module is a loaded CUmodule.
type Module struct {
	ctx *Context
	h   C.uintptr_t
}

// ModuleLoadError is a failed module load with the JIT compiler's log.
type ModuleLoadError struct {
	Err error  // the *Error from cuModuleLoadDataEx
	Log string // the JIT error log, if any
}

func (e *ModuleLoadError) Error() string {
	if e == nil {
		return "cuda: nil *ModuleLoadError"
	}
	if e.Log == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + "\nJIT log:\n" + e.Log
}

func (e *ModuleLoadError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

const jitLogSize = 16 << 10

// isBinaryImage reports whether image is a CUBIN (ELF) or a fatbinary; any
// other image is taken to be PTX text.
func isBinaryImage(image []byte) bool {
	if len(image) >= 4 && image[0] == 0x7f && image[1] == 'E' && image[2] == 'L' && image[3] == 'F' {
		return true
	}
	// Fatbinary magic 0xBA55ED50, little-endian.
	return len(image) >= 4 && image[0] == 0x50 && image[1] == 0xED && image[2] == 0x55 && image[3] == 0xBA
}

// ModuleLoadData loads a module into ctx from a CUBIN, a fatbinary or PTX
// text (which the driver JIT-compiles for the device; a missing NUL
// terminator is added). A failed load returns a *ModuleLoadError carrying
// the JIT log.
func ModuleLoadData(ctx *Context, image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, errors.New("cuda: empty module image")
	}
	if !isBinaryImage(image) && image[len(image)-1] != 0 {
		image = append(bytes.Clone(image), 0)
	}
	log := make([]byte, jitLogSize)
	r := C.gc_module_load(ctx.h, unsafe.Pointer(&image[0]), (*C.char)(unsafe.Pointer(&log[0])), C.uint(len(log)))
	if r.r != 0 {
		msg := log
		if i := bytes.IndexByte(msg, 0); i >= 0 {
			msg = msg[:i]
		}
		return nil, &ModuleLoadError{Err: newError("cuModuleLoadDataEx", r.r), Log: string(bytes.TrimSpace(msg))}
	}
	return &Module{ctx: ctx, h: C.uintptr_t(r.v)}, nil
}

// Handle returns the CUmodule.
func (m *Module) Handle() uintptr {
	if m == nil {
		return 0
	}
	return uintptr(m.h)
}

// Function looks up a kernel by its (mangled, for C++) name.
func (m *Module) Function(name string) (*Function, error) {
	if m == nil {
		return nil, errNil("Module")
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	r := C.gc_module_get_function(m.ctx.h, m.h, cname)
	if r.r != 0 {
		return nil, fmt.Errorf("kernel %q: %w", name, newError("cuModuleGetFunction", r.r))
	}
	return &Function{ctx: m.ctx, ch: m.ctx.h, h: C.uintptr_t(r.v), name: name}, nil
}

// Unload unloads the module; its Functions become invalid.
func (m *Module) Unload() error {
	if m == nil {
		return nil
	}
	if m.h == 0 {
		return nil
	}
	h := m.h
	m.h = 0
	return check("cuModuleUnload", C.gc_module_unload(m.ctx.h, h))
}

// FuncAttribute is a CUfunction_attribute.
type FuncAttribute int

const (
	FuncAttrMaxThreadsPerBlock            FuncAttribute = 0 // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
	FuncAttrSharedSizeBytes               FuncAttribute = 1 // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES (static)
	FuncAttrConstSizeBytes                FuncAttribute = 2 // CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES
	FuncAttrLocalSizeBytes                FuncAttribute = 3 // CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
	FuncAttrNumRegs                       FuncAttribute = 4 // CU_FUNC_ATTRIBUTE_NUM_REGS
	FuncAttrPTXVersion                    FuncAttribute = 5 // CU_FUNC_ATTRIBUTE_PTX_VERSION
	FuncAttrBinaryVersion                 FuncAttribute = 6 // CU_FUNC_ATTRIBUTE_BINARY_VERSION
	FuncAttrCacheModeCA                   FuncAttribute = 7 // CU_FUNC_ATTRIBUTE_CACHE_MODE_CA
	FuncAttrMaxDynamicSharedSizeBytes     FuncAttribute = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	FuncAttrPreferredSharedMemoryCarveout FuncAttribute = 9 // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
)

// Function is a kernel (CUfunction) of a loaded module.
type Function struct {
	ctx  *Context
	ch   C.uintptr_t
	h    C.uintptr_t
	name string
}

// Handle returns the CUfunction.
func (f *Function) Handle() uintptr {
	if f == nil {
		return 0
	}
	return uintptr(f.h)
}

// Name returns the name the function was looked up by.
func (f *Function) Name() string {
	if f == nil {
		return ""
	}
	return f.name
}

// Context returns the context of the function's module.
func (f *Function) Context() *Context {
	if f == nil {
		return nil
	}
	return f.ctx
}

// Attribute reads a function attribute.
func (f *Function) Attribute(attr FuncAttribute) (int, error) {
	if f == nil {
		return 0, errNil("Function")
	}
	r := C.gc_func_get_attribute(f.ch, f.h, C.int(attr))
	if r.r != 0 {
		return 0, newError("cuFuncGetAttribute", r.r)
	}
	return int(int64(r.v)), nil
}

// SetAttribute sets a function attribute, e.g.
// SetAttribute(FuncAttrMaxDynamicSharedSizeBytes, 200<<10) before launching
// with more than 48 KiB of dynamic shared memory.
func (f *Function) SetAttribute(attr FuncAttribute, v int) error {
	if f == nil {
		return errNil("Function")
	}
	return check("cuFuncSetAttribute", C.gc_func_set_attribute(f.ch, f.h, C.int(attr), C.int(v)))
}

// MaxActiveBlocksPerMultiprocessor returns how many blocks of blockSize
// threads using dynSmem bytes of dynamic shared memory fit on one SM: a
// cooperative launch may use at most that times the SM count.
func (f *Function) MaxActiveBlocksPerMultiprocessor(blockSize, dynSmem int) (int, error) {
	if f == nil {
		return 0, errNil("Function")
	}
	r := C.gc_occupancy_max_active_blocks(f.ch, f.h, C.int(blockSize), C.size_t(dynSmem))
	if r.r != 0 {
		return 0, newError("cuOccupancyMaxActiveBlocksPerMultiprocessor", r.r)
	}
	return int(int64(r.v)), nil
}
