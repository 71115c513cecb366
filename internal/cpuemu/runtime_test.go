package cpuemu

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// selftest exercises the runtime's CUDA features, each against a result
// computed here independently.
const selftest = `#include "common.cuh"
// Per block: a shared sum of thread ids through atomics and a barrier, an
// inclusive warp scan through __shfl_up_sync, a ballot of odd lanes, and a
// value broadcast from lane 3.
extern "C" __global__ void emu_t_block(u32* out) {
  __shared__ u32 sum;
  __shared__ u32 arr[64];
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  atomicAdd(&sum, threadIdx.x + 1);
  if (threadIdx.x < 64) arr[threadIdx.x] = threadIdx.x;
  __syncthreads();
  u32 v = threadIdx.x;
  for (int off = 1; off < 32; off <<= 1) {
    const u32 n = __shfl_up_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) >= (u32)off) v += n;
  }
  const u32 odd = __ballot_sync(0xffffffffu, threadIdx.x & 1);
  const u32 b = __shfl_sync(0xffffffffu, threadIdx.x * 7, 3);
  const int any = __syncthreads_or(threadIdx.x == blockDim.x - 1);
  u32* o = out + 5 * (blockIdx.x * blockDim.x + threadIdx.x);
  o[0] = sum; o[1] = v; o[2] = odd; o[3] = b; o[4] = any + arr[(threadIdx.x + 1) % 64];
}
// A thread returning early leaves the block's barriers.
extern "C" __global__ void emu_t_exit(u32* out) {
  if (threadIdx.x % 2) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
// Release/acquire between blocks through the PTX helpers: block 0 writes
// data then releases a flag, block 1 acquires it and copies the data.
extern "C" __global__ void emu_t_flag(u32* data, u32* flag, u32* out, u64 n) {
  if (blockIdx.x == 0) {
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) data[i] = (u32)i * 3u + 1u;
    __syncthreads();
    if (threadIdx.x == 0) goep_st_release_sys_u32(flag, 1);
  } else {
    if (threadIdx.x == 0) while (goep_ld_acquire_sys_u32(flag) != 1) {}
    __syncthreads();
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) out[i] = data[i];
  }
}
// Waits for a flag nobody sets: the launch must fail, not hang.
extern "C" __global__ void emu_t_hang(u32* flag) {
  if (threadIdx.x == 1) while (goep_ld_acquire_gpu_u32(flag) != 1) {}
  __syncthreads();
}
extern "C" __global__ void emu_t_dyn(u32* out, u32 n) {
  extern __shared__ u32 dyn[];
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) dyn[i] = i + blockIdx.x;
  __syncthreads();
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = dyn[n - 1 - i];
}
`

func withSelftest(t *testing.T) {
	t.Helper()
	setSources(func() map[string]string {
		m := kernels.Sources()
		m["emu_selftest.cu"] = selftest
		return m
	})
	t.Cleanup(func() { setSources(nil) })
}

func openT(t *testing.T, limit time.Duration) *Device {
	t.Helper()
	needCompiler(t)
	d, err := Open(0, Options{WaitLimit: limit})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func alloc(t *testing.T, d *Device, n int) uintptr {
	t.Helper()
	b, err := d.Alloc(n)
	require.NoError(t, err)
	require.NoError(t, d.CopyIn(b.Ptr, make([]byte, n)))
	return b.Ptr
}

func words(t *testing.T, d *Device, p uintptr, n int) []uint32 {
	t.Helper()
	b := make([]byte, 4*n)
	require.NoError(t, d.CopyOut(b, p))
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

func TestRuntimeBlockFeatures(t *testing.T) {
	withSelftest(t)
	d := openT(t, time.Minute)
	const blocks, threads = 3, 96
	out := alloc(t, d, 4*5*blocks*threads)
	require.NoError(t, d.Launch("emu_t_block", device.D1(blocks), device.D1(threads), 0, nil, device.NewArgs(1).Ptr(out)))
	got := words(t, d, out, 5*blocks*threads)
	for b := 0; b < blocks; b++ {
		for x := 0; x < threads; x++ {
			o := got[5*(b*threads+x):]
			require.Equal(t, uint32(threads*(threads+1)/2), o[0], "block sum, block %d thread %d", b, x)
			lane, w := x%32, x/32*32
			require.Equal(t, uint32((w+lane)*(w+lane+1)/2-(w-1)*w/2), o[1], "scan, thread %d", x)
			require.Equal(t, uint32(0xaaaaaaaa), o[2], "ballot")
			require.Equal(t, uint32((w+3)*7), o[3], "broadcast")
			require.Equal(t, uint32(1+(x+1)%64), o[4], "syncthreads_or and shared array, thread %d", x)
		}
	}
}

func TestRuntimeExitedThreadsLeaveBarriers(t *testing.T) {
	withSelftest(t)
	d := openT(t, time.Minute)
	out := alloc(t, d, 4*64)
	require.NoError(t, d.Launch("emu_t_exit", device.D1(1), device.D1(64), 0, nil, device.NewArgs(1).Ptr(out)))
	for i, v := range words(t, d, out, 64) {
		require.Equal(t, uint32(1-i%2), v, "thread %d", i)
	}
}

func TestRuntimeReleaseAcquireAcrossBlocks(t *testing.T) {
	withSelftest(t)
	d := openT(t, time.Minute)
	const n = 1000
	data, flag, out := alloc(t, d, 4*n), alloc(t, d, 64), alloc(t, d, 4*n)
	require.NoError(t, d.Launch("emu_t_flag", device.D1(2), device.D1(64), 0, nil,
		device.NewArgs(4).Ptr(data).Ptr(flag).Ptr(out).U64(n)))
	for i, v := range words(t, d, out, n) {
		require.Equal(t, uint32(i*3+1), v, "word %d", i)
	}
}

func TestRuntimeDynamicSharedMemory(t *testing.T) {
	withSelftest(t)
	d := openT(t, time.Minute)
	n := 100 + rand.IntN(200)
	out := alloc(t, d, 4*2*n)
	require.NoError(t, d.Launch("emu_t_dyn", device.D1(2), device.D1(64), 4*n, nil, device.NewArgs(2).Ptr(out).U32(uint32(n))))
	got := words(t, d, out, 2*n)
	for b := 0; b < 2; b++ {
		for i := 0; i < n; i++ {
			require.Equal(t, uint32(n-1-i+b), got[b*n+i])
		}
	}
}

// A wait that never ends fails the launch within the wait limit and names
// the barrier; wrong arguments fail before any thread starts.
func TestRuntimeFailures(t *testing.T) {
	withSelftest(t)
	d := openT(t, 2*time.Second)
	flag := alloc(t, d, 64)
	err := d.Launch("emu_t_hang", device.D1(1), device.D1(32), 0, nil, device.NewArgs(1).Ptr(flag))
	require.Error(t, err)
	require.Contains(t, err.Error(), "__syncthreads waited longer")

	err = d.Launch("emu_t_flag", device.D1(2), device.D1(32), 0, nil, device.NewArgs(3).Ptr(flag).Ptr(flag).Ptr(flag))
	require.ErrorContains(t, err, "parameters take 32 bytes, the launch packed 24")
	err = d.Launch("emu_t_flag", device.D1(2), device.D1(32), 0, nil, device.NewArgs(3).Ptr(flag).Ptr(flag).Ptr(flag).U32(1))
	require.ErrorContains(t, err, "parameters take 32 bytes, the launch packed 28")
	require.ErrorContains(t, d.Launch("emu_no_such", device.D1(1), device.D1(1), 0, nil, nil), "no kernel emu_no_such")
	require.ErrorContains(t, d.Launch("emu_t_exit", device.D1(1), device.D1(2048), 0, nil, device.NewArgs(1).Ptr(flag)), "1024 threads")
	// A null pointer is a fault, not a crash.
	err = d.Launch("emu_t_flag", device.D1(2), device.D1(32), 0, nil, device.NewArgs(4).Ptr(flag).Ptr(0).Ptr(flag).U64(1))
	require.ErrorContains(t, err, "null pointer")
}

func TestTranslateAsm(t *testing.T) {
	src := `x = 1; // asm("ignored");
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" : : "l"(p), "r"(d1), "r"(flag), "r"(d2),
               "r"(flag) : "memory");
  asm volatile("brkpt;");
  __shared__ u64 s_x[4][8];
  __shared__ const char* s_in[GOEP_N];
  extern __shared__ __align__(16) char smem[];
`
	out, unk, err := translate("t.cu", src)
	require.NoError(t, err)
	require.Equal(t, strings.Count(src, "\n"), strings.Count(out, "\n"), "lines kept")
	require.Contains(t, out, `// asm("ignored");`)
	require.Contains(t, out, `(v) = emu_ld_u32((p), __ATOMIC_ACQUIRE);`)
	require.Contains(t, out, `emu_pack2((d1), (flag)), emu_pack2((d2), (flag))`)
	require.Contains(t, out, `emu_unsupported_ptx("brkpt;")`)
	require.Equal(t, []string{"t.cu:5: brkpt;"}, unk)
	require.Contains(t, out, `u64 (&s_x)[4][8] = emu_shared_var<u64[4][8]>(&emu_shk_1_s_x);`)
	require.Contains(t, out, `const char* (&s_in)[GOEP_N] = emu_shared_var<const char*[GOEP_N]>(&emu_shk_2_s_in);`)
	require.Contains(t, out, `char* smem = (char*)emu_dyn_shared();`)

	// An asm statement over lines of a macro keeps the continuations.
	out, _, err = translate("t.cu", "#define F(p, v) \\\n  asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" \\\n  : \"=r\"(v) : \"l\"(p)); \\\n  x = 1\n")
	require.NoError(t, err)
	require.Equal(t, "#define F(p, v) \\\n  { (v) = emu_ld_u32((p), __ATOMIC_ACQUIRE); } \\\n \\\n  x = 1\n", out)

	_, _, err = translate("t.cu", "__shared__ int a = 3;")
	require.ErrorContains(t, err, "cannot rewrite")
}
