package device

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Kind names a backend.
type Kind string

const (
	// CUDA runs kernels on an NVIDIA GPU.
	CUDA Kind = "cuda"
	// Host runs the Go twins of the kernels on host memory (goroutine ranks).
	Host Kind = "host"
)

// ParseKind accepts "cuda", "host" and "auto" ("" means auto). Auto picks
// CUDA when a GPU is usable, else Host; the reason CUDA was not picked comes
// back so callers can say it plainly.
func ParseKind(s string) (kind Kind, why string, err error) {
	switch s {
	case "cuda":
		return CUDA, "", nil
	case "host":
		return Host, "", nil
	case "", "auto":
		n, err := CUDADeviceCount()
		if err != nil {
			return Host, err.Error(), nil
		}
		if n == 0 {
			return Host, "the NVIDIA driver reports no GPU", nil
		}
		return CUDA, "", nil
	}
	return "", "", fmt.Errorf("backend %q: want cuda, host or auto", s)
}

// Dim3 is a launch grid or block shape.
type Dim3 struct{ X, Y, Z int }

// D1 is a one-dimensional Dim3.
func D1(x int) Dim3 { return Dim3{x, 1, 1} }

// Info describes the device behind a Device.
type Info struct {
	Kind         Kind
	Ordinal      int
	Name         string
	SMs          int
	MemoryBytes  uint64
	Major, Minor int // compute capability; 0.0 on the host backend
	PCIBusID     string
}

// Buffer is a span of device memory.
type Buffer struct {
	Ptr  uintptr
	Size int
}

// Stream orders work on one device.
type Stream interface {
	// Handle is the backend's stream handle (a CUstream on CUDA, 0 on host).
	Handle() uintptr
	Synchronize() error
	Close() error
}

// Event marks a point in a stream, for timing and cross-stream ordering.
type Event interface {
	Record(s Stream) error
	Synchronize() error
	Close() error
}

// HostMapped is pinned host memory mapped into the device's address space.
type HostMapped struct {
	Host []byte
	Dev  uintptr
}

// Graph is a captured sequence of stream work.
type Graph interface {
	Launch(s Stream) error
	Close() error
}

// Shared is a serialisable handle to a Buffer that another rank can Import.
type Shared []byte

// Device is one rank's accelerator. Methods may be called from any goroutine;
// the CUDA backend binds its context inside every call.
type Device interface {
	Info() Info

	Alloc(size int) (Buffer, error)
	Free(b Buffer) error

	// CopyIn and CopyOut are synchronous host<->device copies for setup and
	// checks; the hot paths launch kernels instead. They do not wait for
	// work queued on streams: synchronize the stream first.
	CopyIn(dst uintptr, src []byte) error
	CopyOut(dst []byte, src uintptr) error
	// CopyInAsync is CopyIn in stream order; src must stay untouched until
	// the stream reaches the copy (pinned memory makes it truly async).
	CopyInAsync(dst uintptr, src []byte, s Stream) error
	// CopyAsync copies n bytes device-to-device (also to a peer's imported
	// buffer) in stream order; MemsetAsync fills n bytes.
	CopyAsync(dst, src uintptr, n int, s Stream) error
	MemsetAsync(dst uintptr, value byte, n int, s Stream) error

	// Launch runs the kernel with this name (CUDA: from package kernels; host:
	// its registered Go twin).
	Launch(kernel string, grid, block Dim3, sharedMem int, s Stream, args *Args) error
	// Preload loads, before anything is launched, the modules that hold
	// the named kernels (every kernel of each), so that no later launch
	// has to load code while another rank's kernel spins waiting for it:
	// loading code into a CUDA context waits for every kernel running
	// there, and goroutine ranks sharing a GPU share its context.
	// Collective constructors (the EP Buffer, collectives, the plan
	// executor) preload before their ranks meet for the last time. The host
	// backend checks that each kernel has a twin.
	Preload(kernels ...string) error

	DefaultStream() Stream
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	Elapsed(start, end Event) (time.Duration, error)

	// Export makes b importable by other ranks on the same host; Import opens
	// a peer's export and CloseImport releases it.
	Export(b Buffer) (Shared, error)
	Import(h Shared) (Buffer, error)
	CloseImport(b Buffer) error

	// AllocHostMapped allocates pinned host memory that kernels can address:
	// the host reads and writes Host while kernels use Dev. Kernels report
	// timeouts and flags there without a copy.
	AllocHostMapped(size int) (HostMapped, error)
	FreeHostMapped(m HostMapped) error

	// Capture records what issue() enqueues on s into a graph that can be
	// replayed. On the host backend, a replay calls issue again.
	Capture(s Stream, issue func() error) (Graph, error)

	// Close frees everything this Device allocated or imported.
	Close() error
}

// HostRegistrar is implemented by backends that can pin host memory they
// did not allocate (a shared-memory segment mapped by several processes)
// and map it for their kernels. RegisterHost returns the address kernels
// use; the memory must stay mapped until UnregisterHost.
type HostRegistrar interface {
	RegisterHost(p []byte) (dev uintptr, err error)
	UnregisterHost(p []byte) error
}

// ErrClosed is returned by a Device used after Close.
var ErrClosed = errors.New("device is closed")

// Open opens the device of the given kind and ordinal (the GPU index on
// CUDA, the rank on host).
func Open(kind Kind, ordinal int) (Device, error) {
	switch kind {
	case CUDA:
		return OpenCUDA(ordinal)
	case Host:
		return OpenHost(ordinal), nil
	}
	return nil, fmt.Errorf("device: unknown backend %q", kind)
}

// OpenRank opens rank r's device when goroutine ranks are spread over this
// machine's GPUs (RankOrdinal).
func OpenRank(kind Kind, r int) (Device, error) {
	o, err := RankOrdinal(kind, r)
	if err != nil {
		return nil, err
	}
	return Open(kind, o)
}

// rankGPUs are the GPUs goroutine ranks spread over (UseGPUs; nil: all).
var rankGPUs struct {
	sync.Mutex
	ordinals []int
}

// UseGPUs limits the GPUs that RankOrdinal spreads ranks over to these
// ordinals, in this order (nil or empty: every GPU). Each must exist.
func UseGPUs(ordinals []int) error {
	if len(ordinals) > 0 {
		n, err := CUDADeviceCount()
		if err != nil {
			return err
		}
		seen := map[int]bool{}
		for _, o := range ordinals {
			switch {
			case o < 0 || o >= n:
				return fmt.Errorf("device: GPU %d: %d GPUs are visible (0..%d)", o, n, n-1)
			case seen[o]:
				return fmt.Errorf("device: GPU %d listed twice", o)
			}
			seen[o] = true
		}
	}
	rankGPUs.Lock()
	rankGPUs.ordinals = append([]int(nil), ordinals...)
	rankGPUs.Unlock()
	return nil
}

// RankOrdinal is the device of goroutine rank r: host-backend rank r, or
// GPU r mod the GPUs in use (every GPU, or those UseGPUs chose), so that
// several ranks share a GPU when there are fewer GPUs than ranks.
func RankOrdinal(kind Kind, r int) (int, error) {
	if kind != CUDA {
		return r, nil
	}
	rankGPUs.Lock()
	chosen := rankGPUs.ordinals
	rankGPUs.Unlock()
	if len(chosen) > 0 {
		return chosen[r%len(chosen)], nil
	}
	n, err := CUDADeviceCount()
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("device: no CUDA GPU")
	}
	return r % n, nil
}

// GPUsInUse is how many GPUs RankOrdinal spreads ranks over.
func GPUsInUse() (int, error) {
	rankGPUs.Lock()
	n := len(rankGPUs.ordinals)
	rankGPUs.Unlock()
	if n > 0 {
		return n, nil
	}
	return CUDADeviceCount()
}
