// emu_runtime.h: CUDA on CPU threads, for the CPU emulation of goep's
// kernels (package internal/cpuemu). Every CUDA thread of a launch is an OS
// thread; __syncthreads is a block barrier that threads leave when they
// return (as exited threads do on a GPU); warp collectives rendezvous the
// lanes of their mask; __shared__ variables are per-block storage keyed by
// their declaration (rewritten by translate.go); the PTX of the kernels'
// inline asm becomes the calls below (also translate.go), with the memory
// orders the PTX names. What this cannot model is in doc.go.
//
// Every wait here is bounded: a barrier, warp rendezvous or emulated spin
// that waits longer than the launch's limit fails the launch, and once a
// launch has failed every thread leaves at its next barrier or spin.
#pragma once
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)

struct emu_dim3 {
  unsigned x, y, z;
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

// Thrown out of a thread's kernel when its launch has failed; caught where
// the thread started.
struct emu_abort_exc {};

struct emu_block;
struct emu_launch_state {
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string why;
  double limit_s = 300;  // the longest any single wait may take
  std::vector<emu_block*> blocks;
  void fail(const std::string& w);
};

struct emu_round {
  unsigned mask = 0, joined = 0, left = 0;
  bool done = false;
  uint64_t vals[32];
};

struct emu_warp {
  std::mutex mu;
  std::condition_variable cv;
  std::list<emu_round> rounds;
  unsigned present = 0;  // lanes that exist
  unsigned exited = 0;   // lanes whose thread returned
};

struct emu_block {
  // __syncthreads: threads that return leave the barrier.
  std::mutex mu;
  std::condition_variable cv;
  unsigned expected, arrived = 0;
  uint64_t gen = 0;
  std::vector<std::unique_ptr<emu_warp>> warps;
  std::vector<int> flags;
  std::mutex shm_mu;
  std::unordered_map<const void*, void*> shm;
  std::vector<void*> shm_blocks;
  unsigned char* dyn = nullptr;
  unsigned size;
  explicit emu_block(unsigned n, size_t dyn_bytes) : expected(n), flags(n), size(n) {
    for (unsigned w = 0; w < (n + 31) / 32; ++w) {
      warps.emplace_back(new emu_warp());
      unsigned lanes = n - w * 32 >= 32 ? 32 : n - w * 32;
      warps.back()->present = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
    }
    // Shared memory comes uninitialised on a GPU: poison it, so a kernel
    // that reads before writing fails here too.
    dyn = (unsigned char*)aligned_alloc(128, (dyn_bytes + 127) / 128 * 128 + 128);
    memset(dyn, 0xA5, (dyn_bytes + 127) / 128 * 128 + 128);
  }
  ~emu_block() {
    for (void* p : shm_blocks) free(p);
    free(dyn);
  }
};

// The first failure is the launch's error; every waiting thread is woken
// to see it.
inline void emu_launch_state::fail(const std::string& w) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (failed.load()) return;
    why = w;
    failed.store(true);
  }
  for (emu_block* b : blocks) {
    {
      std::lock_guard<std::mutex> g(b->mu);
      b->cv.notify_all();
    }
    for (auto& wp : b->warps) {
      std::lock_guard<std::mutex> g(wp->mu);
      wp->cv.notify_all();
    }
  }
}

struct emu_thread_ctx {
  emu_dim3 tid, bid, bdim, gdim;
  emu_block* block;
  emu_launch_state* launch;
  unsigned spins, reads;
  const volatile void* spin_addr;
  uint64_t spin_val;
  unsigned st_flip;
};
inline thread_local emu_thread_ctx emu_ctx;

#define threadIdx (emu_ctx.tid)
#define blockIdx (emu_ctx.bid)
#define blockDim (emu_ctx.bdim)
#define gridDim (emu_ctx.gdim)
#define warpSize 32

inline unsigned emu_linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

[[noreturn]] inline void emu_fail(const std::string& why) {
  char where[128];
  snprintf(where, sizeof where, " (block %u,%u,%u thread %u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
           threadIdx.y, threadIdx.z);
  emu_ctx.launch->fail(why + where);
  throw emu_abort_exc{};
}

inline void emu_check_failed() {
  if (emu_ctx.launch->failed.load(std::memory_order_relaxed)) throw emu_abort_exc{};
}

// A spin point: every emulated load that kernels poll in a loop passes
// here with the address and the value it read. It leaves when the launch
// has failed. A thread that reads the same value from the same address
// again and again is polling: it yields after a few reads and then sleeps,
// a little longer each time up to 100 us, so that the threads with work get
// the cores (2 cores run hundreds of emulated threads; a spinning one would
// burn the time slice of the thread it waits for). Polling several
// addresses in turn yields every 32 reads.
inline void emu_spin_point(const volatile void* p, uint64_t v) {
  emu_check_failed();
  emu_thread_ctx& c = emu_ctx;
  if (p != c.spin_addr || v != c.spin_val) {
    c.spin_addr = p;
    c.spin_val = v;
    c.spins = 0;
    if (++c.reads % 32 == 0) std::this_thread::yield();
    return;
  }
  const unsigned n = ++c.spins;
  if (n <= 2) return;
  if (n <= 16) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(n - 16 < 100 ? n - 16 : 100));
}
// Work that is not polling: a store, a read-modify-write, a barrier.
inline void emu_progress() { emu_ctx.spins = 0; emu_ctx.spin_addr = nullptr; }

using emu_clock = std::chrono::steady_clock;

template <class Pred>
inline void emu_cv_wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, Pred done, const char* what) {
  const auto start = emu_clock::now();
  while (!done()) {
    // Long timed waits: hundreds of threads waking every few ms would
    // spend the cores on wake-ups; a failure wakes them at once.
    cv.wait_for(lk, std::chrono::seconds(1));
    if (done()) return;
    if (emu_ctx.launch->failed.load()) throw emu_abort_exc{};
    if (std::chrono::duration<double>(emu_clock::now() - start).count() > emu_ctx.launch->limit_s) {
      lk.unlock();
      emu_fail(std::string(what) + " waited longer than the emulation's limit (a thread never arrived)");
    }
  }
}

// ---------------------------------------------------------------------------
// Block barrier.

inline void __syncthreads() {
  emu_progress();
  emu_block* b = emu_ctx.block;
  std::unique_lock<std::mutex> lk(b->mu);
  const uint64_t g = b->gen;
  if (++b->arrived == b->expected) {
    b->arrived = 0;
    b->gen++;
    b->cv.notify_all();
    return;
  }
  emu_cv_wait(b->cv, lk, [&] { return b->gen != g; }, "__syncthreads");
}

// Called when a thread returns: it no longer takes part in barriers.
inline void emu_block_leave(emu_block* b) {
  std::unique_lock<std::mutex> lk(b->mu);
  b->expected--;
  if (b->arrived > 0 && b->arrived == b->expected) {
    b->arrived = 0;
    b->gen++;
    b->cv.notify_all();
  }
}

inline int __syncthreads_or(int p) {
  emu_block* b = emu_ctx.block;
  b->flags[emu_linear_tid()] = p;
  __syncthreads();
  int r = 0;
  for (int f : b->flags) r |= (f != 0);
  __syncthreads();
  return r;
}
inline int __syncthreads_and(int p) {
  emu_block* b = emu_ctx.block;
  b->flags[emu_linear_tid()] = p != 0;
  __syncthreads();
  int r = 1;
  for (int f : b->flags) r &= (f != 0);
  __syncthreads();
  return r;
}
inline int __syncthreads_count(int p) {
  emu_block* b = emu_ctx.block;
  b->flags[emu_linear_tid()] = p != 0;
  __syncthreads();
  int r = 0;
  for (int f : b->flags) r += f;
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------------------
// Warp collectives: the lanes of mask (those that exist and have not
// returned) meet in a round, each leaves its value, all read all.

inline emu_warp& emu_my_warp() { return *emu_ctx.block->warps[emu_linear_tid() / 32]; }
inline unsigned emu_lane() { return emu_linear_tid() % 32; }

inline void emu_warp_exchange(unsigned mask, uint64_t v, uint64_t out[32]) {
  emu_progress();
  emu_warp& w = emu_my_warp();
  const unsigned me = 1u << emu_lane();
  std::unique_lock<std::mutex> lk(w.mu);
  mask &= w.present & ~w.exited;
  if (!(mask & me)) {
    lk.unlock();
    emu_fail("warp collective with a mask that leaves out the calling lane");
  }
  emu_round* r = nullptr;
  for (auto& x : w.rounds) {
    if (x.mask == mask && !x.done && !(x.joined & me)) {
      r = &x;
      break;
    }
  }
  if (!r) {
    w.rounds.emplace_back();
    r = &w.rounds.back();
    r->mask = mask;
  }
  r->vals[emu_lane()] = v;
  r->joined |= me;
  if (r->joined == r->mask) {
    r->done = true;
    w.cv.notify_all();
  } else {
    emu_cv_wait(w.cv, lk, [&] { return r->done; }, "warp collective");
  }
  memcpy(out, r->vals, sizeof r->vals);
  if (++r->left == (unsigned)__builtin_popcount(r->mask)) {
    for (auto it = w.rounds.begin(); it != w.rounds.end(); ++it) {
      if (&*it == r) {
        w.rounds.erase(it);
        break;
      }
    }
  }
}

inline void emu_warp_leave(emu_block* b, unsigned linear) {
  emu_warp& w = *b->warps[linear / 32];
  std::unique_lock<std::mutex> lk(w.mu);
  w.exited |= 1u << (linear % 32);
  // Rounds waiting for this lane can never complete; on a GPU that is
  // undefined behaviour. Waiters time out.
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  uint64_t all[32];
  emu_warp_exchange(mask, 0, all);
}

template <class T>
inline uint64_t emu_bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T emu_from_bits(uint64_t b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  uint64_t all[32];
  emu_warp_exchange(mask, emu_bits(v), all);
  const int base = (int)emu_lane() / width * width;
  return emu_from_bits<T>(all[base + ((unsigned)src % (unsigned)width)]);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  uint64_t all[32];
  emu_warp_exchange(mask, emu_bits(v), all);
  const int lane = (int)emu_lane(), in = lane % width;
  return in >= (int)delta ? emu_from_bits<T>(all[lane - delta]) : v;
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  uint64_t all[32];
  emu_warp_exchange(mask, emu_bits(v), all);
  const int lane = (int)emu_lane(), in = lane % width;
  return in + (int)delta < width ? emu_from_bits<T>(all[lane + delta]) : v;
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int x, int width = 32) {
  uint64_t all[32];
  emu_warp_exchange(mask, emu_bits(v), all);
  const int lane = (int)emu_lane();
  const int src = lane ^ x;
  return (src / width == lane / width) ? emu_from_bits<T>(all[src]) : v;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  uint64_t all[32];
  emu_warp_exchange(mask, pred != 0, all);
  emu_warp& w = emu_my_warp();
  unsigned r = 0, m;
  {
    std::lock_guard<std::mutex> g(w.mu);
    m = mask & w.present;
  }
  for (int i = 0; i < 32; ++i)
    if ((m >> i) & 1u) r |= (unsigned)(all[i] != 0) << i;
  return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
  emu_warp& w = emu_my_warp();
  unsigned m;
  {
    std::lock_guard<std::mutex> g(w.mu);
    m = mask & w.present & ~w.exited;
  }
  return (__ballot_sync(mask, pred) & m) == m;
}
inline unsigned __activemask() {
  emu_warp& w = emu_my_warp();
  std::lock_guard<std::mutex> g(w.mu);
  return w.present & ~w.exited;
}

// ---------------------------------------------------------------------------
// Shared memory: one allocation per (block, declaration), poisoned.

inline void* emu_shared_at(const void* key, size_t size, size_t align) {
  emu_block* b = emu_ctx.block;
  std::lock_guard<std::mutex> g(b->shm_mu);
  auto it = b->shm.find(key);
  if (it != b->shm.end()) return it->second;
  if (align < 16) align = 16;
  void* p = aligned_alloc(align, (size + align - 1) / align * align);
  memset(p, 0xA5, size);
  b->shm_blocks.push_back(p);
  b->shm[key] = p;
  return p;
}
template <class T>
inline T& emu_shared_var(const void* key) {
  return *(T*)emu_shared_at(key, sizeof(T), alignof(T));
}
inline void* emu_dyn_shared() { return emu_ctx.block->dyn; }

// ---------------------------------------------------------------------------
// Arithmetic and bit built-ins.

template <class A, class B>
inline auto min(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B>
inline auto max(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return (C)a < (C)b ? (C)b : (C)a;
}
inline unsigned __float_as_uint(float f) { return emu_from_bits<unsigned>(emu_bits(f)); }
inline float __uint_as_float(unsigned u) { return emu_from_bits<float>(u); }
inline int __float_as_int(float f) { return emu_from_bits<int>(emu_bits(f)); }
inline float __int_as_float(int u) { return emu_from_bits<float>((unsigned)u); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline void __nanosleep(unsigned) {
  emu_check_failed();
  std::this_thread::yield();
}

// ---------------------------------------------------------------------------
// CUDA atomics: relaxed read-modify-writes (device scope).

template <class T, class U>
inline T atomicAdd(T* p, U v) {
  if constexpr (std::is_floating_point_v<T>) {
    T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, (T)(cur + (T)v), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return cur;
  } else {
    return __atomic_fetch_add(p, (T)v, __ATOMIC_RELAXED);
  }
}
template <class T, class U>
inline T atomicSub(T* p, U v) {
  return __atomic_fetch_sub(p, (T)v, __ATOMIC_RELAXED);
}
template <class T, class U>
inline T atomicExch(T* p, U v) {
  return __atomic_exchange_n(p, (T)v, __ATOMIC_RELAXED);
}
template <class T, class U, class V>
inline T atomicCAS(T* p, U cmp, V v) {
  T c = (T)cmp;
  __atomic_compare_exchange_n(p, &c, (T)v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return c;
}
template <class T, class U>
inline T atomicMax(T* p, U v) {
  T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < (T)v && !__atomic_compare_exchange_n(p, &cur, (T)v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return cur;
}
template <class T, class U>
inline T atomicMin(T* p, U v) {
  T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while ((T)v < cur && !__atomic_compare_exchange_n(p, &cur, (T)v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return cur;
}
template <class T, class U>
inline T atomicOr(T* p, U v) {
  return __atomic_fetch_or(p, (T)v, __ATOMIC_RELAXED);
}
template <class T, class U>
inline T atomicAnd(T* p, U v) {
  return __atomic_fetch_and(p, (T)v, __ATOMIC_RELAXED);
}
// fence.sc at device / system scope.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------------------
// The PTX of the kernels' inline asm (translate.go writes these calls).

inline unsigned long long emu_globaltimer() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
             emu_clock::now().time_since_epoch())
      .count();
}

inline void emu_align(const volatile void* p, size_t a, const char* what) {
  if ((uintptr_t)p % a != 0) {
    char buf[160];
    snprintf(buf, sizeof buf, "misaligned address %p for %s (needs %zu-byte alignment)", (const void*)p, what, a);
    emu_fail(buf);
  }
  if ((uintptr_t)p < 4096) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s of address %p (a null pointer)", what, (const void*)p);
    emu_fail(buf);
  }
}

// Scalar loads and stores with the PTX order (acquire, relaxed, release).
// Loads pass a spin point: kernels poll with them.
inline uint32_t emu_ld_u32(const volatile void* p, int order) {
  emu_align(p, 4, "ld.u32");
  const uint32_t v = __atomic_load_n((const volatile uint32_t*)p, order);
  emu_spin_point(p, v);
  return v;
}
inline uint64_t emu_ld_u64(const volatile void* p, int order) {
  emu_align(p, 8, "ld.u64");
  const uint64_t v = __atomic_load_n((const volatile uint64_t*)p, order);
  emu_spin_point(p, v);
  return v;
}
inline void emu_st_u32(volatile void* p, uint32_t v, int order) {
  emu_progress();
  emu_align(p, 4, "st.u32");
  __atomic_store_n((volatile uint32_t*)p, v, order);
}
inline void emu_st_u64(volatile void* p, uint64_t v, int order) {
  emu_progress();
  emu_align(p, 8, "st.u64");
  __atomic_store_n((volatile uint64_t*)p, v, order);
}
inline void emu_fence(int order) { __atomic_thread_fence(order); }
inline uint32_t emu_atom_add_u32(volatile void* p, uint32_t v, int order) {
  emu_progress();
  emu_align(p, 4, "atom.add.u32");
  return __atomic_fetch_add((volatile uint32_t*)p, v, order);
}
inline uint64_t emu_atom_add_u64(volatile void* p, uint64_t v, int order) {
  emu_progress();
  emu_align(p, 8, "atom.add.u64");
  return __atomic_fetch_add((volatile uint64_t*)p, v, order);
}

// Weak vector accesses: word by word (relaxed atomics, so no C++ data race;
// a GPU gives no more than per-word atomicity either), alignment checked as
// the GPU would fault.
inline void emu_ld_words(const volatile void* p, uint32_t* w, int n, const char* what) {
  emu_align(p, 4 * n, what);
  for (int i = 0; i < n; ++i) w[i] = __atomic_load_n((const volatile uint32_t*)p + i, __ATOMIC_RELAXED);
}
inline void emu_st_words(volatile void* p, const uint32_t* w, int n, const char* what) {
  emu_progress();
  emu_align(p, 4 * n, what);
  for (int i = 0; i < n; ++i) __atomic_store_n((volatile uint32_t*)p + i, w[i], __ATOMIC_RELAXED);
}
inline float emu_ld_f32(const volatile void* p) {
  uint32_t w;
  emu_ld_words(p, &w, 1, "ld.f32");
  return __uint_as_float(w);
}

// Volatile (LL packet) and multi-word relaxed accesses: each 8-byte half is
// single-copy atomic, as the LL protocols require, and nothing more. Vector
// stores write their halves in alternating order, so a reader that relied
// on the order of the halves would fail here.
inline void emu_ld_halves(const volatile void* p, uint64_t* h, int n, const char* what) {
  emu_align(p, 8 * n, what);
  uint64_t x = 0;
  for (int i = 0; i < n; ++i) {
    h[i] = __atomic_load_n((const volatile uint64_t*)p + i, __ATOMIC_RELAXED);
    x = x * 0x9e3779b97f4a7c15ull ^ h[i];
  }
  emu_spin_point(p, x);
}
inline void emu_st_halves(volatile void* p, const uint64_t* h, int n, const char* what) {
  emu_progress();
  emu_align(p, 8 * n, what);
  const bool flip = (emu_ctx.st_flip++ & 1u) != 0;
  for (int k = 0; k < n; ++k) {
    const int i = flip ? n - 1 - k : k;
    __atomic_store_n((volatile uint64_t*)p + i, h[i], __ATOMIC_RELAXED);
  }
}
inline uint64_t emu_pack2(uint32_t lo, uint32_t hi) { return (uint64_t)lo | ((uint64_t)hi << 32); }

// IEEE half <-> float, round to nearest even (cvt.rn.f16.f32 / cvt.f32.f16).
inline float emu_f16_to_f32(unsigned short h) {
  _Float16 x;
  memcpy(&x, &h, 2);
  return (float)x;
}
inline unsigned short emu_f32_to_f16(float f) {
  _Float16 x = (_Float16)f;
  unsigned short h;
  memcpy(&h, &x, 2);
  return h;
}

[[noreturn]] inline void emu_unsupported_ptx(const char* ptx) {
  emu_fail(std::string("inline PTX the emulation does not know: ") + ptx);
}

// ---------------------------------------------------------------------------
// Kernel parameters, read back from the packed buffer (each at its natural
// alignment, as internal/device.Args packs them and as the CUDA ABI lays
// them out).

template <class T>
inline T emu_arg(const unsigned char* p, size_t n, size_t& off, bool& ok) {
  static_assert(std::is_trivially_copyable_v<T>, "kernel parameter must be trivially copyable");
  off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
  T v{};
  if (off + sizeof(T) > n) {
    ok = false;
  } else {
    memcpy(&v, p + off, sizeof(T));
  }
  off += sizeof(T);
  return v;
}

template <class... A>
inline bool emu_bind(void (*fn)(A...), const unsigned char* p, size_t n, std::function<void()>& body,
                     std::string& err) {
  size_t off = 0;
  bool ok = true;
  // Braced initialisation evaluates left to right: parameters in order.
  std::tuple<std::decay_t<A>...> t{emu_arg<std::decay_t<A>>(p, n, off, ok)...};
  if (!ok || off != n) {
    err = "the kernel's parameters take " + std::to_string(off) + " bytes, the launch packed " + std::to_string(n);
    return false;
  }
  body = [fn, t] { std::apply(fn, t); };
  return true;
}

struct emu_kernel {
  const char* name;
  bool (*bind)(const unsigned char*, size_t, std::function<void()>&, std::string&);
};

// ---------------------------------------------------------------------------
// A launch. At most emu_resident_threads threads of a launch run at once:
// S = emu_resident_threads / threads-per-block slots, block b on slot
// b mod S, each slot's threads running their blocks in turn, as blocks wait
// for a free SM on a full GPU. Grids up to S blocks (what the protocol
// kernels launch: blocks that wait for each other) run entirely at once; a
// kernel whose running blocks wait for a block that cannot start fails at
// the wait limit instead of hanging. Grid-stride kernels launched with a
// GPU-sized grid run in waves, on the same threads.
static const unsigned emu_resident_threads = 2048;

struct emu_worker {
  const std::function<void()>* body;
  emu_launch_state* launch;
  std::vector<std::unique_ptr<emu_block>>* blocks;
  emu_dim3 grid, block;
  unsigned first, stride, nb, t;
};

inline void* emu_thread_main(void* a) {
  emu_worker* w = (emu_worker*)a;
  for (unsigned b = w->first; b < w->nb && !w->launch->failed.load(); b += w->stride) {
    emu_thread_ctx& c = emu_ctx;
    const unsigned t = w->t;
    c.tid = {t % w->block.x, t / w->block.x % w->block.y, t / (w->block.x * w->block.y)};
    c.bid = {b % w->grid.x, b / w->grid.x % w->grid.y, b / (w->grid.x * w->grid.y)};
    c.bdim = w->block;
    c.gdim = w->grid;
    c.block = (*w->blocks)[b].get();
    c.launch = w->launch;
    c.spins = c.reads = 0;
    c.spin_addr = nullptr;
    c.spin_val = 0;
    c.st_flip = t;
    try {
      (*w->body)();
    } catch (const emu_abort_exc&) {
    } catch (const std::exception& e) {
      w->launch->fail(std::string("C++ exception: ") + e.what());
    } catch (...) {
      w->launch->fail("unknown C++ exception");
    }
    emu_warp_leave(c.block, emu_linear_tid());
    emu_block_leave(c.block);
  }
  return nullptr;
}

inline int emu_run(const emu_kernel* table, size_t nk, const char* name, const unsigned* grid, const unsigned* block,
                   unsigned smem, const unsigned char* args, size_t nargs, double limit_s, char* err, size_t errlen) {
  auto say = [&](const std::string& s) {
    snprintf(err, errlen, "%s", s.c_str());
    return 1;
  };
  const emu_kernel* k = nullptr;
  for (size_t i = 0; i < nk; ++i)
    if (strcmp(table[i].name, name) == 0) k = &table[i];
  if (!k) return say(std::string("no kernel ") + name + " in this module");
  std::function<void()> body;
  std::string why;
  if (!k->bind(args, nargs, body, why)) return say(why);
  const unsigned long long nb = (unsigned long long)grid[0] * grid[1] * grid[2],
                           nt = (unsigned long long)block[0] * block[1] * block[2];
  if (nb == 0 || nt == 0) return say("empty grid or block");
  if (nt > 1024) return say("more than 1024 threads in a block");
  if (nb > 65536) return say("more than 65536 blocks: too many for the emulation");
  if (smem > (228u << 10)) return say("more than 228 KiB of dynamic shared memory");
  emu_launch_state st;
  st.limit_s = limit_s;
  std::vector<std::unique_ptr<emu_block>> blocks;
  for (unsigned b = 0; b < nb; ++b) {
    blocks.emplace_back(new emu_block((unsigned)nt, smem));
    st.blocks.push_back(blocks.back().get());
  }
  unsigned slots = (unsigned)(emu_resident_threads / nt);
  if (slots < 1) slots = 1;
  if (slots > nb) slots = (unsigned)nb;
  std::vector<emu_worker> ws((size_t)slots * nt);
  std::vector<pthread_t> ths;
  ths.reserve(ws.size());
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (unsigned g = 0; g < slots; ++g) {
    for (unsigned t = 0; t < nt; ++t) {
      emu_worker& w = ws[(size_t)g * nt + t];
      w = emu_worker{&body, &st, &blocks, {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, g, slots,
                     (unsigned)nb, t};
      pthread_t th;
      if (int e = pthread_create(&th, &attr, emu_thread_main, &w); e != 0) {
        // Threads already started see the failure at their next wait; the
        // blocks this thread would have run lose it from their barriers.
        st.fail("cannot start thread " + std::to_string(ths.size()) + " of the launch: " + strerror(e));
        for (unsigned gg = g; gg < slots; ++gg)
          for (unsigned b = gg; b < nb; b += slots)
            for (unsigned m = gg == g ? t : 0; m < nt; ++m) emu_block_leave(blocks[b].get());
        goto started;
      }
      ths.push_back(th);
    }
  }
started:
  pthread_attr_destroy(&attr);
  for (pthread_t th : ths) pthread_join(th, nullptr);
  if (st.failed) return say(st.why);
  return 0;
}
