// channel_copy.cuh: copy a byte range with a cooperating group of threads
// (a warp, a block, several blocks or the whole grid: the caller numbers the
// threads 0..nthreads-1 and every one of them calls goep_copy with the same
// arguments). It is the engine of memory channel put and get, and of any
// local copy.
//
// The widest access that both addresses allow is used: when dst and src
// agree modulo 16, a few leading bytes bring both to 16-byte alignment, the
// body moves 16-byte vectors with GOEP_COPY_UNROLL loads in flight per
// thread before the matching stores (the remote side of a put or get is an
// NVLink peer, whose latency only many outstanding accesses hide), and the
// trailing bytes go one by one. Addresses that agree only modulo 8, 4 or 2
// use 8-, 4- or 2-byte words the same way; others go byte by byte (correct,
// not fast: keep buffers aligned).
//
// Consecutive threads touch consecutive words, so every warp access is
// coalesced. dst and src must not overlap.
#ifndef GOEP_CHANNEL_COPY_CUH
#define GOEP_CHANNEL_COPY_CUH

#include "common.cuh"

#ifndef GOEP_COPY_UNROLL
#define GOEP_COPY_UNROLL 8
#endif

// 16-byte words move with explicit global-space vector accesses (LDG.128 /
// STG.128 rather than generic ones, also for NVLink peer addresses, which
// are global memory). volatile keeps them in program order relative to the
// semaphore and fence asm around a copy; the U loads of a round are still
// all in flight before the first store.
struct alignas(16) goep_u128 {
  u32 x, y, z, w;
};

template <typename T>
__device__ __forceinline__ T goep_copy_ld(const T* p) {
  return *p;
}
template <typename T>
__device__ __forceinline__ void goep_copy_st(T* p, const T& v) {
  *p = v;
}
template <>
__device__ __forceinline__ goep_u128 goep_copy_ld<goep_u128>(const goep_u128* p) {
  goep_u128 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <>
__device__ __forceinline__ void goep_copy_st<goep_u128>(goep_u128* p, const goep_u128& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" : : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Copies n words of T: rounds of U loads then U stores per thread, then a
// plain loop for the words that do not fill a round.
template <typename T, int U>
__device__ __forceinline__ void goep_copy_words(T* __restrict__ dst, const T* __restrict__ src, u64 n, u32 tid,
                                                u32 nthreads) {
  const u64 stride = nthreads;
  u64 i = tid;
  if (n >= (u64)U * stride) {
    // i < last implies i + (U-1)*stride < n: the whole round is in range.
    const u64 last = n - (u64)(U - 1) * stride;
    for (; i < last; i += (u64)U * stride) {
      T v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        v[u] = goep_copy_ld<T>(src + i + (u64)u * stride);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        goep_copy_st<T>(dst + i + (u64)u * stride, v[u]);
      }
    }
  }
  for (; i < n; i += stride) {
    goep_copy_st<T>(dst + i, goep_copy_ld<T>(src + i));
  }
}

// Copies with T-sized words; dst and src must agree modulo sizeof(T).
template <typename T, int U>
__device__ __forceinline__ void goep_copy_aligned(char* dst, const char* src, u64 bytes, u32 tid, u32 nthreads) {
  const u64 w = sizeof(T);
  u64 head = (w - ((u64)dst & (w - 1))) & (w - 1);
  if (head > bytes) {
    head = bytes;
  }
  for (u64 i = tid; i < head; i += nthreads) {
    dst[i] = src[i];
  }
  dst += head;
  src += head;
  bytes -= head;
  const u64 n = bytes / w;
  goep_copy_words<T, U>((T*)dst, (const T*)src, n, tid, nthreads);
  const u64 done = n * w;
  for (u64 i = tid; i < bytes - done; i += nthreads) {
    dst[done + i] = src[done + i];
  }
}

// Copies bytes from src to dst with threads tid = 0..nthreads-1.
__device__ __forceinline__ void goep_copy(void* dst, const void* src, u64 bytes, u32 tid, u32 nthreads) {
  char* d = (char*)dst;
  const char* s = (const char*)src;
  const u64 skew = (u64)d ^ (u64)s;  // low bits zero where both agree
  if ((skew & 15) == 0) {
    goep_copy_aligned<goep_u128, GOEP_COPY_UNROLL>(d, s, bytes, tid, nthreads);
  } else if ((skew & 7) == 0) {
    goep_copy_aligned<u64, GOEP_COPY_UNROLL>(d, s, bytes, tid, nthreads);
  } else if ((skew & 3) == 0) {
    goep_copy_aligned<u32, GOEP_COPY_UNROLL>(d, s, bytes, tid, nthreads);
  } else if ((skew & 1) == 0) {
    goep_copy_aligned<u16, GOEP_COPY_UNROLL>(d, s, bytes, tid, nthreads);
  } else {
    goep_copy_aligned<u8, GOEP_COPY_UNROLL>(d, s, bytes, tid, nthreads);
  }
}

#endif  // GOEP_CHANNEL_COPY_CUH
