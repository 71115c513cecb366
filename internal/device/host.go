package device

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime/debug"
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
// that Go's garbage collector neither moves nor scans. Every allocation is
// in the process-wide table hostMem (host_mem.go), which checks the ranges
// that copies use and keeps memory mapped while something may still read it.
type hostDevice struct {
	ordinal  int
	mu       sync.Mutex
	allocs   map[uintptr]*hostRegion
	imported map[uintptr]int // imports of peers' memory still open
	closed   bool
}

// OpenHost opens the host backend's device for a rank.
func OpenHost(ordinal int) Device {
	return &hostDevice{ordinal: ordinal, allocs: map[uintptr]*hostRegion{}, imported: map[uintptr]int{}}
}

func (d *hostDevice) Info() Info {
	return Info{Kind: Host, Ordinal: d.ordinal, Name: "host (Go reference backend)"}
}

func (d *hostDevice) errorf(format string, a ...any) error {
	return fmt.Errorf("device host:%d: "+format, append([]any{d.ordinal}, a...)...)
}

// usable fails after Close.
func (d *hostDevice) usable() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.errorf("%w", ErrClosed)
	}
	return nil
}

// maxHostAlloc bounds one host-backend allocation (1 TiB): a size beyond
// it is a wrapped or corrupt size, not a request to honour.
const maxHostAlloc = 1 << 40

func (d *hostDevice) Alloc(size int) (Buffer, error) {
	if size < 0 || size > maxHostAlloc {
		return Buffer{}, d.errorf("alloc of %d bytes (want 0..%d)", size, maxHostAlloc)
	}
	if size == 0 {
		return Buffer{}, nil
	}
	if err := d.usable(); err != nil {
		return Buffer{}, err
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return Buffer{}, d.errorf("alloc %d bytes: %w", size, err)
	}
	p := uintptr(unsafe.Pointer(&mem[0]))
	r := &hostRegion{lo: p, hi: p + uintptr(size), mem: mem, owner: d}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = syscall.Munmap(mem)
		return Buffer{}, d.errorf("%w", ErrClosed)
	}
	hostAdd(r)
	d.allocs[p] = r
	return Buffer{Ptr: p, Size: size}, nil
}

func (d *hostDevice) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return d.errorf("free of %#x: %w", b.Ptr, ErrClosed)
	}
	r, ok := d.allocs[b.Ptr]
	delete(d.allocs, b.Ptr)
	d.mu.Unlock()
	if !ok {
		return d.errorf("free of %#x, which this device did not allocate (or freed already)", b.Ptr)
	}
	hostMem.Lock()
	dead := hostReleaseLocked(r)
	hostMem.Unlock()
	unmapAll(dead)
	return nil
}

// touch runs f, which reads or writes host-backend memory, after checking
// that the device is open and every range lies in a live allocation; the
// memory stays mapped until f returns (hostEnter).
func (d *hostDevice) touch(what string, f func(), ranges ...hostSpan) error {
	if err := d.usable(); err != nil {
		return err
	}
	g := hostEnter()
	defer hostExit(g)
	for _, s := range ranges {
		if err := hostRangeCheck(s.p, s.n); err != nil {
			return d.errorf("%s: %s %w", what, s.what, err)
		}
	}
	f()
	return nil
}

type hostSpan struct {
	what string
	p    uintptr
	n    int
}

func (d *hostDevice) CopyIn(dst uintptr, src []byte) error {
	return d.touch(fmt.Sprintf("copy %d bytes in", len(src)), func() {
		copy(HostSlice[byte](dst, len(src)), src)
	}, hostSpan{"destination", dst, len(src)})
}

func (d *hostDevice) CopyInAsync(dst uintptr, src []byte, _ Stream) error { return d.CopyIn(dst, src) }

func (d *hostDevice) CopyOut(dst []byte, src uintptr) error {
	return d.touch(fmt.Sprintf("copy %d bytes out", len(dst)), func() {
		copy(dst, HostSlice[byte](src, len(dst)))
	}, hostSpan{"source", src, len(dst)})
}

func (d *hostDevice) CopyAsync(dst, src uintptr, n int, _ Stream) error {
	return d.touch(fmt.Sprintf("copy %d bytes", n), func() {
		copy(HostSlice[byte](dst, n), HostSlice[byte](src, n))
	}, hostSpan{"destination", dst, n}, hostSpan{"source", src, n})
}

func (d *hostDevice) MemsetAsync(dst uintptr, v byte, n int, _ Stream) error {
	return d.touch(fmt.Sprintf("memset %d bytes", n), func() {
		b := HostSlice[byte](dst, n)
		for i := range b {
			b[i] = v
		}
	}, hostSpan{"destination", dst, n})
}

func (d *hostDevice) Launch(name string, grid, block Dim3, smem int, _ Stream, args *Args) (err error) {
	if err := checkLaunch(grid, block, smem, args); err != nil {
		return d.errorf("launch %s: %w", name, err)
	}
	if args == nil {
		args = NewArgs(0)
	}
	k, ok := hostKernels.Load(name)
	if !ok {
		return d.errorf("launch %s: no host twin registered for this kernel", name)
	}
	if err := d.usable(); err != nil {
		return err
	}
	g := hostEnter()
	defer hostExit(g)
	// A twin that follows a bad pointer faults; on this goroutine that
	// becomes a panic recovered below instead of the end of the process
	// (goroutines the twin starts are on their own).
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = d.errorf("kernel %s: %v", name, r)
		}
	}()
	if err := k.(HostKernel)(&HostLaunch{Kernel: name, Grid: grid, Block: block, SharedMem: smem, Args: args}); err != nil {
		return d.errorf("kernel %s: %w", name, err)
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
	r, ok := d.allocs[b.Ptr]
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, d.errorf("export: %w", ErrClosed)
	}
	if !ok {
		return nil, d.errorf("export of %#x, which this device did not allocate", b.Ptr)
	}
	if b.Size < 0 || uintptr(b.Size) > r.hi-r.lo {
		return nil, d.errorf("export of %d bytes at %#x, an allocation of %d", b.Size, b.Ptr, r.hi-r.lo)
	}
	h := make([]byte, len(hostShareTag)+20)
	copy(h, hostShareTag)
	o := len(hostShareTag)
	binary.LittleEndian.PutUint32(h[o:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint64(h[o+4:], uint64(b.Ptr))
	binary.LittleEndian.PutUint64(h[o+12:], uint64(b.Size))
	return h, nil
}

// Import opens a peer's export: the peer's allocation stays mapped until
// this import is closed (CloseImport or Close), even if the peer frees it
// or closes first, so that a kernel twin of this rank never reads unmapped
// memory.
func (d *hostDevice) Import(h Shared) (Buffer, error) {
	o := len(hostShareTag)
	if len(h) != o+20 || string(h[:o]) != hostShareTag {
		return Buffer{}, d.errorf("import: not a host-backend export")
	}
	if pid := binary.LittleEndian.Uint32(h[o:]); pid != uint32(os.Getpid()) {
		return Buffer{}, d.errorf("import: the export is from process %d; the host backend shares memory only between goroutine ranks of one process", pid)
	}
	p, n := uintptr(binary.LittleEndian.Uint64(h[o+4:])), binary.LittleEndian.Uint64(h[o+12:])
	if n > maxHostAlloc {
		return Buffer{}, d.errorf("import: an export of %d bytes", n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Buffer{}, d.errorf("import: %w", ErrClosed)
	}
	hostMem.Lock()
	defer hostMem.Unlock()
	r := hostFindLocked(p)
	if r == nil || r.lo != p || uint64(r.hi-r.lo) < n {
		return Buffer{}, d.errorf("import of [%#x, +%d): the exporter's allocation is gone (freed or its device closed)", p, n)
	}
	r.imports++
	d.imported[p]++
	return Buffer{Ptr: p, Size: int(n)}, nil
}

func (d *hostDevice) CloseImport(b Buffer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil // Close released every import
	}
	if d.imported[b.Ptr] == 0 {
		return d.errorf("close of an import of %#x that is not open", b.Ptr)
	}
	if d.imported[b.Ptr]--; d.imported[b.Ptr] == 0 {
		delete(d.imported, b.Ptr)
	}
	hostDropImports(b.Ptr, 1)
	return nil
}

// hostDropImports closes n imports of the allocation at p.
func hostDropImports(p uintptr, n int) {
	hostMem.Lock()
	var dead []*hostRegion
	for _, r := range hostMem.regions {
		if r.lo == p && r.imports > 0 {
			r.imports -= min(n, r.imports)
			dead = hostSweepLocked()
			break
		}
	}
	hostMem.Unlock()
	unmapAll(dead)
}

// Close frees every allocation of the device and closes its imports.
// Memory that a peer still imports, or that a kernel twin or copy begun
// earlier may still be reading, is unmapped only once that is over.
func (d *hostDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	for p, n := range d.imported {
		hostDropImports(p, n)
	}
	hostMem.Lock()
	var dead []*hostRegion
	for _, r := range d.allocs {
		dead = append(dead, hostReleaseLocked(r)...)
	}
	hostMem.Unlock()
	unmapAll(dead)
	d.allocs, d.imported = nil, nil
	return nil
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
	if issue == nil {
		return nil, d.errorf("capture: nil issue function")
	}
	if err := d.usable(); err != nil {
		return nil, err
	}
	return &hostGraph{issue}, nil
}

func (d *hostDevice) Preload(kernelNames ...string) error {
	if err := d.usable(); err != nil {
		return err
	}
	for _, k := range kernelNames {
		if _, ok := hostKernels.Load(k); !ok {
			return fmt.Errorf("device host:%d: preload: kernel %s has no Go twin (is its package linked?)", d.ordinal, k)
		}
	}
	return nil
}
