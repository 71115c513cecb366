package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// GPU tests: each calls requireGPU (directly or through gpuContext) and is
// skipped on machines without a CUDA device.

func TestDeviceInfo(t *testing.T) {
	dev := requireGPU(t)
	v, err := DriverVersion()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, v, 12000)

	name, err := dev.Name()
	require.NoError(t, err)
	assert.NotEmpty(t, name)

	major, minor, err := dev.ComputeCapability()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, major, 7)

	sms, err := dev.MultiprocessorCount()
	require.NoError(t, err)
	assert.Positive(t, sms)

	optin, err := dev.MaxSharedMemoryPerBlockOptin()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, optin, 48<<10)

	l2, err := dev.L2CacheSize()
	require.NoError(t, err)
	assert.Positive(t, l2)

	clk, err := dev.ClockRate()
	require.NoError(t, err)
	assert.Positive(t, clk)

	warp, err := dev.Attribute(AttrWarpSize)
	require.NoError(t, err)
	assert.Equal(t, 32, warp)

	mem, err := dev.TotalMem()
	require.NoError(t, err)
	assert.Greater(t, mem, 1<<30)

	bus, err := dev.PCIBusID()
	require.NoError(t, err)
	assert.Regexp(t, regexp.MustCompile(`^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$`), bus)

	uuid, err := dev.UUID()
	require.NoError(t, err)
	assert.NotEqual(t, [16]byte{}, uuid)

	ok, err := dev.CanAccessPeer(dev)
	require.NoError(t, err)
	t.Logf("%s: %s sm_%d%d, %d SMs, %d MiB, L2 %d KiB, smem optin %d KiB, clock %d MHz, bus %s, self-peer %v",
		dev, name, major, minor, sms, mem>>20, l2>>10, optin>>10, clk/1000, bus, ok)

	_, err = GetDevice(1 << 20)
	assert.True(t, errors.Is(err, ErrInvalidDevice), "%v", err)
}

func TestContextInfo(t *testing.T) {
	ctx := gpuContext(t)
	free, total, err := ctx.MemGetInfo()
	require.NoError(t, err)
	assert.Positive(t, free)
	assert.LessOrEqual(t, free, total)

	least, greatest, err := ctx.StreamPriorityRange()
	require.NoError(t, err)
	assert.LessOrEqual(t, greatest, least)
	s, err := NewStream(ctx, StreamNonBlocking, greatest)
	require.NoError(t, err)
	require.NoError(t, s.Synchronize())
	require.NoError(t, s.Destroy())
	require.NoError(t, s.Destroy(), "second Destroy is a no-op")

	require.NoError(t, ctx.Synchronize())
	assert.Equal(t, 0, ctx.Device().Ordinal())

	// A second reference to the same primary context is the same CUcontext.
	ctx2 := retain(t, ctx.Device())
	assert.Equal(t, ctx.Handle(), ctx2.Handle())
	extra, err := ctx.Device().Retain()
	require.NoError(t, err)
	require.NoError(t, extra.Release())
	assert.Error(t, extra.Release(), "double release must be refused")
}

func TestErrorFromDriver(t *testing.T) {
	ctx := gpuContext(t)
	_, err := MemAlloc(ctx, 1<<50) // 1 PiB
	require.Error(t, err)
	var ce *Error
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, "cuMemAlloc", ce.Op)
	if errors.Is(err, ErrOutOfMemory) {
		assert.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", err.Error())
	}
	t.Logf("1 PiB allocation: %v", err)
}

func TestMemcpyRoundTrip(t *testing.T) {
	ctx := gpuContext(t)
	for i, size := range []int{1, 3, 4, 1000, 4097, 1<<20 + 13, 16<<20 + 5} {
		src := randomBytes(uint64(i+1), size)
		p := memAlloc(t, ctx, size)
		require.NoError(t, MemcpyHtoD(ctx, p, src))
		q := memAlloc(t, ctx, size)
		require.NoError(t, MemcpyDtoD(ctx, q, p, size))
		got := make([]byte, size)
		require.NoError(t, MemcpyDtoH(ctx, got, q))
		require.True(t, bytes.Equal(src, got), "size %d: data differs", size)
	}
}

func TestMemset(t *testing.T) {
	ctx := gpuContext(t)
	const n = 1<<16 + 12
	p := memAlloc(t, ctx, n)
	require.NoError(t, MemsetD8(ctx, p, 0xAB, n))
	got := make([]byte, n)
	require.NoError(t, MemcpyDtoH(ctx, got, p))
	assert.Equal(t, bytes.Repeat([]byte{0xAB}, n), got)

	// 32-bit words in the middle; the bytes around must be untouched.
	require.NoError(t, MemsetD32(ctx, p.Add(8), 0xDEADBEEF, (n-16)/4))
	require.NoError(t, MemcpyDtoH(ctx, got, p))
	assert.Equal(t, bytes.Repeat([]byte{0xAB}, 8), got[:8])
	for i, w := range u32s(got[8 : n-8]) {
		require.Equal(t, uint32(0xDEADBEEF), w, "word %d", i)
	}
	assert.Equal(t, bytes.Repeat([]byte{0xAB}, 8), got[n-8:])

	s := newStream(t, ctx)
	require.NoError(t, MemsetD8Async(p, 0x11, n, s))
	require.NoError(t, MemsetD32Async(p, 0x22222222, 4, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, MemcpyDtoH(ctx, got, p))
	assert.Equal(t, bytes.Repeat([]byte{0x22}, 16), got[:16])
	assert.Equal(t, bytes.Repeat([]byte{0x11}, n-16), got[16:])
}

func TestAsyncCopies(t *testing.T) {
	ctx := gpuContext(t)
	s := newStream(t, ctx)
	const size = 8<<20 + 3
	src := randomBytes(42, size)
	pin := hostAlloc(t, ctx, size, 0)
	out := hostAlloc(t, ctx, size, HostAllocPortable)
	copy(pin.Bytes(), src)
	a := memAlloc(t, ctx, size)
	b := memAlloc(t, ctx, size)

	require.NoError(t, MemcpyHtoDAsync(a, pin.Bytes(), s))
	require.NoError(t, MemcpyDtoDAsync(b, a, size, s))
	require.NoError(t, MemcpyDtoHAsync(out.Bytes(), b, s))
	require.NoError(t, s.Synchronize())
	require.True(t, bytes.Equal(src, out.Bytes()))

	// Pageable Go memory works too (the driver stages it).
	src2 := randomBytes(43, size)
	got := make([]byte, size)
	require.NoError(t, MemcpyHtoDAsync(a, src2, s))
	require.NoError(t, MemcpyDtoHAsync(got, a, s))
	require.NoError(t, s.Synchronize())
	require.True(t, bytes.Equal(src2, got))

	assert.Error(t, MemcpyHtoDAsync(a, src2, nil), "nil stream must be refused")
	assert.NoError(t, MemcpyHtoDAsync(a, nil, s), "empty copy is a no-op")
}

func TestMemAllocAsyncAndPool(t *testing.T) {
	ctx := gpuContext(t)
	supported, err := ctx.Device().Attribute(AttrMemoryPoolsSupported)
	require.NoError(t, err)
	if supported == 0 {
		t.Skip("device has no memory pools")
	}
	pool, err := ctx.Device().DefaultMemPool()
	require.NoError(t, err)
	old, err := pool.Attribute(MemPoolAttrReleaseThreshold)
	require.NoError(t, err)
	require.NoError(t, pool.SetReleaseThreshold(math.MaxUint64))
	t.Cleanup(func() { require.NoError(t, pool.SetReleaseThreshold(old)) })
	th, err := pool.Attribute(MemPoolAttrReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), th)

	s := newStream(t, ctx)
	const n = 1 << 18
	out := hostAlloc(t, ctx, 4*n, 0)
	for iter := 0; iter < 3; iter++ {
		p, err := MemAllocAsync(4*n, s)
		require.NoError(t, err)
		require.NoError(t, MemsetD32Async(p, uint32(0x01010101*(iter+1)), n, s))
		require.NoError(t, MemcpyDtoHAsync(out.Bytes(), p, s))
		require.NoError(t, MemFreeAsync(p, s))
		require.NoError(t, s.Synchronize())
		for i, w := range u32s(out.Bytes()) {
			require.Equal(t, uint32(0x01010101*(iter+1)), w, "iter %d word %d", iter, i)
		}
	}
	reserved, err := pool.Attribute(MemPoolAttrReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, reserved, uint64(4*n), "pool should keep its memory with an infinite threshold")
}

func TestPointerAttributes(t *testing.T) {
	ctx := gpuContext(t)
	p := memAlloc(t, ctx, 1<<20)
	mt, err := PointerMemoryType(p)
	require.NoError(t, err)
	assert.Equal(t, MemoryTypeDevice, mt)
	ord, err := PointerDeviceOrdinal(p.Add(100))
	require.NoError(t, err)
	assert.Equal(t, ctx.Device().Ordinal(), ord)
	start, size, err := PointerRange(p.Add(4096))
	require.NoError(t, err)
	assert.Equal(t, p, start)
	assert.GreaterOrEqual(t, size, 1<<20)

	hb := hostAlloc(t, ctx, 4096, HostAllocDeviceMap|HostAllocPortable)
	dp, err := hb.DevicePointer()
	require.NoError(t, err)
	mt, err = PointerMemoryType(dp)
	require.NoError(t, err)
	assert.Equal(t, MemoryTypeHost, mt)

	_, err = PointerMemoryType(DevicePtr(0x10)) // not a CUDA pointer
	assert.Error(t, err)
}

func TestModuleAndLaunch(t *testing.T) {
	ctx := gpuContext(t)
	m := loadTestModule(t, ctx)
	fill := function(t, m, "fill_u32")
	add := function(t, m, "add_u32")
	assert.Equal(t, "fill_u32", fill.Name())

	regs, err := fill.Attribute(FuncAttrNumRegs)
	require.NoError(t, err)
	assert.Positive(t, regs)
	maxThreads, err := fill.Attribute(FuncAttrMaxThreadsPerBlock)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, maxThreads, 256)
	ptxVer, err := fill.Attribute(FuncAttrPTXVersion)
	require.NoError(t, err)
	assert.Equal(t, 80, ptxVer, "PTX target sm_80")

	_, err = m.Function("no_such_kernel")
	assert.True(t, errors.Is(err, ErrNotFound), "%v", err)

	s := newStream(t, ctx)
	const n = 1<<20 + 77
	p := memAlloc(t, ctx, 4*n)
	args := NewKernelArgs()
	require.NoError(t, Launch(fill, Dim3{X: 128}, Dim3{X: 256}, 0, s, args.Reset().Ptr(p).U32(n).U32(7)))
	require.NoError(t, Launch(add, Dim3{X: 64}, Dim3{X: 128}, 0, s, args.Reset().Ptr(p).U32(n).U32(1000)))
	got := make([]byte, 4*n)
	require.NoError(t, MemcpyDtoHAsync(got, p, s))
	require.NoError(t, s.Synchronize())
	for i, w := range u32s(got) {
		if w != uint32(7*i+1+1000) {
			require.Equal(t, uint32(7*i+1+1000), w, "element %d", i)
		}
	}

	// NULL stream of the function's context.
	require.NoError(t, Launch(add, Dim3{X: 1}, Dim3{X: 32}, 0, nil, args.Reset().Ptr(p).U32(1).U32(1)))
	require.NoError(t, ctx.Synchronize())
	var first [4]byte
	require.NoError(t, MemcpyDtoH(ctx, first[:], p))
	assert.Equal(t, uint32(1+1000+1), binary.NativeEndian.Uint32(first[:]))
}

func TestLaunchMixedParams(t *testing.T) {
	ctx := gpuContext(t)
	m := loadTestModule(t, ctx)
	mixed := function(t, m, "mixed")
	out := memAlloc(t, ctx, 6*8)
	require.NoError(t, MemsetD8(ctx, out, 0xFF, 6*8))
	args := NewKernelArgs().Ptr(out).U8(0xA5).U16(0xBEEF).U32(0xCAFEF00D).U64(0x0123456789ABCDEF).F32(-2.5).F64(math.E)
	require.NoError(t, Launch(mixed, Dim3{X: 1}, Dim3{X: 1}, 0, nil, args))
	require.NoError(t, ctx.Synchronize())
	got := make([]byte, 6*8)
	require.NoError(t, MemcpyDtoH(ctx, got, out))
	ne := binary.NativeEndian
	assert.Equal(t, uint64(0xA5), ne.Uint64(got[0:]))
	assert.Equal(t, uint64(0xBEEF), ne.Uint64(got[8:]))
	assert.Equal(t, uint64(0xCAFEF00D), ne.Uint64(got[16:]))
	assert.Equal(t, uint64(0x0123456789ABCDEF), ne.Uint64(got[24:]))
	assert.Equal(t, uint64(math.Float32bits(-2.5)), ne.Uint64(got[32:]))
	assert.Equal(t, math.Float64bits(math.E), ne.Uint64(got[40:]))
}

func TestModuleLoadErrors(t *testing.T) {
	ctx := gpuContext(t)
	_, err := ModuleLoadData(ctx, []byte(".version 7.8\n.target sm_80\n.address_size 64\nthis is not ptx;\n"))
	require.Error(t, err)
	var mle *ModuleLoadError
	require.True(t, errors.As(err, &mle))
	var ce *Error
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, "cuModuleLoadDataEx", ce.Op)
	t.Logf("bad PTX: %v", err)
	assert.NotEmpty(t, mle.Log, "the JIT log should say what is wrong")

	_, err = ModuleLoadData(ctx, nil)
	assert.Error(t, err)
}

func TestDynamicSharedMemory(t *testing.T) {
	ctx := gpuContext(t)
	optin, err := ctx.Device().MaxSharedMemoryPerBlockOptin()
	require.NoError(t, err)
	smem := 200 << 10
	if optin < smem {
		smem = optin &^ 1023
		t.Logf("device allows %d bytes of shared memory per block; using %d", optin, smem)
	}
	n := smem / 4
	m := loadTestModule(t, ctx)
	fn := function(t, m, "smem_rev")
	out := memAlloc(t, ctx, 4*n)
	args := NewKernelArgs().Ptr(out).U32(uint32(n))

	// Over 48 KiB needs the opt-in attribute.
	err = Launch(fn, Dim3{X: 1}, Dim3{X: 256}, smem, nil, args)
	assert.Error(t, err, "launch with %d bytes of shared memory should fail before the opt-in", smem)

	require.NoError(t, fn.SetAttribute(FuncAttrMaxDynamicSharedSizeBytes, smem))
	v, err := fn.Attribute(FuncAttrMaxDynamicSharedSizeBytes)
	require.NoError(t, err)
	assert.Equal(t, smem, v)
	require.NoError(t, Launch(fn, Dim3{X: 1}, Dim3{X: 256}, smem, nil, args))
	require.NoError(t, ctx.Synchronize())
	got := make([]byte, 4*n)
	require.NoError(t, MemcpyDtoH(ctx, got, out))
	for j, w := range u32s(got) {
		if want := uint32(3*(n-1-j) + 7); w != want {
			require.Equal(t, want, w, "word %d", j)
		}
	}
}

func TestCooperativeLaunch(t *testing.T) {
	ctx := gpuContext(t)
	coop, err := ctx.Device().Attribute(AttrCooperativeLaunch)
	require.NoError(t, err)
	if coop == 0 {
		t.Skip("device does not support cooperative launch")
	}
	sms, err := ctx.Device().MultiprocessorCount()
	require.NoError(t, err)
	m := loadTestModule(t, ctx)
	fn := function(t, m, "grid_barrier")
	const block = 128
	perSM, err := fn.MaxActiveBlocksPerMultiprocessor(block, 0)
	require.NoError(t, err)
	require.Positive(t, perSM)
	grid := perSM * sms
	t.Logf("cooperative grid: %d blocks (%d per SM x %d SMs)", grid, perSM, sms)

	counter := memAlloc(t, ctx, 4)
	out := memAlloc(t, ctx, 4*(grid+1))
	s := newStream(t, ctx)
	require.NoError(t, MemsetD32Async(counter, 0, 1, s))
	require.NoError(t, MemsetD32Async(out, 0, grid+1, s))
	args := NewKernelArgs().Ptr(counter).Ptr(out)
	require.NoError(t, LaunchCooperative(fn, Dim3{X: uint32(grid)}, Dim3{X: block}, 0, s, args))
	require.NoError(t, s.Synchronize())
	got := u32s(readDevice(t, ctx, out, 4*grid))
	for b, v := range got {
		require.Equal(t, uint32(grid), v, "block %d saw the counter at %d: blocks not co-resident", b, v)
	}

	// One block too many cannot be co-resident.
	err = LaunchCooperative(fn, Dim3{X: uint32(grid + 1)}, Dim3{X: block}, 0, s, args)
	assert.True(t, errors.Is(err, ErrCooperativeLaunchTooLarge), "%v", err)
}

func readDevice(tb testing.TB, ctx *Context, p DevicePtr, n int) []byte {
	tb.Helper()
	b := make([]byte, n)
	require.NoError(tb, MemcpyDtoH(ctx, b, p))
	return b
}

func TestMappedHostMemory(t *testing.T) {
	ctx := gpuContext(t)
	canMap, err := ctx.Device().Attribute(AttrCanMapHostMemory)
	require.NoError(t, err)
	if canMap == 0 {
		t.Skip("device cannot map host memory")
	}
	const n = 100003
	hb := hostAlloc(t, ctx, 4*n, HostAllocDeviceMap|HostAllocPortable)
	assert.Equal(t, 4*n, hb.Size())
	assert.NotNil(t, hb.Pointer())
	clear(hb.Bytes())
	dp, err := hb.DevicePointer()
	require.NoError(t, err)
	m := loadTestModule(t, ctx)
	s := newStream(t, ctx)
	require.NoError(t, Launch(function(t, m, "fill_u32"), Dim3{X: 64}, Dim3{X: 256}, 0, s,
		NewKernelArgs().Ptr(dp).U32(n).U32(3)))
	require.NoError(t, s.Synchronize())
	for i, w := range u32s(hb.Bytes()) {
		if w != uint32(3*i+1) {
			require.Equal(t, uint32(3*i+1), w, "element %d", i)
		}
	}
}

func TestEvents(t *testing.T) {
	ctx := gpuContext(t)
	s := newStream(t, ctx)
	start, err := NewEvent(ctx, EventDefault)
	require.NoError(t, err)
	defer start.Destroy()
	end, err := NewEvent(ctx, EventBlockingSync)
	require.NoError(t, err)
	defer end.Destroy()

	done, err := end.Query()
	require.NoError(t, err)
	assert.True(t, done, "an event never recorded is complete")

	m := loadTestModule(t, ctx)
	fill := function(t, m, "fill_u32")
	const n = 64 << 20
	p := memAlloc(t, ctx, 4*n)
	args := NewKernelArgs().Ptr(p).U32(n).U32(5)
	require.NoError(t, start.Record(s))
	for i := 0; i < 4; i++ {
		require.NoError(t, Launch(fill, Dim3{X: 1024}, Dim3{X: 256}, 0, s, args))
	}
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Synchronize())
	done, err = end.Query()
	require.NoError(t, err)
	assert.True(t, done)
	ms, err := ElapsedTime(start, end)
	require.NoError(t, err)
	assert.Greater(t, ms, float32(0))
	t.Logf("4 fills of %d MiB: %.3f ms", 4*n>>20, ms)

	// A second stream waits for the event.
	s2 := newStream(t, ctx)
	require.NoError(t, s2.WaitEvent(end))
	require.NoError(t, s2.Synchronize())

	noTiming, err := NewEvent(ctx, EventDisableTiming)
	require.NoError(t, err)
	defer noTiming.Destroy()
	require.NoError(t, noTiming.Record(s))
	require.NoError(t, noTiming.Synchronize())
	_, err = ElapsedTime(start, noTiming)
	assert.Error(t, err, "timing needs both events created with timing")
}

func TestStreamQuery(t *testing.T) {
	ctx := gpuContext(t)
	flag := memAlloc(t, ctx, 4)
	s := newStream(t, ctx)
	t.Cleanup(func() { _ = MemsetD32(ctx, flag, 1, 1); _ = s.Synchronize() })
	require.NoError(t, MemsetD32(ctx, flag, 0, 1))
	require.NoError(t, s.WaitValue32(flag, 1, WaitValueEQ))
	done, err := s.Query()
	require.NoError(t, err)
	assert.False(t, done, "stream blocked on a wait must not be done")
	require.NoError(t, MemsetD32(ctx, flag, 1, 1))
	require.True(t, waitStream(t, s, 10*time.Second))
}

func TestStreamMemOps(t *testing.T) {
	ctx := gpuContext(t)
	dev := ctx.Device()
	has64, err := dev.Attribute(AttrCanUse64BitStreamMemOps)
	require.NoError(t, err)
	canFlush, err := dev.Attribute(AttrCanFlushRemoteWrites)
	require.NoError(t, err)
	canNor, err := dev.Attribute(AttrCanUseStreamWaitValueNor)
	require.NoError(t, err)
	t.Logf("64-bit stream mem ops %d, flush remote writes %d, wait NOR %d", has64, canFlush, canNor)
	waitFlags := WaitValueGEQ
	if canFlush != 0 {
		waitFlags |= WaitValueFlush
	}

	flags := memAlloc(t, ctx, 16) // u32 at +0, u64 at +8
	out := memAlloc(t, ctx, 8)
	require.NoError(t, MemsetD32(ctx, flags, 0, 4))
	require.NoError(t, MemsetD32(ctx, out, 0, 2))
	a := newStream(t, ctx)
	b := newStream(t, ctx)
	// Runs first among the cleanups: releases a stream that a failed test
	// left waiting, so that freeing memory does not block forever.
	t.Cleanup(func() {
		_ = MemcpyHtoD(ctx, flags, AsBytes([]uint32{1, 0xFF, 2, 1})) // satisfies every wait below
		_ = a.Synchronize()
	})

	require.NoError(t, a.WaitValue32(flags, 1, waitFlags))
	require.NoError(t, MemsetD32Async(out, 42, 1, a))
	require.NoError(t, a.WaitValue32(flags.Add(4), 0xF0, WaitValueAnd))
	require.NoError(t, MemsetD32Async(out.Add(4), 43, 1, a))

	require.False(t, waitStream(t, a, 20*time.Millisecond), "stream passed WaitValue32 before the value was written")
	require.NoError(t, b.WriteValue32(flags, 1, WriteValueDefault))
	require.NoError(t, b.Synchronize())
	// a runs up to the AND wait: out[0] becomes 42, out[1] stays 0.
	ok := false
	for i := 0; i < 1000 && !ok; i++ {
		ok = u32s(readDevice(t, ctx, out, 8))[0] == 42
	}
	require.True(t, ok, "WaitValue32(GEQ) was not released by WriteValue32")
	assert.Equal(t, uint32(0), u32s(readDevice(t, ctx, out, 8))[1])
	done, err := a.Query()
	require.NoError(t, err)
	require.False(t, done, "stream passed WaitValue32(AND) before a matching bit was written")
	require.NoError(t, b.WriteValue32(flags.Add(4), 0x10, WriteValueDefault))
	require.True(t, waitStream(t, a, 10*time.Second), "WaitValue32(AND) was not released")
	assert.Equal(t, []uint32{42, 43}, u32s(readDevice(t, ctx, out, 8)))

	if has64 == 0 {
		err := a.WaitValue64(flags.Add(8), 1, WaitValueEQ)
		assert.True(t, errors.Is(err, ErrNotSupported), "64-bit ops not advertised, got %v", err)
		t.Skip("device does not support 64-bit stream memory operations: 32-bit ops checked")
	}
	require.NoError(t, a.WaitValue64(flags.Add(8), 0x1_0000_0002, WaitValueEQ))
	require.NoError(t, MemsetD32Async(out, 44, 1, a))
	require.False(t, waitStream(t, a, 20*time.Millisecond), "stream passed WaitValue64 before the value was written")
	require.NoError(t, b.WriteValue64(flags.Add(8), 0x1_0000_0002, WriteValueDefault))
	require.True(t, waitStream(t, a, 10*time.Second), "WaitValue64 was not released by WriteValue64")
	assert.Equal(t, uint32(44), u32s(readDevice(t, ctx, out, 8))[0])
}

func TestStreamWaitOnHostFlag(t *testing.T) {
	// The host releases a GPU stream by writing mapped pinned memory: the
	// pattern a CPU proxy uses to signal kernels.
	ctx := gpuContext(t)
	hb := hostAlloc(t, ctx, 64, HostAllocDeviceMap|HostAllocPortable)
	clear(hb.Bytes())
	dflag, err := hb.DevicePointer()
	require.NoError(t, err)
	out := memAlloc(t, ctx, 4)
	require.NoError(t, MemsetD32(ctx, out, 0, 1))
	s := newStream(t, ctx)
	t.Cleanup(func() { // release the stream if the test failed half-way
		binary.NativeEndian.PutUint32(hb.Bytes()[0:4], 7)
		_ = s.Synchronize()
	})
	require.NoError(t, s.WaitValue32(dflag, 7, WaitValueEQ))
	require.NoError(t, MemsetD32Async(out, 99, 1, s))
	require.NoError(t, s.WriteValue32(dflag.Add(4), 1234, WriteValueDefault))
	assert.False(t, waitStream(t, s, 20*time.Millisecond))
	binary.NativeEndian.PutUint32(hb.Bytes()[0:4], 7) // host write, seen by the GPU
	require.True(t, waitStream(t, s, 10*time.Second), "stream not released by the host write")
	assert.Equal(t, uint32(99), u32s(readDevice(t, ctx, out, 4))[0])
	assert.Equal(t, uint32(1234), binary.NativeEndian.Uint32(hb.Bytes()[4:8]), "GPU write to mapped memory")
}

func TestWrapStream(t *testing.T) {
	ctx := gpuContext(t)
	owner, err := NewStream(ctx, StreamNonBlocking, 0)
	require.NoError(t, err)
	w := WrapStream(ctx, owner.Handle())
	assert.Equal(t, owner.Handle(), w.Handle())
	assert.Same(t, ctx, w.Context())
	p := memAlloc(t, ctx, 1024)
	require.NoError(t, MemsetD32Async(p, 0x5a5a5a5a, 256, w))
	require.NoError(t, w.Synchronize())
	require.NoError(t, w.Destroy(), "Destroy of a wrapped stream is a no-op")
	// The stream still works through its owner.
	require.NoError(t, MemsetD32Async(p, 0x01020304, 256, owner))
	require.NoError(t, owner.Synchronize())
	assert.Equal(t, uint32(0x01020304), u32s(readDevice(t, ctx, p, 1024))[255])
	require.NoError(t, owner.Destroy())

	// The NULL stream, wrapped.
	ns := ctx.NullStream()
	assert.Zero(t, ns.Handle())
	require.NoError(t, MemsetD32Async(p, 7, 1, ns))
	require.NoError(t, ns.Synchronize())
	require.NoError(t, ns.Destroy())
}

func TestGraphCaptureReplay(t *testing.T) {
	ctx := gpuContext(t)
	m := loadTestModule(t, ctx)
	add := function(t, m, "add_u32")
	s := newStream(t, ctx)
	const n = 4096 + 5
	in := hostAlloc(t, ctx, 4*n, 0)
	out := hostAlloc(t, ctx, 4*n, 0)
	a := memAlloc(t, ctx, 4*n)
	b := memAlloc(t, ctx, 4*n)
	counter := memAlloc(t, ctx, 4)
	require.NoError(t, MemsetD32(ctx, counter, 0, 1))

	st, err := s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, CaptureStatusNone, st)
	require.NoError(t, s.BeginCapture(CaptureModeThreadLocal))
	st, err = s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, CaptureStatusActive, st)
	require.NoError(t, MemcpyHtoDAsync(a, in.Bytes(), s))
	require.NoError(t, Launch(add, Dim3{X: 8}, Dim3{X: 128}, 0, s, NewKernelArgs().Ptr(a).U32(n).U32(2)))
	require.NoError(t, Launch(add, Dim3{X: 8}, Dim3{X: 128}, 0, s, NewKernelArgs().Ptr(a).U32(n).U32(3)))
	require.NoError(t, Launch(add, Dim3{X: 1}, Dim3{X: 32}, 0, s, NewKernelArgs().Ptr(counter).U32(1).U32(1)))
	require.NoError(t, MemcpyDtoDAsync(b, a, 4*n, s))
	require.NoError(t, MemcpyDtoHAsync(out.Bytes(), b, s))
	g, err := s.EndCapture()
	require.NoError(t, err)
	defer g.Destroy()
	st, err = s.CaptureStatus()
	require.NoError(t, err)
	assert.Equal(t, CaptureStatusNone, st)
	nodes, err := g.NumNodes()
	require.NoError(t, err)
	assert.Equal(t, 6, nodes)

	exec, err := g.Instantiate()
	require.NoError(t, err)
	defer exec.Destroy()
	inw := in.Bytes()
	for r := 0; r < 100; r++ {
		for i := 0; i < n; i++ {
			binary.NativeEndian.PutUint32(inw[4*i:], uint32(7*i+r))
		}
		require.NoError(t, exec.Launch(s))
		require.NoError(t, s.Synchronize())
		for i, w := range u32s(out.Bytes()) {
			if w != uint32(7*i+r+5) {
				require.Equal(t, uint32(7*i+r+5), w, "replay %d element %d", r, i)
			}
		}
	}
	assert.Equal(t, uint32(100), u32s(readDevice(t, ctx, counter, 4))[0])
	require.NoError(t, g.Destroy())
	require.NoError(t, exec.Destroy())
}

func TestPeerAccess(t *testing.T) {
	devs := requireGPUs(t, 2)
	ctx0 := retain(t, devs[0])
	ctx1 := retain(t, devs[1])
	can01, err := devs[0].CanAccessPeer(devs[1])
	require.NoError(t, err)
	can10, err := devs[1].CanAccessPeer(devs[0])
	require.NoError(t, err)
	t.Logf("peer access 0->1 %v, 1->0 %v", can01, can10)

	const size = 4<<20 + 7
	src := randomBytes(7, size)
	p0 := memAlloc(t, ctx0, size)
	p1 := memAlloc(t, ctx1, size)
	require.NoError(t, MemcpyHtoD(ctx0, p0, src))
	require.NoError(t, MemcpyPeer(p1, ctx1, p0, ctx0, size))
	assert.True(t, bytes.Equal(src, readDevice(t, ctx1, p1, size)))

	src2 := randomBytes(8, size)
	require.NoError(t, MemcpyHtoD(ctx1, p1, src2))
	s1 := newStream(t, ctx1)
	require.NoError(t, MemcpyPeerAsync(p0, ctx0, p1, ctx1, size, s1))
	require.NoError(t, s1.Synchronize())
	assert.True(t, bytes.Equal(src2, readDevice(t, ctx0, p0, size)))

	ord, err := PointerDeviceOrdinal(p1)
	require.NoError(t, err)
	assert.Equal(t, 1, ord)

	if !can10 || !can01 {
		t.Skip("no peer access between device 0 and 1: copies checked, kernel access skipped")
	}
	require.NoError(t, ctx1.EnablePeerAccess(ctx0))
	require.NoError(t, ctx1.EnablePeerAccess(ctx0), "already enabled is not an error")
	require.NoError(t, ctx0.EnablePeerAccess(ctx1))
	t.Cleanup(func() {
		assert.NoError(t, ctx1.DisablePeerAccess(ctx0))
		assert.NoError(t, ctx0.DisablePeerAccess(ctx1))
	})
	// A kernel on device 1 writes device 0's memory directly.
	m1 := loadTestModule(t, ctx1)
	const n = size / 4
	require.NoError(t, Launch(function(t, m1, "fill_u32"), Dim3{X: 132}, Dim3{X: 256}, 0, s1,
		NewKernelArgs().Ptr(p0).U32(n).U32(11)))
	require.NoError(t, s1.Synchronize())
	for i, w := range u32s(readDevice(t, ctx0, p0, 4*n)) {
		if w != uint32(11*i+1) {
			require.Equal(t, uint32(11*i+1), w, "element %d", i)
		}
	}
}

func TestIpcMemAndEventAcrossProcesses(t *testing.T) {
	ctx := gpuContext(t)
	ipcEvents, err := ctx.Device().Attribute(AttrIpcEventSupported)
	require.NoError(t, err)
	if ipcEvents == 0 {
		t.Skip("device does not support IPC events")
	}
	const size, seed = 3<<20 + 1, 1234
	p := memAlloc(t, ctx, size)
	require.NoError(t, MemcpyHtoD(ctx, p, randomBytes(seed, size)))
	mh, err := IpcGetMemHandle(ctx, p)
	require.NoError(t, err)

	ev, err := NewEvent(ctx, EventInterprocess|EventDisableTiming)
	require.NoError(t, err)
	defer ev.Destroy()
	s := newStream(t, ctx)
	require.NoError(t, ev.Record(s))
	eh, err := ev.GetIpcHandle()
	require.NoError(t, err)

	_, err = IpcOpenMemHandle(ctx, mh)
	assert.Error(t, err, "a process cannot open its own IPC handle")

	out, err := runHelperProcess(t, "ipc-mem",
		ipcHandleEnv+"="+hexString(mh[:]), ipcEventEnv+"="+hexString(eh[:]),
		ipcSizeEnv+"="+itoa(size), ipcSeedEnv+"="+itoa(seed))
	require.NoError(t, err, "child:\n%s", out)
	assert.Contains(t, out, "ipc ok")
	// The child rewrote the buffer with the next pattern and recorded our event.
	require.NoError(t, ev.Synchronize())
	assert.True(t, bytes.Equal(randomBytes(seed+1, size), readDevice(t, ctx, p, size)), "child's write not visible")
}

func TestVMMInProcess(t *testing.T) {
	ctx := gpuContext(t)
	requireVMM(t, ctx.Device())
	gran, err := VMMGranularity(ctx.Device(), false)
	require.NoError(t, err)
	rec, err := VMMGranularity(ctx.Device(), true)
	require.NoError(t, err)
	require.Positive(t, gran)
	assert.GreaterOrEqual(t, rec, gran)

	const size = 5<<20 + 3
	b, err := AllocVMM(ctx, size, []Device{ctx.Device()})
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	assert.Equal(t, 0, b.Size%gran)
	assert.GreaterOrEqual(t, b.Size, size)
	assert.False(t, b.Imported())

	src := randomBytes(99, b.Size)
	require.NoError(t, MemcpyHtoD(ctx, b.Ptr, src))
	fd, err := b.ExportFD()
	require.NoError(t, err)
	im, err := ImportVMM(ctx, fd, b.Size, nil)
	require.NoError(t, closeFD(fd))
	require.NoError(t, err)
	assert.True(t, im.Imported())
	assert.NotEqual(t, b.Ptr, im.Ptr, "a second mapping of the same memory")
	assert.True(t, bytes.Equal(src, readDevice(t, ctx, im.Ptr, b.Size)))

	// Writes through one mapping show through the other; kernels work on both.
	m := loadTestModule(t, ctx)
	require.NoError(t, Launch(function(t, m, "fill_u32"), Dim3{X: 64}, Dim3{X: 256}, 0, nil,
		NewKernelArgs().Ptr(im.Ptr).U32(uint32(b.Size/4)).U32(13)))
	require.NoError(t, ctx.Synchronize())
	for i, w := range u32s(readDevice(t, ctx, b.Ptr, b.Size)) {
		if w != uint32(13*i+1) {
			require.Equal(t, uint32(13*i+1), w, "element %d", i)
		}
	}
	mt, err := PointerMemoryType(im.Ptr)
	require.NoError(t, err)
	assert.Equal(t, MemoryTypeDevice, mt)

	require.NoError(t, im.Close())
	require.NoError(t, im.Close(), "Close is idempotent")
	// The original mapping survives the other's Close.
	assert.Equal(t, uint32(1), u32s(readDevice(t, ctx, b.Ptr, 4))[0])
}

func TestVMMAcrossProcesses(t *testing.T) {
	ctx := gpuContext(t)
	requireVMM(t, ctx.Device())
	const seed = 555
	b, err := AllocVMM(ctx, 3<<20, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	require.NoError(t, MemcpyHtoD(ctx, b.Ptr, randomBytes(seed, b.Size)))
	fd, err := b.ExportFD()
	require.NoError(t, err)
	out, err := runHelperProcessWithFD(t, "vmm-import", fd,
		ipcSizeEnv+"="+itoa(b.Size), ipcSeedEnv+"="+itoa(seed))
	require.NoError(t, err, "child:\n%s", out)
	assert.Contains(t, out, "vmm ok")
	assert.True(t, bytes.Equal(randomBytes(seed+1, b.Size), readDevice(t, ctx, b.Ptr, b.Size)), "child's write not visible")
}

func requireVMM(tb testing.TB, dev Device) {
	tb.Helper()
	vmm, err := dev.Attribute(AttrVirtualMemoryManagementSupported)
	require.NoError(tb, err)
	fdOK, err := dev.Attribute(AttrHandleTypePosixFileDescriptorSupported)
	require.NoError(tb, err)
	if vmm == 0 || fdOK == 0 {
		tb.Skipf("device lacks VMM (%d) or POSIX fd handles (%d)", vmm, fdOK)
	}
}

func TestHotPathsDoNotAllocate(t *testing.T) {
	ctx := gpuContext(t)
	s := newStream(t, ctx)
	ev, err := NewEvent(ctx, EventDisableTiming)
	require.NoError(t, err)
	defer ev.Destroy()
	m := loadTestModule(t, ctx)
	noop := function(t, m, "noop")
	fill := function(t, m, "fill_u32")
	pin := hostAlloc(t, ctx, 64, 0)
	p := memAlloc(t, ctx, 64)
	args := NewKernelArgs()

	check := func(name string, f func() error) {
		require.NoError(t, f())
		allocs := testing.AllocsPerRun(200, func() {
			if err := f(); err != nil {
				panic(err)
			}
		})
		assert.Zero(t, allocs, "%s allocates", name)
	}
	check("Stream.Query", func() error { _, err := s.Query(); return err })
	check("Event.Record", func() error { return ev.Record(s) })
	check("Event.Query", func() error { _, err := ev.Query(); return err })
	check("Launch(noop)", func() error { return Launch(noop, Dim3{X: 1}, Dim3{X: 32}, 0, s, nil) })
	check("Launch(fill)", func() error {
		return Launch(fill, Dim3{X: 1}, Dim3{X: 32}, 0, s, args.Reset().Ptr(p).U32(16).U32(1))
	})
	check("MemcpyHtoDAsync", func() error { return MemcpyHtoDAsync(p, pin.Bytes()[:4], s) })
	check("MemcpyDtoHAsync", func() error { return MemcpyDtoHAsync(pin.Bytes()[:4], p, s) })
	check("MemsetD32Async", func() error { return MemsetD32Async(p, 1, 4, s) })
	check("WriteValue32", func() error { return s.WriteValue32(p, 1, WriteValueDefault) })
	require.NoError(t, s.Synchronize())
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte(digits[c>>4])
		sb.WriteByte(digits[c&15])
	}
	return sb.String()
}

// TestContextBinding checks the bind-inside-the-call design: whatever
// context the OS thread has current (none, or another device's), each call
// runs in the context it was given.
func TestContextBinding(t *testing.T) {
	dev := requireGPU(t)
	n, err := DeviceCount()
	require.NoError(t, err)
	ctxs := []*Context{retain(t, dev)}
	if n >= 2 {
		d1, err := GetDevice(1)
		require.NoError(t, err)
		ctxs = append(ctxs, retain(t, d1))
	} else {
		t.Log("one GPU: checking rebinding after the thread's context was cleared")
	}

	runtime.LockOSThread()
	for i := 0; i < 20; i++ {
		require.NoError(t, bindOnly(&Context{})) // clear this thread's current context
		ctx := ctxs[i%len(ctxs)]
		p, err := MemAlloc(ctx, 4096)
		require.NoError(t, err)
		ord, err := PointerDeviceOrdinal(p)
		require.NoError(t, err)
		require.Equal(t, ctx.Device().Ordinal(), ord, "allocation landed on the wrong device")
		require.NoError(t, MemsetD32(ctx, p, uint32(i), 1024))
		require.Equal(t, uint32(i), u32s(readDevice(t, ctx, p, 4096))[1023])
		require.NoError(t, MemFree(ctx, p))
	}
	runtime.UnlockOSThread()

	// Many goroutines, contexts interleaved on whatever threads they get.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				ctx := ctxs[(g+i)%len(ctxs)]
				p, err := MemAlloc(ctx, 256)
				if err != nil {
					errs <- err
					return
				}
				ord, err := PointerDeviceOrdinal(p)
				if err == nil && ord != ctx.Device().Ordinal() {
					err = fmt.Errorf("goroutine %d: allocation on device %d, want %d", g, ord, ctx.Device().Ordinal())
				}
				if err == nil {
					err = MemsetD8(ctx, p, byte(g), 256)
				}
				if err == nil {
					b := make([]byte, 256)
					if err = MemcpyDtoH(ctx, b, p); err == nil && b[255] != byte(g) {
						err = fmt.Errorf("goroutine %d: read %d", g, b[255])
					}
				}
				if ferr := MemFree(ctx, p); err == nil {
					err = ferr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
