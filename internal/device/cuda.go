package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/kernels"
)

// CUDADeviceCount loads the driver and counts GPUs; the error says why there
// are none to use (no driver, no device).
func CUDADeviceCount() (int, error) {
	if err := cuda.Load(); err != nil {
		return 0, err
	}
	return cuda.DeviceCount()
}

// cudaDevice is one GPU through its primary context.
type cudaDevice struct {
	info     Info
	dev      cuda.Device
	ctx      *cuda.Context
	target   kernels.Target
	compiler *kernels.Compiler
	stream   *cudaStream

	mu      sync.Mutex
	closed  bool
	allocs  map[uintptr]int
	mapped  map[uintptr]*cuda.HostBuffer
	imports map[uintptr]cudaImport
	modules *ctxModules // shared by every Device open on this GPU
}

// ctxModules are the modules loaded into one GPU's primary context, shared
// by every Device of this process open on that GPU. Goroutine ranks that
// share a GPU share its context, and loading a module waits for every
// kernel running in the context: a rank loading its own copy while another
// rank's kernel spins waiting for it would stall until that wait timed out.
// So a module is loaded once per context (Preload loads it before any rank
// launches), and unloaded when the last Device on the GPU closes.
type ctxModules struct {
	mu    sync.Mutex
	refs  int
	mods  map[string]*cuda.Module // by compiler and module name
	funcs sync.Map                // compiler and kernel name -> *cuda.Function
	// reserve sizes the context's local memory once (reserveLocalMemory).
	reserve    sync.Once
	reserveErr error
}

var (
	ctxModulesMu sync.Mutex
	ctxModulesOf = map[int]*ctxModules{} // by GPU ordinal
)

func acquireModules(ordinal int) *ctxModules {
	ctxModulesMu.Lock()
	defer ctxModulesMu.Unlock()
	m := ctxModulesOf[ordinal]
	if m == nil {
		m = &ctxModules{mods: map[string]*cuda.Module{}}
		ctxModulesOf[ordinal] = m
	}
	m.refs++
	return m
}

// releaseModules drops one Device's reference; the last one unloads the
// modules (and reports whether it was the last).
func releaseModules(ctx *cuda.Context, ordinal int, m *ctxModules) (last bool, err error) {
	ctxModulesMu.Lock()
	defer ctxModulesMu.Unlock()
	m.refs--
	if m.refs > 0 {
		return false, nil
	}
	delete(ctxModulesOf, ordinal)
	// The last Device on the GPU: nothing of this process may still run.
	errs := []error{ctx.Synchronize()}
	for _, mod := range m.mods {
		if err := mod.Unload(); err != nil {
			errs = append(errs, err)
		}
	}
	return true, errors.Join(errs...)
}

// cudaImport remembers how a peer buffer was opened, to close it the same way.
type cudaImport struct {
	ipc     bool          // opened with cuIpcOpenMemHandle
	peerCtx *cuda.Context // retained peer context (same-process import)
	refs    int           // Imports of the same memory share one mapping
	key     string        // the IPC handle, to find an existing mapping
}

// OpenCUDA opens GPU ordinal through its primary context, with the process's
// default kernel compiler.
func OpenCUDA(ordinal int) (Device, error) {
	return OpenCUDAWith(ordinal, kernels.Default())
}

// OpenCUDAWith is OpenCUDA with a chosen kernel compiler.
func OpenCUDAWith(ordinal int, compiler *kernels.Compiler) (_ Device, err error) {
	n, err := CUDADeviceCount()
	if err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("device cuda:%d: no such GPU (%d visible)", ordinal, n)
	}
	dev, err := cuda.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	d := &cudaDevice{dev: dev, compiler: compiler, allocs: map[uintptr]int{}, mapped: map[uintptr]*cuda.HostBuffer{}, imports: map[uintptr]cudaImport{}}
	d.info = Info{Kind: CUDA, Ordinal: ordinal}
	if d.info.Name, err = dev.Name(); err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	if d.info.SMs, err = dev.MultiprocessorCount(); err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	if d.info.Major, d.info.Minor, err = dev.ComputeCapability(); err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	mem, err := dev.TotalMem()
	if err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	d.info.MemoryBytes = uint64(mem)
	if d.info.PCIBusID, err = dev.PCIBusID(); err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	d.target = kernels.Target{Major: d.info.Major, Minor: d.info.Minor}
	keepLocalMemory(dev)
	if d.ctx, err = dev.Retain(); err != nil {
		return nil, fmt.Errorf("device cuda:%d: %w", ordinal, err)
	}
	s, err := cuda.NewStream(d.ctx, cuda.StreamNonBlocking, 0)
	if err != nil {
		_ = d.ctx.Release()
		return nil, fmt.Errorf("device cuda:%d: default stream: %w", ordinal, err)
	}
	d.stream = &cudaStream{s: s, owned: true}
	d.modules = acquireModules(ordinal)
	if err := d.reserveLocalMemory(); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	if err := d.warmStream(d.stream); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

// Local memory. The driver sizes a context's local memory (thread stacks
// and register spills) lazily: the first launch of a kernel that needs more
// than the context has grows it, and by default the driver may shrink it
// again afterwards. A resize waits for every kernel running in the context.
// With ranks sharing a GPU that can be a deadlock until the device
// timeout: ranks whose spinning kernels were queued before the resize wait
// for peers whose launches come after it. So every context keeps its local
// memory at the largest size (CU_CTX_LMEM_RESIZE_TO_MAX) and the first
// Device on it launches a kernel with a larger stack than any of goep's
// before anything else runs there. This removes one documented cause of
// such a hold; it did not end the stall it was written for (the first
// notify + dispatch of 8 ranks on one H200 still stalls 20 s in about one
// run in ten, against one in four before: ARCHITECTURE.md, "Ranks sharing
// a GPU").

var lmemFlagSet sync.Map // GPU ordinal -> true once the flag was set

// keepLocalMemory sets CU_CTX_LMEM_RESIZE_TO_MAX on the primary context,
// keeping its other flags. Best effort: a driver that refuses leaves the
// reservation kernel as the only guard.
func keepLocalMemory(dev cuda.Device) {
	if _, done := lmemFlagSet.LoadOrStore(dev.Ordinal(), true); done {
		return
	}
	flags, err := dev.PrimaryContextFlags()
	if err != nil || flags&cuda.CtxLmemResizeToMax != 0 {
		return
	}
	_ = dev.SetPrimaryContextFlags(flags | cuda.CtxLmemResizeToMax)
}

// reserveLocalMemory runs goep_reserve_local_memory once per context, on
// this Device's stream, and waits for it. A kernel module that cannot be
// built (no NVRTC) skips it: every later launch fails then anyway.
func (d *cudaDevice) reserveLocalMemory() error {
	m := d.modules
	m.reserve.Do(func() {
		if _, err := d.Function(KernelReserveLocalMemory); err != nil {
			return
		}
		args := NewArgs(2).Ptr(0).U32(1)
		if err := d.Launch(KernelReserveLocalMemory, D1(1), D1(32), 0, d.stream, args); err != nil {
			m.reserveErr = d.errorf("reserve local memory: %w", err)
			return
		}
		if err := d.stream.Synchronize(); err != nil {
			m.reserveErr = d.errorf("reserve local memory: %w", err)
		}
	})
	return m.reserveErr
}

func (d *cudaDevice) Info() Info { return d.info }

// Context is the GPU's primary context, for layers that need CUDA-only
// features (mapped host memory, VMM, stream memory operations).
func (d *cudaDevice) Context() *cuda.Context { return d.ctx }

func (d *cudaDevice) errorf(format string, a ...any) error {
	return fmt.Errorf("device cuda:%d: "+format, append([]any{d.info.Ordinal}, a...)...)
}

func (d *cudaDevice) Alloc(size int) (Buffer, error) {
	if size < 0 {
		return Buffer{}, d.errorf("alloc of %d bytes", size)
	}
	if size == 0 {
		return Buffer{}, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Buffer{}, ErrClosed
	}
	p, err := cuda.MemAlloc(d.ctx, size)
	if err != nil {
		return Buffer{}, d.errorf("alloc %d bytes: %w", size, err)
	}
	d.allocs[uintptr(p)] = size
	return Buffer{Ptr: uintptr(p), Size: size}, nil
}

func (d *cudaDevice) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	d.mu.Lock()
	_, ok := d.allocs[b.Ptr]
	delete(d.allocs, b.Ptr)
	d.mu.Unlock()
	if !ok {
		return d.errorf("free of %#x, which this device did not allocate", b.Ptr)
	}
	if err := cuda.MemFree(d.ctx, cuda.DevicePtr(b.Ptr)); err != nil {
		return d.errorf("free %#x: %w", b.Ptr, err)
	}
	return nil
}

func (d *cudaDevice) CopyIn(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := cuda.MemcpyHtoD(d.ctx, cuda.DevicePtr(dst), src); err != nil {
		return d.errorf("copy %d bytes in: %w", len(src), err)
	}
	// From pageable memory the driver may return before the DMA lands; wait
	// for it so that work issued next on any stream sees the data.
	if err := d.ctx.NullStream().Synchronize(); err != nil {
		return d.errorf("copy %d bytes in: %w", len(src), err)
	}
	return nil
}

func (d *cudaDevice) CopyInAsync(dst uintptr, src []byte, s Stream) error {
	cs, err := d.stream0(s)
	if err != nil || len(src) == 0 {
		return err
	}
	if err := cuda.MemcpyHtoDAsync(cuda.DevicePtr(dst), src, cs); err != nil {
		return d.errorf("copy %d bytes in: %w", len(src), err)
	}
	return nil
}

func (d *cudaDevice) CopyOut(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := cuda.MemcpyDtoH(d.ctx, dst, cuda.DevicePtr(src)); err != nil {
		return d.errorf("copy %d bytes out: %w", len(dst), err)
	}
	return nil
}

func (d *cudaDevice) stream0(s Stream) (*cuda.Stream, error) {
	if s == nil {
		return d.stream.s, nil
	}
	cs, ok := s.(*cudaStream)
	if !ok {
		return nil, d.errorf("stream of another backend (%T)", s)
	}
	return cs.s, nil
}

func (d *cudaDevice) CopyAsync(dst, src uintptr, n int, s Stream) error {
	if n < 0 {
		return d.errorf("copy of %d bytes", n)
	}
	cs, err := d.stream0(s)
	if err != nil || n == 0 {
		return err
	}
	if err := cuda.MemcpyDtoDAsync(cuda.DevicePtr(dst), cuda.DevicePtr(src), n, cs); err != nil {
		return d.errorf("copy %d bytes: %w", n, err)
	}
	return nil
}

func (d *cudaDevice) MemsetAsync(dst uintptr, v byte, n int, s Stream) error {
	if n < 0 {
		return d.errorf("memset of %d bytes", n)
	}
	cs, err := d.stream0(s)
	if err != nil || n == 0 {
		return err
	}
	if err := cuda.MemsetD8Async(cuda.DevicePtr(dst), v, n, cs); err != nil {
		return d.errorf("memset %d bytes: %w", n, err)
	}
	return nil
}

// Function returns a kernel by name, compiling (or loading from the cache)
// and loading its module on first use.
func (d *cudaDevice) Function(name string) (*cuda.Function, error) {
	key := fmt.Sprintf("%p/%s", d.compiler, name)
	if f, ok := d.modules.funcs.Load(key); ok {
		return f.(*cuda.Function), nil
	}
	m, ok := kernels.ModuleForKernel(name)
	if !ok {
		return nil, d.errorf("kernel %s is in no registered module", name)
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	mods := d.modules
	mods.mu.Lock()
	defer mods.mu.Unlock()
	modKey := fmt.Sprintf("%p/%s", d.compiler, m.Name)
	mod := mods.mods[modKey]
	if mod == nil {
		c, err := d.compiler.Compile(m, d.target)
		if err != nil {
			return nil, d.errorf("%w", err)
		}
		if mod, err = cuda.ModuleLoadData(d.ctx, c.CUBIN); err != nil {
			return nil, d.errorf("load module %s: %w", m.Name, err)
		}
		mods.mods[modKey] = mod
	}
	f, err := mod.Function(name)
	if err != nil {
		return nil, d.errorf("kernel %s: %w", name, err)
	}
	// Querying an attribute loads the kernel's code now even where the
	// user set CUDA_MODULE_LOADING=LAZY (see cuda.Load): a first launch
	// must never have to wait for kernels already running.
	if _, err := f.Attribute(cuda.FuncAttrMaxThreadsPerBlock); err != nil {
		return nil, d.errorf("kernel %s: %w", name, err)
	}
	mods.funcs.Store(key, f)
	return f, nil
}

func (d *cudaDevice) Launch(name string, grid, block Dim3, smem int, s Stream, args *Args) error {
	if err := checkLaunch(grid, block, smem, args); err != nil {
		return d.errorf("launch %s: %w", name, err)
	}
	if args == nil {
		args = NewArgs(0)
	}
	cs, err := d.stream0(s)
	if err != nil {
		return err
	}
	f, err := d.Function(name)
	if err != nil {
		return err
	}
	if err := cuda.LaunchPacked(f, dim3(grid), dim3(block), smem, cs, args.Bytes(), args.Offsets()); err != nil {
		return d.errorf("launch %s: %w", name, err)
	}
	return nil
}

func dim3(d Dim3) cuda.Dim3 {
	one := func(v int) uint32 {
		if v <= 0 {
			return 1
		}
		return uint32(v)
	}
	return cuda.Dim3{X: one(d.X), Y: one(d.Y), Z: one(d.Z)}
}

type cudaStream struct {
	s     *cuda.Stream
	owned bool
}

func (s *cudaStream) Handle() uintptr    { return s.s.Handle() }
func (s *cudaStream) Synchronize() error { return s.s.Synchronize() }
func (s *cudaStream) Close() error {
	if !s.owned {
		return nil
	}
	return s.s.Destroy()
}

// WrapStream makes an engine's CUstream usable as a Stream; closing it does
// not destroy it.
func WrapStream(d Device, handle uintptr) (Stream, error) {
	cd, ok := d.(*cudaDevice)
	if !ok {
		return d.DefaultStream(), nil
	}
	return &cudaStream{s: cuda.WrapStream(cd.ctx, handle)}, nil
}

func (d *cudaDevice) DefaultStream() Stream { return d.stream }

func (d *cudaDevice) NewStream() (Stream, error) {
	s, err := cuda.NewStream(d.ctx, cuda.StreamNonBlocking, 0)
	if err != nil {
		return nil, d.errorf("new stream: %w", err)
	}
	cs := &cudaStream{s: s, owned: true}
	if err := d.warmStream(cs); err != nil {
		_ = s.Destroy()
		return nil, err
	}
	return cs, nil
}

// warmStream runs one empty kernel on a new stream and waits for it. The
// driver finishes setting a stream up at its first launch, and that can wait
// for kernels already running in the context: a rank whose first launch on
// a stream comes while its peers' kernels spin waiting for it would stall
// until their device timeout (ARCHITECTURE.md, "Ranks sharing a GPU"). So
// every stream goep makes does its first launch here, when it is made.
// Without a kernel compiler nothing can launch later either: skipped.
func (d *cudaDevice) warmStream(s *cudaStream) error {
	if _, err := d.Function(KernelFillPattern); err != nil {
		return nil
	}
	if err := d.Launch(KernelFillPattern, D1(1), D1(32), 0, s, NewArgs(3).Ptr(0).U64(0).U32(0)); err != nil {
		return d.errorf("new stream: first launch: %w", err)
	}
	if err := s.Synchronize(); err != nil {
		return d.errorf("new stream: first launch: %w", err)
	}
	return nil
}

type cudaEvent struct{ e *cuda.Event }

func (e *cudaEvent) Record(s Stream) error {
	cs, ok := s.(*cudaStream)
	if !ok {
		return fmt.Errorf("event: stream of another backend (%T)", s)
	}
	return e.e.Record(cs.s)
}
func (e *cudaEvent) Synchronize() error { return e.e.Synchronize() }
func (e *cudaEvent) Close() error       { return e.e.Destroy() }

func (d *cudaDevice) NewEvent() (Event, error) {
	e, err := cuda.NewEvent(d.ctx, 0)
	if err != nil {
		return nil, d.errorf("new event: %w", err)
	}
	return &cudaEvent{e}, nil
}

func (d *cudaDevice) Elapsed(a, b Event) (time.Duration, error) {
	ea, ok1 := a.(*cudaEvent)
	eb, ok2 := b.(*cudaEvent)
	if !ok1 || !ok2 {
		return 0, d.errorf("elapsed between events of another backend")
	}
	ms, err := cuda.ElapsedTime(ea.e, eb.e)
	if err != nil {
		return 0, d.errorf("elapsed: %w", err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// A CUDA export carries the owner's process id, GPU ordinal, address, size
// and a legacy IPC handle. An importer in another process opens the IPC
// handle; an importer in the same process (goroutine ranks) cannot open its
// own process's IPC handle, so it uses peer access to the owner's GPU and the
// address itself, which is valid everywhere under unified addressing.
const cudaShareTag = "cuda1"

func (d *cudaDevice) Export(b Buffer) (Shared, error) {
	d.mu.Lock()
	_, ok := d.allocs[b.Ptr]
	d.mu.Unlock()
	if !ok {
		return nil, d.errorf("export of %#x, which this device did not allocate", b.Ptr)
	}
	ipc, err := cuda.IpcGetMemHandle(d.ctx, cuda.DevicePtr(b.Ptr))
	if err != nil {
		return nil, d.errorf("export: %w", err)
	}
	o := len(cudaShareTag)
	h := make([]byte, o+24+len(ipc))
	copy(h, cudaShareTag)
	binary.LittleEndian.PutUint32(h[o:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[o+4:], uint32(d.info.Ordinal))
	binary.LittleEndian.PutUint64(h[o+8:], uint64(b.Ptr))
	binary.LittleEndian.PutUint64(h[o+16:], uint64(b.Size))
	copy(h[o+24:], ipc[:])
	return h, nil
}

func (d *cudaDevice) Import(h Shared) (Buffer, error) {
	o := len(cudaShareTag)
	var ipc [cuda.IpcHandleSize]byte
	if len(h) != o+24+len(ipc) || string(h[:o]) != cudaShareTag {
		return Buffer{}, d.errorf("import: not a CUDA-backend export")
	}
	pid := binary.LittleEndian.Uint32(h[o:])
	owner := int(binary.LittleEndian.Uint32(h[o+4:]))
	b := Buffer{Ptr: uintptr(binary.LittleEndian.Uint64(h[o+8:])), Size: int(binary.LittleEndian.Uint64(h[o+16:]))}
	copy(ipc[:], h[o+24:])

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Buffer{}, ErrClosed
	}
	if pid != uint32(os.Getpid()) {
		for p, imp := range d.imports {
			if imp.ipc && imp.key == string(ipc[:]) {
				imp.refs++
				d.imports[p] = imp
				b.Ptr = p
				return b, nil
			}
		}
		p, err := cuda.IpcOpenMemHandle(d.ctx, ipc)
		if err != nil {
			return Buffer{}, d.errorf("import from process %d (GPU %d): %w", pid, owner, err)
		}
		b.Ptr = uintptr(p)
		d.imports[b.Ptr] = cudaImport{ipc: true, key: string(ipc[:]), refs: 1}
		return b, nil
	}
	if owner == d.info.Ordinal {
		return b, nil // our own memory: nothing to open
	}
	if imp, ok := d.imports[b.Ptr]; ok {
		imp.refs++
		d.imports[b.Ptr] = imp
		return b, nil
	}
	peerDev, err := cuda.GetDevice(owner)
	if err != nil {
		return Buffer{}, d.errorf("import from GPU %d: %w", owner, err)
	}
	peerCtx, err := peerDev.Retain()
	if err != nil {
		return Buffer{}, d.errorf("import from GPU %d: %w", owner, err)
	}
	if err := d.ctx.EnablePeerAccess(peerCtx); err != nil {
		_ = peerCtx.Release()
		return Buffer{}, d.errorf("import from GPU %d: peer access: %w", owner, err)
	}
	d.imports[b.Ptr] = cudaImport{peerCtx: peerCtx, refs: 1}
	return b, nil
}

func (d *cudaDevice) CloseImport(b Buffer) error {
	d.mu.Lock()
	imp, ok := d.imports[b.Ptr]
	if ok && imp.refs > 1 {
		imp.refs--
		d.imports[b.Ptr] = imp
		d.mu.Unlock()
		return nil
	}
	delete(d.imports, b.Ptr)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	return d.closeImport(b.Ptr, imp)
}

func (d *cudaDevice) closeImport(p uintptr, imp cudaImport) error {
	if imp.ipc {
		return cuda.IpcCloseMemHandle(d.ctx, cuda.DevicePtr(p))
	}
	if imp.peerCtx != nil {
		return imp.peerCtx.Release()
	}
	return nil
}

func (d *cudaDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// This Device's own stream, not the context: other goroutine ranks on
	// this GPU may still run kernels that wait for ranks yet to close.
	keep(d.stream.Synchronize())
	for p, imp := range d.imports {
		keep(d.closeImport(p, imp))
	}
	for p := range d.allocs {
		keep(cuda.MemFree(d.ctx, cuda.DevicePtr(p)))
	}
	for _, hb := range d.mapped {
		keep(hb.Free())
	}
	_, err := releaseModules(d.ctx, d.info.Ordinal, d.modules)
	keep(err)
	keep(d.stream.Close())
	keep(d.ctx.Release())
	d.imports, d.allocs, d.mapped = nil, nil, nil
	if len(errs) > 0 {
		return d.errorf("close: %v", errs)
	}
	return nil
}

func (d *cudaDevice) AllocHostMapped(size int) (HostMapped, error) {
	if size <= 0 {
		return HostMapped{}, d.errorf("host-mapped alloc of %d bytes", size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return HostMapped{}, ErrClosed
	}
	hb, err := cuda.HostAlloc(d.ctx, size, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return HostMapped{}, d.errorf("host-mapped alloc %d bytes: %w", size, err)
	}
	p, err := hb.DevicePointer()
	if err != nil {
		_ = hb.Free()
		return HostMapped{}, d.errorf("host-mapped alloc: %w", err)
	}
	d.mapped[uintptr(p)] = hb
	return HostMapped{Host: hb.Bytes(), Dev: uintptr(p)}, nil
}

func (d *cudaDevice) RegisterHost(p []byte) (uintptr, error) {
	if len(p) == 0 {
		return 0, d.errorf("register host memory: empty range")
	}
	ptr := unsafe.Pointer(&p[0])
	if err := cuda.HostRegister(d.ctx, ptr, len(p), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap); err != nil {
		return 0, d.errorf("register %d bytes of host memory: %w", len(p), err)
	}
	dev, err := cuda.HostDevicePointer(d.ctx, ptr)
	if err != nil {
		_ = cuda.HostUnregister(d.ctx, ptr)
		return 0, d.errorf("register host memory: %w", err)
	}
	return uintptr(dev), nil
}

func (d *cudaDevice) UnregisterHost(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if err := cuda.HostUnregister(d.ctx, unsafe.Pointer(&p[0])); err != nil {
		return d.errorf("unregister host memory: %w", err)
	}
	return nil
}

func (d *cudaDevice) FreeHostMapped(m HostMapped) error {
	d.mu.Lock()
	hb, ok := d.mapped[m.Dev]
	delete(d.mapped, m.Dev)
	d.mu.Unlock()
	if !ok {
		return d.errorf("free of host-mapped %#x, which this device did not allocate", m.Dev)
	}
	return hb.Free()
}

type cudaGraph struct{ exec *cuda.GraphExec }

func (g *cudaGraph) Launch(s Stream) error {
	cs, ok := s.(*cudaStream)
	if !ok {
		return fmt.Errorf("graph: stream of another backend (%T)", s)
	}
	return g.exec.Launch(cs.s)
}

func (g *cudaGraph) Close() error { return g.exec.Destroy() }

// Capture uses relaxed capture mode: goroutines move between OS threads, so
// the thread-scoped modes would judge calls by the wrong thread.
func (d *cudaDevice) Capture(s Stream, issue func() error) (Graph, error) {
	cs, err := d.stream0(s)
	if err != nil {
		return nil, err
	}
	if err := cs.BeginCapture(cuda.CaptureModeRelaxed); err != nil {
		return nil, d.errorf("begin capture: %w", err)
	}
	issueErr := issue()
	g, err := cs.EndCapture()
	if issueErr != nil || err != nil {
		if g != nil {
			_ = g.Destroy()
		}
		if issueErr != nil {
			return nil, d.errorf("capture: %w", issueErr)
		}
		return nil, d.errorf("end capture: %w", err)
	}
	defer g.Destroy()
	exec, err := g.Instantiate()
	if err != nil {
		return nil, d.errorf("instantiate graph: %w", err)
	}
	return &cudaGraph{exec}, nil
}

func (d *cudaDevice) Preload(kernelNames ...string) error {
	done := map[string]bool{}
	for _, k := range kernelNames {
		m, ok := kernels.ModuleForKernel(k)
		if !ok {
			return d.errorf("preload: kernel %s is in no registered module", k)
		}
		if done[m.Name] {
			continue
		}
		done[m.Name] = true
		for _, name := range m.Kernels {
			if _, err := d.Function(name); err != nil {
				return err
			}
		}
	}
	return nil
}
