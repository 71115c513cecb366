// doctor.cu: small kernels used by `ep-bench doctor` and the GPU tests to
// check that a GPU, its memory paths and our conversions behave. Results are
// compared against the Go reference in kernels/reference.go.
//
// All kernels use grid-stride loops, so any launch shape covers any n.
#include "common.cuh"

// dst[i] = goep_pattern_value(i, seed) for i < n.
extern "C" __global__ void goep_fill_pattern(u32* dst, u64 n, u32 seed) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = goep_pattern_value(i, seed);
  }
}

// *mismatches += number of i < n with src[i] != goep_pattern_value(i, seed).
// The caller zeroes *mismatches before the launch.
extern "C" __global__ void goep_check_pattern(const u32* src, u64 n, u32 seed, u64* mismatches) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  u64 bad = 0;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    bad += (src[i] != goep_pattern_value(i, seed)) ? 1ull : 0ull;
  }
  if (bad != 0) {
    atomicAdd((unsigned long long*)mismatches, (unsigned long long)bad);
  }
}

// Stores value to *flag with release semantics at system scope, so a host
// thread polling host-mapped memory sees it after everything this kernel's
// stream wrote before. Launch with one thread (extra threads do nothing).
extern "C" __global__ void goep_write_host_flag(volatile u32* flag, u32 value) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    goep_st_release_sys_u32((u32*)flag, value);
  }
}

// Runs common.cuh's conversions on in[0..n): float -> bf16 -> float and
// float -> fp8 e4m3 -> float. Expected results: kernels.Float32ToBF16,
// BF16ToFloat32, Float32ToFP8E4M3 and FP8E4M3ToFloat32 in Go.
extern "C" __global__ void goep_convert_test(const float* in, u16* bf16_out, u8* fp8_out,
                                             float* bf16_back, float* fp8_back, u64 n) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = in[i];
    const u16 h = goep_f32_to_bf16_bits(x);
    const u8 q = goep_f32_to_fp8e4m3_bits(x);
    bf16_out[i] = h;
    fp8_out[i] = q;
    bf16_back[i] = goep_bf16_bits_to_f32(h);
    fp8_back[i] = goep_fp8e4m3_bits_to_f32(q);
  }
}

// Sizes the context's local memory (stack) for GOEP_LOCAL_RESERVE_WORDS
// words a thread before any goep kernel runs. The driver grows local
// memory at the first launch that needs more than it has, and a resize
// waits for every kernel running in the context: when ranks share a GPU,
// a spinning kernel of one rank would hold back the launch of the peer it
// waits for (internal/device: reserveLocalMemory). goep's kernels need far
// less than this; the volatile array keeps the compiler from removing it.
#define GOEP_LOCAL_RESERVE_WORDS 128
extern "C" __global__ void goep_reserve_local_memory(u32* out, u32 seed) {
  volatile u32 stack[GOEP_LOCAL_RESERVE_WORDS];
  for (u32 i = 0; i < GOEP_LOCAL_RESERVE_WORDS; ++i) {
    stack[i] = seed * i + threadIdx.x;
  }
  if (out != nullptr && threadIdx.x == 0) {
    *out = stack[seed % GOEP_LOCAL_RESERVE_WORDS];
  }
}
