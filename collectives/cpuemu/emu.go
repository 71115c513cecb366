//go:build goep_cpuemu

// Package cpuemu runs the CUDA sources of the collective kernels
// (kernels/coll_*.cu and the headers they include) on the CPU, compiled by
// g++ (C++20) behind a host-backend Device: one OS thread per CUDA thread,
// std::barrier for __syncthreads, per-block shared memory, GCC atomics in
// place of the PTX helpers (gen.go). The Go twins check the protocol and
// the host code in CI; this checks the kernels' own indexing, rounds,
// slots, flags, semaphore pairing and reductions, bit for bit against the
// plain-Go reference, on a machine without a GPU. It does not model the GPU
// memory model (x86 is far stronger): orderings are proven on GPUs only.
//
// Built only with -tags goep_cpuemu (g++ with C++20 is needed):
//
//	go test -tags goep_cpuemu ./collectives/cpuemu
//
// kernels_gen.h is generated from ../../kernels by gen.go; a test fails
// when it is stale.
package cpuemu

//go:generate go run gen.go

/*
#cgo CXXFLAGS: -std=c++20 -O1 -Wno-unknown-pragmas
#cgo LDFLAGS: -lstdc++ -lpthread
#include <stdlib.h>
int emu_launch(const char* name, int grid, int block, const unsigned char* params);
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
)

// Dev is a host-backend device whose launches run the emulated kernels.
type Dev struct {
	device.Device
	SMs int
}

// Open opens rank's emulated device; sms is what Info reports (it sizes the
// collectives' default grids).
func Open(rank, sms int) *Dev { return &Dev{Device: device.OpenHost(rank), SMs: sms} }

// Info is the host device's, with SMs set.
func (d *Dev) Info() device.Info {
	i := d.Device.Info()
	i.SMs = d.SMs
	return i
}

// Launch runs the emulated kernel (every thread of the grid as an OS
// thread) and returns when the grid is done.
func (d *Dev) Launch(name string, grid, block device.Dim3, _ int, _ device.Stream, a *device.Args) error {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	b := append(append([]byte(nil), a.Bytes()...), make([]byte, 8)...)
	if rc := C.emu_launch(cs, C.int(max(grid.X, 1)), C.int(max(block.X, 1)), (*C.uchar)(unsafe.Pointer(&b[0]))); rc != 0 {
		return fmt.Errorf("cpuemu: launch %s: rc %d", name, rc)
	}
	return nil
}
