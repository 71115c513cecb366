//go:build goep_cpuemu

// Package cpuemu runs the CUDA sources of the intranode kernels
// (kernels/intranode.cu and the headers it includes) on the CPU, compiled by
// g++ (C++20) behind a host-backend Device: one OS thread per CUDA thread,
// std::barrier for __syncthreads and warp collectives, per-block shared
// memory, GCC atomics in place of the PTX helpers (shim.h). The Go twins
// check the protocol and the host code; this checks the kernels' own index
// arithmetic, scans, warp collectives and summation order, on a machine
// without a GPU. It does not model the GPU memory model (x86 is far
// stronger), so orderings are still proven on GPUs only.
//
// Built only with -tags goep_cpuemu (it needs g++ with C++20, which the CI
// image need not have):
//
//	go test -tags goep_cpuemu ./intranode/cpuemu
//
// kernels_gen.h is generated from ../../kernels by gen.go (go generate);
// a test fails when it is stale.
package cpuemu

//go:generate go run gen.go

/*
#cgo CXXFLAGS: -std=c++20 -O1 -Wno-unknown-pragmas
#cgo LDFLAGS: -lstdc++ -lpthread
#include <stdlib.h>
int emu_launch(const char* name, int grid, int block, int smem, const unsigned char* params);
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
)

// Dev is a host-backend device whose launches run the emulated CUDA kernels.
type Dev struct {
	device.Device
	SMs int
}

func Open(rank, sms int) *Dev { return &Dev{Device: device.OpenHost(rank), SMs: sms} }

func (d *Dev) Info() device.Info { i := d.Device.Info(); i.SMs = d.SMs; return i }

func (d *Dev) Launch(name string, grid, block device.Dim3, smem int, _ device.Stream, a *device.Args) error {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	b := append([]byte(nil), a.Bytes()...)
	b = append(b, make([]byte, 8)...)
	rc := C.emu_launch(cs, C.int(grid.X), C.int(block.X), C.int(smem), (*C.uchar)(unsafe.Pointer(&b[0])))
	if rc != 0 {
		return fmt.Errorf("emu: launch %s: rc %d", name, rc)
	}
	return nil
}
