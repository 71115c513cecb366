package core

/*
#include <stdint.h>
// The driver's cuCtxGetDevice has one ABI under its plain name.
static int goep_ctx_get_device(void *fn, int *dev) { return ((int (*)(int *))fn)(dev); }
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/dl"
)

// backend is the device kind ranks run on ($GOEP_NCCL_BACKEND).
func backend() (device.Kind, error) {
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvBackend))); v {
	case "", "cuda":
		return device.CUDA, nil
	case "host":
		return device.Host, nil
	default:
		return "", errorf(InvalidUsage, "%s=%q: want cuda or host", EnvBackend, v)
	}
}

var ctxDevice struct {
	once sync.Once
	fn   unsafe.Pointer
	err  error
}

// currentOrdinal is the GPU of the calling thread's current CUDA context,
// which NCCL uses for a new communicator (cudaSetDevice before
// ncclCommInitRank); without one, $LOCAL_RANK, else 0.
func currentOrdinal() int {
	ctxDevice.once.Do(func() {
		path := os.Getenv("GOEP_LIBCUDA")
		if path == "" {
			path = "libcuda.so.1"
		}
		lib, err := dl.Open(path)
		if err != nil {
			ctxDevice.err = err
			return
		}
		ctxDevice.fn, ctxDevice.err = lib.Sym("cuCtxGetDevice")
	})
	if ctxDevice.err == nil {
		var d C.int
		if C.goep_ctx_get_device(ctxDevice.fn, &d) == 0 {
			return int(d)
		}
	}
	if n, err := strconv.Atoi(os.Getenv("LOCAL_RANK")); err == nil && n >= 0 {
		return n
	}
	return 0
}

// devices shares one Device per GPU among the process's communicators and
// ncclMemAlloc, so that memory from ncclMemAlloc is the communicators' own
// (registrable) memory.
var devices struct {
	mu   sync.Mutex
	cuda map[int]*sharedDevice
	host *sharedDevice // ncclMemAlloc's on the host backend
}

type sharedDevice struct {
	dev  device.Device
	refs int
}

// acquireCUDA opens (or shares) GPU ordinal.
func acquireCUDA(ordinal int) (device.Device, error) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if devices.cuda == nil {
		devices.cuda = map[int]*sharedDevice{}
	}
	if s := devices.cuda[ordinal]; s != nil {
		s.refs++
		return s.dev, nil
	}
	dev, err := device.OpenCUDA(ordinal)
	if err != nil {
		return nil, fmt.Errorf("GPU %d: %w", ordinal, err)
	}
	devices.cuda[ordinal] = &sharedDevice{dev: dev, refs: 1}
	return dev, nil
}

// releaseCUDA drops one reference; the last closes the device.
func releaseCUDA(ordinal int) error {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	s := devices.cuda[ordinal]
	if s == nil {
		return nil
	}
	if s.refs--; s.refs > 0 {
		return nil
	}
	delete(devices.cuda, ordinal)
	return s.dev.Close()
}
