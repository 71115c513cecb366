// CPU emulation of the CUDA features the intranode kernels use: one OS
// thread per CUDA thread, std::barrier for __syncthreads and warp
// collectives, per-block shared memory, atomics for the PTX helpers.
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <string>
#include <functional>
#include <memory>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define GOEP_OFFSETOF(T, f) __builtin_offsetof(T, f)

struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct EmuDim { unsigned x, y, z; };

struct EmuWarp {
  std::barrier<> bar{32};
  uint64_t buf[32];
};
struct EmuBlock {
  std::barrier<> bar;
  std::vector<EmuWarp*> warps;
  std::vector<int> flags;
  alignas(16) unsigned char shm[64 << 10];
  explicit EmuBlock(int n) : bar(n), flags(n) {
    for (int i = 0; i < n / 32; ++i) warps.push_back(new EmuWarp());
  }
  ~EmuBlock() {
    for (auto* w : warps) delete w;
  }
};
struct EmuCtx {
  EmuDim tid, bid, bdim, gdim;
  EmuBlock* block;
  size_t shm_off;
  size_t dyn_off;
};
extern thread_local EmuCtx emu;
#define threadIdx (emu.tid)
#define blockIdx (emu.bid)
#define blockDim (emu.bdim)
#define gridDim (emu.gdim)

template <class T>
T* emu_shared() {
  size_t a = alignof(T) < 16 ? 16 : alignof(T);
  emu.shm_off = (emu.shm_off + a - 1) / a * a;
  T* p = (T*)(emu.block->shm + emu.shm_off);
  emu.shm_off += sizeof(T);
  return p;
}
inline void* emu_dyn_shared() { return emu.block->shm + emu.dyn_off; }

template <class T>
inline T min(T a, T b) { return a < b ? a : b; }

inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

inline void __syncthreads() { emu.block->bar.arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  emu.block->flags[emu.tid.x] = p;
  __syncthreads();
  int r = 0;
  for (int f : emu.block->flags) r |= (f != 0);
  __syncthreads();
  return r;
}
inline EmuWarp& emu_warp() { return *emu.block->warps[emu.tid.x / 32]; }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar.arrive_and_wait(); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  EmuWarp& w = emu_warp();
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  w.buf[emu.tid.x % 32] = b;
  w.bar.arrive_and_wait();
  uint64_t r = w.buf[src & 31];
  w.bar.arrive_and_wait();
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  EmuWarp& w = emu_warp();
  int lane = emu.tid.x % 32;
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  w.buf[lane] = b;
  w.bar.arrive_and_wait();
  uint64_t r = lane >= (int)delta ? w.buf[lane - delta] : b;
  w.bar.arrive_and_wait();
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}
inline unsigned __ballot_sync(unsigned, int pred) {
  EmuWarp& w = emu_warp();
  w.buf[emu.tid.x % 32] = pred != 0;
  w.bar.arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)w.buf[i] << i;
  w.bar.arrive_and_wait();
  return r;
}

typedef unsigned long long emu_u64;
inline emu_u64 goep_globaltimer() {
  return (emu_u64)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define EMU_LD(name, T, order, yld)                                        \
  inline T name(const T* p) {                                                 \
    if (yld) std::this_thread::yield();                                       \
    return __atomic_load_n(p, order);                                         \
  }
#define EMU_ST(name, T, order) \
  inline void name(T* p, T v) { __atomic_store_n(p, v, order); }
EMU_LD(goep_ld_acquire_gpu_u32, unsigned, __ATOMIC_ACQUIRE, true)
EMU_LD(goep_ld_acquire_gpu_u64, emu_u64, __ATOMIC_ACQUIRE, true)
EMU_LD(goep_ld_acquire_sys_u32, unsigned, __ATOMIC_ACQUIRE, true)
EMU_LD(goep_ld_acquire_sys_u64, emu_u64, __ATOMIC_ACQUIRE, true)
EMU_LD(goep_ld_relaxed_sys_u32, unsigned, __ATOMIC_RELAXED, false)
EMU_LD(goep_chan_ld_relaxed_sys_u64, emu_u64, __ATOMIC_RELAXED, true)
EMU_ST(goep_st_release_gpu_u32, unsigned, __ATOMIC_RELEASE)
EMU_ST(goep_st_release_gpu_u64, emu_u64, __ATOMIC_RELEASE)
EMU_ST(goep_st_release_sys_u32, unsigned, __ATOMIC_RELEASE)
EMU_ST(goep_st_release_sys_u64, emu_u64, __ATOMIC_RELEASE)
EMU_ST(goep_st_relaxed_sys_u32, unsigned, __ATOMIC_RELAXED)
inline void goep_fence_acq_rel_gpu() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void goep_fence_acq_rel_sys() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// Relaxed: the fence before it (goep_fence_acq_rel_sys) orders.
inline void goep_in_red_add_relaxed_sys_u64(emu_u64* p, emu_u64 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline uint4 goep_in_ld_nc_v4(const void* p) { uint4 v; memcpy(&v, p, 16); return v; }
inline uint4 goep_in_ld_peer_v4(const void* p) { uint4 v; memcpy(&v, p, 16); return v; }
inline float goep_in_ld_peer_f32(const float* p) { return *p; }
inline void goep_in_st_v4(void* p, uint4 v) { memcpy(p, &v, 16); }
// atomicCAS used by goep_watchdog_expire
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
