// common.cuh: definitions shared by every goep kernel.
//
// Compiled by NVRTC (11.8 and newer) with no CUDA toolkit headers available:
// nothing here may include <cuda_bf16.h>, <cuda_fp16.h>, <cstdint> or any
// other system header, and neither may the kernels. Types and conversions
// that those headers would provide are defined here, by hand, and mirrored
// bit for bit in Go (kernels/reference.go) so that GPU results can be checked
// against the host.
//
// GOEP_ENABLE_TMA: the Go compiler defines it to 1 only when NVRTC is 12.0 or
// newer AND the target is sm_90 or newer; otherwise to 0 (NVRTC 11.8 cannot
// assemble cp.async.bulk). Every use of Hopper's bulk-copy engine
// (cp.async.bulk*, mbarrier expect-tx, tensor maps) must sit inside
// `#if GOEP_ENABLE_TMA` with a plain load/store path in the #else branch.
//
// Every helper is __device__ __forceinline__ and named goep_*.
#ifndef GOEP_COMMON_CUH
#define GOEP_COMMON_CUH

#ifndef GOEP_ENABLE_TMA
#define GOEP_ENABLE_TMA 0
#endif

// GOEP_NO_FINGERPRINT: 1 compiles the always-on call fingerprints out of
// the collectives and intranode kernels: matched calls then run the
// protocol they ran before fingerprints (no tag bits in signals or packet
// flags, no presence packets, no published words, no launch counters, no
// checks) and mismatched calls are NOT detected. A measurement switch for
// a same-commit A/B, set only by the benchmark harnesses through
// internal/kernelflags ($GOEP_BENCH_NO_FINGERPRINT=1), which adds the define
// to every compile (so to every cache key); 0, the default, everywhere
// else.
#ifndef GOEP_NO_FINGERPRINT
#define GOEP_NO_FINGERPRINT 0
#endif

// ---------------------------------------------------------------------------
// Fixed-width integers (LP64 device ABI: long long is 64 bits).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;

static_assert(sizeof(u8) == 1 && sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8,
              "goep: unexpected unsigned integer widths");
static_assert(sizeof(i8) == 1 && sizeof(i16) == 2 && sizeof(i32) == 4 && sizeof(i64) == 8,
              "goep: unexpected signed integer widths");
static_assert(sizeof(void*) == 8, "goep: kernels assume 64-bit device pointers");

// ---------------------------------------------------------------------------
// Storage types for narrow floats. They carry bits only; arithmetic happens
// in float after conversion.

// bfloat16: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa bits; the top
// half of an IEEE binary32.
struct alignas(2) goep_bf16 {
  u16 bits;
};
typedef goep_bf16 bf16;

// FP8 E4M3 in the "fn" variant used by NVIDIA and OCP: 1 sign bit, 4 exponent
// bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 (0x7f, 0xff) is
// NaN; the largest finite magnitude is 1.75 * 2^8 = 448; subnormals are
// m * 2^-9.
struct alignas(1) goep_fp8_e4m3 {
  u8 bits;
};
typedef goep_fp8_e4m3 fp8_e4m3;

static_assert(sizeof(bf16) == 2, "goep: bf16 must be 2 bytes");
static_assert(sizeof(fp8_e4m3) == 1, "goep: fp8_e4m3 must be 1 byte");

__device__ __forceinline__ u32 goep_f32_as_u32(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float goep_u32_as_f32(u32 u) { return __uint_as_float(u); }

// float -> bf16, round to nearest, ties to even. Overflow rounds to +-inf as
// IEEE requires; subnormals are kept (no flush to zero). Any NaN becomes the
// canonical quiet NaN 0x7fff, sign dropped. Bit-identical to sm_90's
// cvt.rn.bf16.f32 for all 2^32 inputs (checked on an H200).
__device__ __forceinline__ u16 goep_f32_to_bf16_bits(float f) {
  u32 u = goep_f32_as_u32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return 0x7fffu;
  }
  // Adding 0x7fff rounds half-way cases down; the extra lsb of the kept part
  // turns that into round-half-to-even. A carry out of the mantissa bumps the
  // exponent, which is the correct rounded result (up to +-inf).
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

// bf16 -> float is exact: the bf16 bits are the top half of the float.
__device__ __forceinline__ float goep_bf16_bits_to_f32(u16 h) { return goep_u32_as_f32((u32)h << 16); }

__device__ __forceinline__ bf16 goep_f32_to_bf16(float f) {
  bf16 r;
  r.bits = goep_f32_to_bf16_bits(f);
  return r;
}
__device__ __forceinline__ float goep_bf16_to_f32(bf16 h) { return goep_bf16_bits_to_f32(h.bits); }

// float -> FP8 E4M3, round to nearest, ties to even, saturating: every
// finite value of magnitude >= 448 and +-inf become +-448 (0x7e / 0xfe).
// NaN becomes 0x7f. Values that round below the smallest subnormal
// (2^-9) become a zero of the input's sign. Bit-identical to sm_90's
// cvt.rn.satfinite.e4m3x2.f32 for all 2^32 inputs (checked on an H200).
__device__ __forceinline__ u8 goep_f32_to_fp8e4m3_bits(float f) {
  const u32 u = goep_f32_as_u32(f);
  const u32 sign = (u >> 24) & 0x80u;
  const u32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return 0x7fu;
  }
  if (a >= 0x43e00000u) {  // >= 448.0f, including +inf
    return (u8)(sign | 0x7eu);
  }
  if (a >= 0x3c800000u) {  // >= 2^-6: a normal E4M3 value
    // Re-bias the exponent from 127 to 7 (subtract 120 << 23), then drop 20
    // mantissa bits with round-half-to-even. A mantissa carry lands in the
    // exponent, which is right; a < 448 keeps the result <= 0x7e.
    u32 v = a - (120u << 23);
    v += 0x7ffffu + ((v >> 20) & 1u);
    return (u8)(sign | (v >> 20));
  }
  // Subnormal range: the result is round(a / 2^-9) in 0..8 (8 is 2^-6, the
  // smallest normal, whose encoding 0x08 follows 0x07 naturally).
  // a = sig * 2^(e - 150) with sig the 24-bit significand, so
  // a / 2^-9 = sig >> (141 - e).
  const u32 e = a >> 23;  // biased exponent, < 121 here
  if (e < 117) {           // a < 2^-10: below half the smallest subnormal
    return (u8)sign;
  }
  const u32 sig = (a & 0x7fffffu) | 0x800000u;
  const u32 shift = 141u - e;  // 21..24
  u32 q = sig >> shift;
  const u32 rem = sig & ((1u << shift) - 1u);
  const u32 half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) {
    q += 1u;
  }
  return (u8)(sign | q);
}

// FP8 E4M3 -> float is exact for every finite value.
__device__ __forceinline__ float goep_fp8e4m3_bits_to_f32(u8 b) {
  const u32 sign = (u32)(b & 0x80u) << 24;
  const u32 e = (b >> 3) & 0xfu;
  const u32 m = b & 0x7u;
  if ((b & 0x7fu) == 0x7fu) {
    return goep_u32_as_f32(sign | 0x7fc00000u);
  }
  if (e == 0) {
    // m * 2^-9; m < 8 converts to float exactly and the product is exact.
    const float mag = (float)m * 0.001953125f;
    return goep_u32_as_f32(sign | goep_f32_as_u32(mag));
  }
  return goep_u32_as_f32(sign | ((e + 120u) << 23) | (m << 20));
}

__device__ __forceinline__ fp8_e4m3 goep_f32_to_fp8e4m3(float f) {
  fp8_e4m3 r;
  r.bits = goep_f32_to_fp8e4m3_bits(f);
  return r;
}
__device__ __forceinline__ float goep_fp8e4m3_to_f32(fp8_e4m3 v) { return goep_fp8e4m3_bits_to_f32(v.bits); }

// ---------------------------------------------------------------------------
// Test pattern: a 64-bit mix of (index, seed), folded to 32 bits. Mirrored by
// kernels.PatternValue in Go. Index 0 with seed 0 is not 0, so zeroed memory
// never passes a check.
__device__ __forceinline__ u32 goep_pattern_value(u64 i, u32 seed) {
  u64 x = (i + 1ull) * 0x9e3779b97f4a7c15ull;
  x ^= ((u64)seed << 32) | (u64)(seed ^ 0xa5a5a5a5u);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (u32)x ^ (u32)(x >> 32);
}

// ---------------------------------------------------------------------------
// Timers.

// Nanoseconds from the GPU's global timer (comparable across SMs of one GPU;
// its update granularity is coarse, about a microsecond on many parts).
__device__ __forceinline__ u64 goep_globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---------------------------------------------------------------------------
// Memory-ordering helpers on global memory (PTX memory model, sm_70+).
// Pointers are generic addresses of global memory, which includes device
// memory, peer memory mapped through P2P and host memory mapped into the
// device's address space. Scope .gpu orders against other threads of this
// GPU; .sys also against the host and peer GPUs.

__device__ __forceinline__ u32 goep_ld_acquire_gpu_u32(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 goep_ld_acquire_gpu_u64(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 goep_ld_acquire_sys_u32(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u64 goep_ld_acquire_sys_u64(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 goep_ld_relaxed_sys_u32(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void goep_st_release_gpu_u32(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void goep_st_release_gpu_u64(u64* p, u64 v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void goep_st_release_sys_u32(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void goep_st_release_sys_u64(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void goep_st_relaxed_sys_u32(u32* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void goep_fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" : : : "memory"); }
__device__ __forceinline__ void goep_fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" : : : "memory"); }

#endif  // GOEP_COMMON_CUH
