package cuda

/*
#cgo CFLAGS: -O2
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"os"
	"strconv"
	"sync"

	"github.com/goep-dev/goep/internal/dl"
)

const (
	// DefaultLibrary is the driver library opened when GOEP_LIBCUDA is unset.
	DefaultLibrary = "libcuda.so.1"
	// LibraryEnv names the environment variable that overrides the path of
	// the driver library.
	LibraryEnv = "GOEP_LIBCUDA"
	// APIVersion is the CUDA API version at which every entry point is
	// resolved through cuGetProcAddress_v2 (CUDA 12.0).
	APIVersion = C.GC_API_VERSION
)

// ErrNoDriver is wrapped by the error of Load when no usable driver library
// could be loaded: the library is missing, or it is older than CUDA 12.0.
var ErrNoDriver = errors.New("no usable NVIDIA driver")

// DriverError reports that the driver library could not be loaded.
type DriverError struct {
	Path     string // the library path passed to dlopen
	Override bool   // Path came from GOEP_LIBCUDA
	Reason   string // what went wrong
}

func (e *DriverError) Error() string {
	if e == nil {
		return "cuda: nil *DriverError"
	}
	if !e.Override && isOpenFailure(e.Reason) {
		return DefaultLibrary + " not found: no NVIDIA driver on this machine (set " + LibraryEnv +
			" to override): " + e.Reason
	}
	src := ""
	if e.Override {
		src = " (from " + LibraryEnv + ")"
	}
	return "cuda: cannot use driver library " + strconv.Quote(e.Path) + src + ": " + e.Reason
}

// Unwrap lets errors.Is(err, ErrNoDriver) match.
func (e *DriverError) Unwrap() error {
	if e == nil {
		return nil
	}
	return ErrNoDriver
}

const dlopenPrefix = "dlopen: "

func isOpenFailure(reason string) bool {
	return len(reason) >= len(dlopenPrefix) && reason[:len(dlopenPrefix)] == dlopenPrefix
}

var (
	loadOnce sync.Once
	loadErr  error
)

// Load opens the driver library (GOEP_LIBCUDA or libcuda.so.1), resolves the
// entry points and calls cuInit(0). It runs once per process; later calls
// return the first result. It never panics: on a machine without an NVIDIA
// driver it returns an error wrapping ErrNoDriver, and on one with a driver
// but no device the cuInit error (errors.Is(err, ErrNoDevice)).
func Load() error {
	loadOnce.Do(func() {
		path, override := os.LookupEnv(LibraryEnv)
		if !override || path == "" {
			path, override = DefaultLibrary, false
		}
		if err := loadLibrary(path, override); err != nil {
			loadErr = err
			return
		}
		// Eager module loading unless the user chose otherwise: under lazy
		// loading (the driver's default since CUDA 12) a kernel's first
		// launch loads its code, which waits for the kernels running on
		// the device, and goep launches kernels while others spin waiting
		// for them (a port channel proxy's atomic add under a kernel that
		// pushes the triggers): that first launch would never return.
		if _, set := os.LookupEnv("CUDA_MODULE_LOADING"); !set {
			_ = os.Setenv("CUDA_MODULE_LOADING", "EAGER")
		}
		// As many hardware work queues as the driver allows (the default is
		// 8): streams beyond them share queues, and a queue is in order, so
		// a launch that waits for a spinning kernel of its own stream holds
		// back every stream behind it in that queue. Goroutine ranks sharing
		// a GPU each bring several streams; with too few queues one rank's
		// kernel can wait behind another rank's, which waits for it.
		if _, set := os.LookupEnv("CUDA_DEVICE_MAX_CONNECTIONS"); !set {
			_ = os.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
		}
		loadErr = check("cuInit", C.gc_init(0))
	})
	return loadErr
}

// loadLibrary opens path and fills the entry-point table. Nothing is kept
// when it fails, so tests may call it with paths that cannot work.
func loadLibrary(path string, override bool) error {
	lib, err := dl.Open(path)
	if err != nil {
		return &DriverError{Path: path, Override: override, Reason: err.Error()}
	}
	gpa, err := lib.Sym("cuGetProcAddress_v2")
	if err != nil {
		lib.Close()
		return &DriverError{Path: path, Override: override,
			Reason: "no cuGetProcAddress_v2 (not a CUDA driver, or one older than 12.0): " + err.Error()}
	}
	var buf [512]C.char
	var detail C.int
	stage := C.gc_load(gpa, &buf[0], C.int(len(buf)), &detail)
	msg := C.GoString(&buf[0])
	if stage != 0 {
		// Loaded before (5), or unusable: this handle is not needed. A
		// loaded library stays open for the life of the process.
		lib.Close()
	}
	switch stage {
	case 0, 5: // loaded now, or already before
		return nil
	case 3:
		return &DriverError{Path: path, Override: override,
			Reason: "cuGetProcAddress_v2(" + msg + ") failed: " + Code(detail).Error()}
	case 4:
		why := "symbol status " + strconv.Itoa(int(detail))
		switch detail {
		case 1: // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
			why = "symbol not found"
		case 2: // CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
			why = "driver too old for CUDA 12.0 API"
		}
		return &DriverError{Path: path, Override: override,
			Reason: "cannot resolve " + msg + " at API version " + strconv.Itoa(APIVersion) + ": " + why}
	}
	return &DriverError{Path: path, Override: override, Reason: "loader stage " + strconv.Itoa(int(stage))}
}

// DriverVersion returns the CUDA version the driver supports, e.g. 12080.
func DriverVersion() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	r := C.gc_driver_version()
	if r.r != 0 {
		return 0, newError("cuDriverGetVersion", r.r)
	}
	return int(int64(r.v)), nil
}

// cgoNop crosses into C and back doing nothing (benchmarks the floor).
func cgoNop() { C.gc_nop() }

// bindOnly makes ctx current the way every context-bound call does, and
// nothing else (benchmarks the cost of the binding).
func bindOnly(ctx *Context) error { return check("cuCtxSetCurrent", C.gc_bind(ctx.h)) }
