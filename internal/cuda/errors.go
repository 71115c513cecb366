package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"strconv"
)

// Code is a CUresult value. Codes satisfy error so that callers can write
// errors.Is(err, cuda.ErrNotReady) for any error returned by this package.
type Code int

// Result codes that callers of this package test for. The value is the
// driver's; the comment names the enumerator.
const (
	Success                      Code = 0   // CUDA_SUCCESS
	ErrInvalidValue              Code = 1   // CUDA_ERROR_INVALID_VALUE
	ErrOutOfMemory               Code = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized            Code = 3   // CUDA_ERROR_NOT_INITIALIZED
	ErrDeinitialized             Code = 4   // CUDA_ERROR_DEINITIALIZED
	ErrNoDevice                  Code = 100 // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice             Code = 101 // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidImage              Code = 200 // CUDA_ERROR_INVALID_IMAGE
	ErrInvalidContext            Code = 201 // CUDA_ERROR_INVALID_CONTEXT
	ErrNoBinaryForGPU            Code = 209 // CUDA_ERROR_NO_BINARY_FOR_GPU
	ErrPeerAccessUnsupported     Code = 217 // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
	ErrInvalidPTX                Code = 218 // CUDA_ERROR_INVALID_PTX
	ErrUnsupportedPTXVersion     Code = 222 // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
	ErrInvalidHandle             Code = 400 // CUDA_ERROR_INVALID_HANDLE
	ErrNotFound                  Code = 500 // CUDA_ERROR_NOT_FOUND
	ErrNotReady                  Code = 600 // CUDA_ERROR_NOT_READY
	ErrIllegalAddress            Code = 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	ErrLaunchOutOfResources      Code = 701 // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
	ErrLaunchTimeout             Code = 702 // CUDA_ERROR_LAUNCH_TIMEOUT
	ErrPeerAccessAlreadyEnabled  Code = 704 // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
	ErrPeerAccessNotEnabled      Code = 705 // CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
	ErrLaunchFailed              Code = 719 // CUDA_ERROR_LAUNCH_FAILED
	ErrCooperativeLaunchTooLarge Code = 720 // CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
	ErrNotPermitted              Code = 800 // CUDA_ERROR_NOT_PERMITTED
	ErrNotSupported              Code = 801 // CUDA_ERROR_NOT_SUPPORTED
	ErrStreamCaptureUnsupported  Code = 900 // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
	ErrStreamCaptureInvalidated  Code = 901 // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
	ErrStreamCaptureWrongThread  Code = 908 // CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
	ErrUnknown                   Code = 999 // CUDA_ERROR_UNKNOWN
)

// codeNames names the codes above when the driver cannot be asked (it is not
// loaded): error messages then still carry a readable name.
var codeNames = map[Code]string{
	Success:                      "CUDA_SUCCESS",
	ErrInvalidValue:              "CUDA_ERROR_INVALID_VALUE",
	ErrOutOfMemory:               "CUDA_ERROR_OUT_OF_MEMORY",
	ErrNotInitialized:            "CUDA_ERROR_NOT_INITIALIZED",
	ErrDeinitialized:             "CUDA_ERROR_DEINITIALIZED",
	ErrNoDevice:                  "CUDA_ERROR_NO_DEVICE",
	ErrInvalidDevice:             "CUDA_ERROR_INVALID_DEVICE",
	ErrInvalidImage:              "CUDA_ERROR_INVALID_IMAGE",
	ErrInvalidContext:            "CUDA_ERROR_INVALID_CONTEXT",
	ErrNoBinaryForGPU:            "CUDA_ERROR_NO_BINARY_FOR_GPU",
	ErrPeerAccessUnsupported:     "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrInvalidPTX:                "CUDA_ERROR_INVALID_PTX",
	ErrUnsupportedPTXVersion:     "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	ErrInvalidHandle:             "CUDA_ERROR_INVALID_HANDLE",
	ErrNotFound:                  "CUDA_ERROR_NOT_FOUND",
	ErrNotReady:                  "CUDA_ERROR_NOT_READY",
	ErrIllegalAddress:            "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrLaunchOutOfResources:      "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	ErrLaunchTimeout:             "CUDA_ERROR_LAUNCH_TIMEOUT",
	ErrPeerAccessAlreadyEnabled:  "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	ErrPeerAccessNotEnabled:      "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	ErrLaunchFailed:              "CUDA_ERROR_LAUNCH_FAILED",
	ErrCooperativeLaunchTooLarge: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	ErrNotPermitted:              "CUDA_ERROR_NOT_PERMITTED",
	ErrNotSupported:              "CUDA_ERROR_NOT_SUPPORTED",
	ErrStreamCaptureUnsupported:  "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	ErrStreamCaptureInvalidated:  "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	ErrStreamCaptureWrongThread:  "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	ErrUnknown:                   "CUDA_ERROR_UNKNOWN",
}

// Name returns the enumerator name of c, asking the driver when it is
// loaded; "CUDA_ERROR_<n>" for a code nobody knows.
func (c Code) Name() string {
	if s := C.gc_error_name(C.int(c)); s != nil {
		return C.GoString(s)
	}
	if s, ok := codeNames[c]; ok {
		return s
	}
	return "CUDA_ERROR_" + strconv.Itoa(int(c))
}

// Error implements error: the enumerator name and number.
func (c Code) Error() string { return c.Name() + " (" + strconv.Itoa(int(c)) + ")" }

// Error is a failed driver call.
type Error struct {
	Op   string // the driver entry point, e.g. "cuMemAlloc"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY" (cuGetErrorName)
	Msg  string // e.g. "out of memory" (cuGetErrorString); may be empty
}

// Error formats as "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
func (e *Error) Error() string {
	if e == nil {
		return "cuda: nil *Error"
	}
	name := e.Name
	if name == "" {
		name = "CUDA_ERROR_" + strconv.Itoa(e.Code)
	}
	s := e.Op + ": " + name + " (" + strconv.Itoa(e.Code) + ")"
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Is reports whether target is the Code of e, so errors.Is(err, ErrNotReady)
// works through any wrapping.
func (e *Error) Is(target error) bool {
	if e == nil {
		return false
	}
	c, ok := target.(Code)
	return ok && int(c) == e.Code
}

// IsCode reports whether err is (or wraps) a driver error with code c.
func IsCode(err error, c Code) bool { return errors.Is(err, c) }

// newError builds the error for a failed call. Only failure paths get here,
// so its allocations do not matter.
func newError(op string, r C.int) error {
	c := Code(r)
	e := &Error{Op: op, Code: int(r), Name: c.Name()}
	if s := C.gc_error_string(r); s != nil {
		e.Msg = C.GoString(s)
	}
	return e
}

// check turns a CUresult into an error; nil (no allocation) on success.
func check(op string, r C.int) error {
	if r == 0 {
		return nil
	}
	return newError(op, r)
}
