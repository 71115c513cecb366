package cpuemu

import (
	"fmt"
	"os"
	"time"

	"github.com/goep-dev/goep/internal/device"
)

// Options shape an emulated device.
type Options struct {
	// SMs is what Info reports (it sizes the grids the launchers pick);
	// keep it small: every emulated CUDA thread is an OS thread. 0 means 2.
	SMs int
	// WaitLimit bounds any one wait inside a launch (a barrier, a warp
	// rendezvous); a launch that exceeds it fails. 0 means 5 minutes.
	WaitLimit time.Duration
}

// Device is a host-backend device (host memory, goroutine ranks) whose
// launches run the real CUDA kernels, compiled by g++, on CPU threads.
// Everything but Launch and Info is the host backend's.
type Device struct {
	device.Device
	opt Options
}

// Open opens rank's emulated device. It fails with ErrNoCompiler (wrapped)
// when no C++ compiler is installed.
func Open(rank int, opt Options) (*Device, error) {
	if _, err := Compiler(); err != nil {
		return nil, err
	}
	if opt.SMs <= 0 {
		opt.SMs = 2
	}
	if opt.WaitLimit <= 0 {
		opt.WaitLimit = 5 * time.Minute
	}
	return &Device{Device: device.OpenHost(rank), opt: opt}, nil
}

// Info is the host device's, with SMs set and the name saying what runs.
func (d *Device) Info() device.Info {
	i := d.Device.Info()
	i.SMs = d.opt.SMs
	i.Name = "host (CPU emulation of the CUDA kernels)"
	return i
}

// Launch runs the kernel's CUDA source on CPU threads and returns when
// every thread has returned (launches are synchronous: host streams are).
func (d *Device) Launch(kernel string, grid, block device.Dim3, sharedMem int, _ device.Stream, a *device.Args) error {
	m, err := moduleFor(kernel)
	if err != nil {
		return err
	}
	dim := func(v device.Dim3) [3]uint32 {
		return [3]uint32{uint32(max(v.X, 1)), uint32(max(v.Y, 1)), uint32(max(v.Z, 1))}
	}
	if grid.X == 0 || block.X == 0 {
		return fmt.Errorf("cpuemu: launch %s: empty grid %v or block %v", kernel, grid, block)
	}
	if grid.X < 0 || grid.Y < 0 || grid.Z < 0 || block.X < 0 || block.Y < 0 || block.Z < 0 || sharedMem < 0 {
		return fmt.Errorf("cpuemu: launch %s: negative grid %v, block %v or shared memory %d", kernel, grid, block, sharedMem)
	}
	var args []byte
	if a != nil {
		args = a.Bytes()
	}
	countLaunch(kernel)
	if err := m.lib.run(kernel, dim(grid), dim(block), sharedMem, args, d.opt.WaitLimit); err != nil {
		return fmt.Errorf("cpuemu: %s<<<%v, %v, %d>>> on %s: %w", kernel, grid, block, sharedMem, d.Device.Info().Name, err)
	}
	return nil
}

// EnvRequire, set to 1, makes tests fail instead of skip when the
// emulation cannot be built (CI sets it: it installs g++).
const EnvRequire = "GOEP_REQUIRE_CPUEMU"

// TB is the part of testing.TB that SkipUnavailable uses.
type TB interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// SkipUnavailable skips t, saying why, when no C++ compiler is installed;
// with GOEP_REQUIRE_CPUEMU=1 it fails t instead.
func SkipUnavailable(t TB) {
	t.Helper()
	if _, err := Compiler(); err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("CPU emulation unavailable and %s=1: %v", EnvRequire, err)
		}
		t.Skipf("CPU emulation unavailable (tests of the real kernels on CPUs skipped): %v", err)
	}
}
