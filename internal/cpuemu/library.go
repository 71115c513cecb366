package cpuemu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*goep_emu_launch_fn)(const char*, const unsigned*, const unsigned*, unsigned, const unsigned char*,
                                  size_t, double, char*, size_t);

static void* goep_emu_open(const char* path, char* err, size_t n) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char* e = dlerror();
		snprintf(err, n, "%s", e ? e : "dlopen failed");
	}
	return h;
}

static void* goep_emu_sym(void* h, const char* name) { return dlsym(h, name); }

static int goep_emu_call(void* f, const char* name, const unsigned* grid, const unsigned* block, unsigned smem,
                         const unsigned char* args, size_t nargs, double limit_s, char* err, size_t n) {
	return ((goep_emu_launch_fn)f)(name, grid, block, smem, args, nargs, limit_s, err, n);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// library is a loaded module. Modules stay loaded for the life of the
// process: emulated threads never outlive a launch, but nothing is gained
// by unloading code a later test may launch again.
type library struct {
	launch unsafe.Pointer
}

func openLibrary(path string) (*library, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var buf [512]C.char
	h := C.goep_emu_open(cp, &buf[0], C.size_t(len(buf)))
	if h == nil {
		return nil, errors.New(C.GoString(&buf[0]))
	}
	sym := C.CString("goep_emu_launch")
	defer C.free(unsafe.Pointer(sym))
	f := C.goep_emu_sym(h, sym)
	if f == nil {
		return nil, fmt.Errorf("%s has no goep_emu_launch", path)
	}
	return &library{launch: f}, nil
}

// run launches kernel and waits for every emulated thread to return.
func (l *library) run(kernel string, grid, block [3]uint32, smem int, args []byte, limit time.Duration) error {
	cn := C.CString(kernel)
	defer C.free(unsafe.Pointer(cn))
	// The packed arguments go to C memory: C must not keep Go pointers, and
	// the threads read them while the call runs.
	var ca *C.uchar
	if len(args) > 0 {
		ca = (*C.uchar)(C.CBytes(args))
		defer C.free(unsafe.Pointer(ca))
	}
	g := (*C.unsigned)(C.malloc(24))
	defer C.free(unsafe.Pointer(g))
	dims := unsafe.Slice((*uint32)(unsafe.Pointer(g)), 6)
	copy(dims[:3], grid[:])
	copy(dims[3:], block[:])
	var buf [1024]C.char
	rc := C.goep_emu_call(l.launch, cn, g, (*C.unsigned)(unsafe.Add(unsafe.Pointer(g), 12)), C.unsigned(smem), ca,
		C.size_t(len(args)), C.double(limit.Seconds()), &buf[0], C.size_t(len(buf)))
	if rc != 0 {
		return errors.New(C.GoString(&buf[0]))
	}
	return nil
}
