package device

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// HostKernel is the Go twin of a GPU kernel. It sees the launch shape and the
// same packed arguments the GPU kernel gets, and runs to completion.
type HostKernel func(l *HostLaunch) error

// HostLaunch is what a host kernel receives.
type HostLaunch struct {
	Kernel      string
	Grid, Block Dim3
	SharedMem   int
	Args        *Args
}

var hostKernels sync.Map // name -> HostKernel

// RegisterHostKernel installs the Go twin of the kernel with this name. The
// package that owns a kernel registers its twin in init.
func RegisterHostKernel(name string, k HostKernel) {
	if _, dup := hostKernels.LoadOrStore(name, k); dup {
		panic("device: host kernel " + name + " registered twice")
	}
}

// HostSlice views n elements of T at address p of host-backend memory.
//
// Not inlined: Go 1.26's compiler crashes (disjointTypes) when an inlined
// copy meets a pointer made from an integer.
//
//go:noinline
func HostSlice[T any](p uintptr, n int) []T {
	if n == 0 {
		return nil
	}
	// p addresses mmap'd memory that the garbage collector neither owns nor
	// moves, so turning the integer back into a pointer is sound.
	return unsafe.Slice((*T)(unsafe.Add(nil, p)), n)
}

// hostDevice keeps device memory in anonymous mmap'd pages: stable addresses
// that Go's garbage collector neither moves nor scans.
type hostDevice struct {
	ordinal int
	mu      sync.Mutex
	allocs  map[uintptr][]byte
	closed  bool
}

// OpenHost opens the host backend's device for a rank.
func OpenHost(ordinal int) Device {
	return &hostDevice{ordinal: ordinal, allocs: map[uintptr][]byte{}}
}

func (d *hostDevice) Info() Info {
	return Info{Kind: Host, Ordinal: d.ordinal, Name: "host (Go reference backend)"}
}

func (d *hostDevice) Alloc(size int) (Buffer, error) {
	if size < 0 {
		return Buffer{}, fmt.Errorf("device host:%d: alloc of %d bytes", d.ordinal, size)
	}
	if size == 0 {
		return Buffer{}, nil
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return Buffer{}, fmt.Errorf("device host:%d: alloc %d bytes: %w", d.ordinal, size, err)
	}
	p := uintptr(unsafe.Pointer(&mem[0]))
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = syscall.Munmap(mem)
		return Buffer{}, ErrClosed
	}
	d.allocs[p] = mem
	return Buffer{Ptr: p, Size: size}, nil
}

func (d *hostDevice) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	d.mu.Lock()
	mem, ok := d.allocs[b.Ptr]
	delete(d.allocs, b.Ptr)
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("device host:%d: free of %#x, which this device did not allocate", d.ordinal, b.Ptr)
	}
	return syscall.Munmap(mem)
}

func (d *hostDevice) CopyIn(dst uintptr, src []byte) error {
	copy(HostSlice[byte](dst, len(src)), src)
	return nil
}

func (d *hostDevice) CopyInAsync(dst uintptr, src []byte, _ Stream) error { return d.CopyIn(dst, src) }

func (d *hostDevice) CopyOut(dst []byte, src uintptr) error {
	copy(dst, HostSlice[byte](src, len(dst)))
	return nil
}

func (d *hostDevice) CopyAsync(dst, src uintptr, n int, _ Stream) error {
	copy(HostSlice[byte](dst, n), HostSlice[byte](src, n))
	return nil
}

func (d *hostDevice) MemsetAsync(dst uintptr, v byte, n int, _ Stream) error {
	b := HostSlice[byte](dst, n)
	for i := range b {
		b[i] = v
	}
	return nil
}

func (d *hostDevice) Launch(name string, grid, block Dim3, smem int, _ Stream, args *Args) (err error) {
	k, ok := hostKernels.Load(name)
	if !ok {
		return fmt.Errorf("device host:%d: launch %s: no host twin registered for this kernel", d.ordinal, name)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("device host:%d: kernel %s: %v", d.ordinal, name, r)
		}
	}()
	if err := k.(HostKernel)(&HostLaunch{Kernel: name, Grid: grid, Block: block, SharedMem: smem, Args: args}); err != nil {
		return fmt.Errorf("device host:%d: kernel %s: %w", d.ordinal, name, err)
	}
	return nil
}

// Host streams run work as it is issued, so they are always complete.
type hostStream struct{}

func (hostStream) Handle() uintptr    { return 0 }
func (hostStream) Synchronize() error { return nil }
func (hostStream) Close() error       { return nil }

type hostEvent struct{ at time.Time }

func (e *hostEvent) Record(Stream) error { e.at = time.Now(); return nil }
func (e *hostEvent) Synchronize() error  { return nil }
func (e *hostEvent) Close() error        { return nil }

func (d *hostDevice) DefaultStream() Stream      { return hostStream{} }
func (d *hostDevice) NewStream() (Stream, error) { return hostStream{}, nil }
func (d *hostDevice) NewEvent() (Event, error)   { return &hostEvent{}, nil }
func (d *hostDevice) Elapsed(a, b Event) (time.Duration, error) {
	ea, ok1 := a.(*hostEvent)
	eb, ok2 := b.(*hostEvent)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("device host:%d: elapsed between events of another backend", d.ordinal)
	}
	return eb.at.Sub(ea.at), nil
}

// A host export is the process id and the address: only goroutine ranks of
// the same process can import it, which is the host backend's rank model.
const hostShareTag = "host1"

func (d *hostDevice) Export(b Buffer) (Shared, error) {
	d.mu.Lock()
	_, ok := d.allocs[b.Ptr]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("device host:%d: export of %#x, which this device did not allocate", d.ordinal, b.Ptr)
	}
	h := make([]byte, len(hostShareTag)+20)
	copy(h, hostShareTag)
	o := len(hostShareTag)
	binary.LittleEndian.PutUint32(h[o:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint64(h[o+4:], uint64(b.Ptr))
	binary.LittleEndian.PutUint64(h[o+12:], uint64(b.Size))
	return h, nil
}

func (d *hostDevice) Import(h Shared) (Buffer, error) {
	o := len(hostShareTag)
	if len(h) != o+20 || string(h[:o]) != hostShareTag {
		return Buffer{}, fmt.Errorf("device host:%d: import: not a host-backend export", d.ordinal)
	}
	if pid := binary.LittleEndian.Uint32(h[o:]); pid != uint32(os.Getpid()) {
		return Buffer{}, fmt.Errorf("device host:%d: import: the export is from process %d; the host backend shares memory only between goroutine ranks of one process", d.ordinal, pid)
	}
	return Buffer{Ptr: uintptr(binary.LittleEndian.Uint64(h[o+4:])), Size: int(binary.LittleEndian.Uint64(h[o+12:]))}, nil
}

func (d *hostDevice) CloseImport(Buffer) error { return nil }

func (d *hostDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var first error
	for p, mem := range d.allocs {
		if err := syscall.Munmap(mem); err != nil && first == nil {
			first = fmt.Errorf("device host:%d: free %#x: %w", d.ordinal, p, err)
		}
	}
	d.allocs = nil
	return first
}

// Host-mapped memory on the host backend is ordinary device memory: kernels
// and the host see the same pages.
func (d *hostDevice) AllocHostMapped(size int) (HostMapped, error) {
	b, err := d.Alloc(size)
	if err != nil {
		return HostMapped{}, err
	}
	return HostMapped{Host: HostSlice[byte](b.Ptr, size), Dev: b.Ptr}, nil
}

func (d *hostDevice) FreeHostMapped(m HostMapped) error {
	return d.Free(Buffer{Ptr: m.Dev, Size: len(m.Host)})
}

// hostGraph replays a capture by issuing the same work again: host streams
// execute as they are issued, so there is nothing to record.
type hostGraph struct{ issue func() error }

func (g *hostGraph) Launch(Stream) error { return g.issue() }
func (g *hostGraph) Close() error        { return nil }

func (d *hostDevice) Capture(_ Stream, issue func() error) (Graph, error) {
	return &hostGraph{issue}, nil
}

func (d *hostDevice) Preload(kernelNames ...string) error {
	for _, k := range kernelNames {
		if _, ok := hostKernels.Load(k); !ok {
			return fmt.Errorf("device host:%d: preload: kernel %s has no Go twin (is its package linked?)", d.ordinal, k)
		}
	}
	return nil
}
