// CPU emulation of the CUDA built-ins the collective kernels use: one OS
// thread per CUDA thread, std::barrier for __syncthreads, per-block shared
// memory, GCC atomics. The PTX helpers themselves are replaced in
// kernels_gen.h (gen.go).
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct EmuDim {
  unsigned x, y, z;
};

struct EmuBlock {
  std::barrier<> bar;
  std::vector<int> flags;
  alignas(16) unsigned char shm[64 << 10];
  explicit EmuBlock(int n) : bar(n), flags(n) {}
};

struct EmuCtx {
  EmuDim tid, bid, bdim, gdim;
  EmuBlock* block;
  size_t shm_off;
};
extern thread_local EmuCtx emu;
#define threadIdx (emu.tid)
#define blockIdx (emu.bid)
#define blockDim (emu.bdim)
#define gridDim (emu.gdim)

// Every thread of a block declares its __shared__ variables in the same
// order, so the same offsets (and addresses) come back to all of them.
template <class T>
T* emu_shared() {
  size_t a = alignof(T) < 16 ? 16 : alignof(T);
  emu.shm_off = (emu.shm_off + a - 1) / a * a;
  T* p = (T*)(emu.block->shm + emu.shm_off);
  emu.shm_off += sizeof(T);
  return p;
}

inline unsigned long long emu_now_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
inline void emu_yield() { std::this_thread::yield(); }

template <class T>
inline T min(T a, T b) {
  return a < b ? a : b;
}
template <class T>
inline T max(T a, T b) {
  return a > b ? a : b;
}

inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  unsigned long long cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return cur;
}
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}

inline void __syncthreads() { emu.block->bar.arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  emu.block->flags[emu.tid.x] = p;
  __syncthreads();
  int r = 0;
  for (int f : emu.block->flags) r |= (f != 0);
  __syncthreads();
  return r;
}
