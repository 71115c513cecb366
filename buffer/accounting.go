package buffer

import (
	"sync"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// accounting passes every call to the Device it wraps and keeps the live
// device and host-mapped allocations made through it: the Buffer and its
// communicator allocate through one, so Memory reports exactly what the
// Buffer holds and Close can prove it freed all of it.
type accounting struct {
	device.Device

	mu     sync.Mutex
	dev    map[uintptr]int
	mapped map[uintptr]int
	peak   int64
}

func newAccounting(d device.Device) *accounting {
	return &accounting{Device: d, dev: map[uintptr]int{}, mapped: map[uintptr]int{}}
}

func (a *accounting) Alloc(size int) (device.Buffer, error) {
	b, err := a.Device.Alloc(size)
	if err == nil && b.Ptr != 0 {
		a.mu.Lock()
		a.dev[b.Ptr] = b.Size
		a.peak = max(a.peak, a.liveLocked().Device)
		a.mu.Unlock()
	}
	return b, err
}

func (a *accounting) Free(b device.Buffer) error {
	a.mu.Lock()
	delete(a.dev, b.Ptr)
	a.mu.Unlock()
	return a.Device.Free(b)
}

func (a *accounting) AllocHostMapped(size int) (device.HostMapped, error) {
	m, err := a.Device.AllocHostMapped(size)
	if err == nil {
		a.mu.Lock()
		a.mapped[m.Dev] = len(m.Host)
		a.mu.Unlock()
	}
	return m, err
}

func (a *accounting) FreeHostMapped(m device.HostMapped) error {
	a.mu.Lock()
	delete(a.mapped, m.Dev)
	a.mu.Unlock()
	return a.Device.FreeHostMapped(m)
}

// Context forwards the CUDA backend's primary context (nil on the host
// backend), for the events.
func (a *accounting) Context() *cuda.Context { return cudaContext(a.Device) }

// Memory is what a Buffer holds on its rank, counted allocation by
// allocation (the Buffer's own and its communicator's).
type Memory struct {
	// Device is bytes of device memory held now; Allocations how many
	// allocations that is; Peak the most device memory held at once.
	Device      int64
	Allocations int
	Peak        int64
	// HostMapped is bytes of pinned host memory mapped into the device.
	HostMapped      int64
	HostAllocations int
}

func (a *accounting) live() Memory {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.liveLocked()
	m.Peak = a.peak
	return m
}

func (a *accounting) liveLocked() Memory {
	var m Memory
	for _, n := range a.dev {
		m.Device += int64(n)
	}
	for _, n := range a.mapped {
		m.HostMapped += int64(n)
	}
	m.Allocations, m.HostAllocations = len(a.dev), len(a.mapped)
	return m
}

// cudaContext is the primary context of a CUDA-backend Device, or nil.
func cudaContext(d device.Device) *cuda.Context {
	if c, ok := d.(interface{ Context() *cuda.Context }); ok {
		return c.Context()
	}
	return nil
}

// sourceLoader marks the CPU emulation's device (it loads CUDA sources as
// the user-kernel path does); package internode runs its real kernels
// there.
type sourceLoader interface {
	LoadSource(file, src string) ([]string, error)
}

// accountingEmu is the accounting wrapper of an emulated device, keeping
// its source loader visible.
type accountingEmu struct {
	*accounting
	src sourceLoader
}

func (a accountingEmu) LoadSource(file, src string) ([]string, error) {
	return a.src.LoadSource(file, src)
}

// forComm is the device the communicator sees (and, through it, package
// internode): the accounting wrapper, which on an emulated device keeps
// the source loader, so that internode runs its kernels there as on a GPU.
func (a *accounting) forComm() device.Device {
	if src, ok := a.Device.(sourceLoader); ok {
		return accountingEmu{a, src}
	}
	return a
}
