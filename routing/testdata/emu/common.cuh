// Host emulation of the CUDA features kernels/layout.cu uses, standing in
// for kernels/common.cuh when emulate_test.go compiles the kernel with g++.
// One std::thread per CUDA thread; blocks run one after another (the layout
// kernel never waits on another block, so this is a legal schedule); warps
// vote through a per-warp barrier. It checks the kernel's logic (indexing,
// warp votes, the last-block hand-off, the self-cleaning workspace), not the
// GPU memory model.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;

#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__

struct emu_dim3 {
  unsigned x, y, z;
};
extern thread_local emu_dim3 threadIdx;
extern emu_dim3 blockIdx, blockDim, gridDim;

struct emu_block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<u32> votes;
  std::vector<i32> dyn_smem;
};
extern emu_block* emu_cur;

// Stands in for `extern __shared__ i32 s_counts[]` (the test rewrites it).
#define g_dyn_smem (emu_cur->dyn_smem.data())

inline void __syncthreads() { emu_cur->bar->arrive_and_wait(); }

inline u32 __ballot_sync(u32 mask, int pred) {
  if (mask != 0xffffffffu || blockDim.x % 32 != 0) {
    std::abort();  // the kernel only votes with full warps
  }
  const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  emu_cur->votes[threadIdx.x] = pred ? 1u : 0u;
  emu_cur->warp_bar[w]->arrive_and_wait();
  u32 r = 0;
  for (unsigned i = 0; i < 32; ++i) {
    r |= emu_cur->votes[w * 32 + i] << i;
  }
  emu_cur->warp_bar[w]->arrive_and_wait();
  (void)l;
  return r;
}

inline int __popc(u32 x) { return __builtin_popcount(x); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline u32 atomicAdd(u32* p, u32 v) { return std::atomic_ref<u32>(*p).fetch_add(v); }
inline int atomicExch(int* p, int v) { return std::atomic_ref<int>(*p).exchange(v); }
inline u32 atomicExch(u32* p, u32 v) { return std::atomic_ref<u32>(*p).exchange(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
