// coll_common.cuh: the device ABI and helpers of goep's collectives
// (allreduce, allgather, reduce-scatter over NVLink without multicast).
//
// Every collective kernel receives a goep_coll_ctx (device memory, built once
// per communicator by package collectives; Go mirror: collectives/abi) and
// works with:
//
//   - the packet buffer of every rank (two halves of packet_half bytes), the
//     target of LL16 packets; its flag counter advances once per LL round,
//     so buffers are never cleared and CUDA graphs replay unchanged
//     (packet_device.cuh explains the double-buffering bound);
//   - the scratch data area of every rank, the target of the bulk
//     (non-zero-copy) algorithms' pushes;
//   - semaphores [block][peer]: block b of every rank pairs with block b of
//     every other rank, so blocks synchronise independently and any grid of
//     at most sem_blocks blocks works whether or not all of it is resident;
//   - mailboxes, where zero-copy kernels publish which registered buffer and
//     offset they use (the peer reads its own mapping in the regs table).
//
// Reduction semantics (bit-exact with collectives/ref): inputs widened to
// float and combined in rank order 0..W-1; sum rounds once at the end; min
// and max replace the running value only when strictly less / greater.
//
// Every wait is bounded by the communicator's watchdog and names its peer
// and stage (GOEP_COLL_STAGE_*) in the timeout record.
#ifndef GOEP_COLL_COMMON_CUH
#define GOEP_COLL_COMMON_CUH

#include "channel_device.cuh"

#define GOEP_COLL_MAX_RANKS 8
#define GOEP_COLL_MAX_THREADS 512
#define GOEP_COLL_DESC_SIZE 32

// Element types: goep's dtype.DType values (package dtype; collectives/abi
// checks them against the Go side).
#define GOEP_COLL_BF16 1
#define GOEP_COLL_FP16 7
#define GOEP_COLL_FP32 3
#define GOEP_COLL_FP8E4M3 2

// Reductions (collectives/ref.Op; only these three run natively).
#define GOEP_COLL_SUM 0
#define GOEP_COLL_MIN 1
#define GOEP_COLL_MAX 2

// Stages named in timeout records.
#define GOEP_COLL_STAGE_ENTRY 1
#define GOEP_COLL_STAGE_RS_DATA 2
#define GOEP_COLL_STAGE_AG_DATA 3
#define GOEP_COLL_STAGE_EXIT 4
#define GOEP_COLL_STAGE_LL1 5
#define GOEP_COLL_STAGE_LL2 6

// Collective kinds (goep_coll_check).
#define GOEP_COLL_KIND_ALLREDUCE 0
#define GOEP_COLL_KIND_ALLGATHER 1
#define GOEP_COLL_KIND_REDUCESCATTER 2

// Generated data (collectives/ref.Fill).
#define GOEP_COLL_FILL_RANDOM 0
#define GOEP_COLL_FILL_SMALLINT 1

// Registration id meaning "no buffer" in a mailbox descriptor.
#define GOEP_COLL_NO_REG 0xffffffffu

struct goep_coll_ctx {
  u32 rank;
  u32 world;
  u32 sem_blocks;
  u32 max_regs;
  goep_ll_flag* flag;
  goep_watchdog* wd;
  const goep_semaphore* sems;  // [sem_blocks][GOEP_COLL_MAX_RANKS], own slot zero
  const u64* regs;             // [max_regs][GOEP_COLL_MAX_RANKS]
  u64 packet_half;
  u64 scratch_size;
  char* packets[GOEP_COLL_MAX_RANKS];
  char* scratch[GOEP_COLL_MAX_RANKS];
  char* mailbox[GOEP_COLL_MAX_RANKS];
  u32 ll_id[GOEP_COLL_MAX_RANKS];
};
static_assert(sizeof(goep_coll_ctx) == 288, "goep: goep_coll_ctx layout");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, world) == 4, "goep: goep_coll_ctx.world");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, sem_blocks) == 8, "goep: goep_coll_ctx.sem_blocks");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, max_regs) == 12, "goep: goep_coll_ctx.max_regs");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, flag) == 16, "goep: goep_coll_ctx.flag");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, wd) == 24, "goep: goep_coll_ctx.wd");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, sems) == 32, "goep: goep_coll_ctx.sems");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, regs) == 40, "goep: goep_coll_ctx.regs");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, packet_half) == 48, "goep: goep_coll_ctx.packet_half");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, scratch_size) == 56, "goep: goep_coll_ctx.scratch_size");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, packets) == 64, "goep: goep_coll_ctx.packets");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, scratch) == 128, "goep: goep_coll_ctx.scratch");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, mailbox) == 192, "goep: goep_coll_ctx.mailbox");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, ll_id) == 256, "goep: goep_coll_ctx.ll_id");

// ---------------------------------------------------------------------------
// IEEE binary16, in software so that it matches collectives/ref bit for bit
// (round to nearest even, subnormals kept, overflow to inf, NaN -> 0x7fff).

__device__ __forceinline__ u16 goep_f32_to_f16_bits(float f) {
  const u32 u = goep_f32_as_u32(f);
  const u32 sign = (u >> 16) & 0x8000u;
  const u32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return 0x7fffu;
  }
  if (a >= 0x477ff000u) {  // >= 65520: rounds to infinity
    return (u16)(sign | 0x7c00u);
  }
  if (a >= 0x38800000u) {  // >= 2^-14: normal
    u32 v = a - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return (u16)(sign | (v >> 13));
  }
  const u32 e = a >> 23;
  if (e < 102u) {  // below 2^-25
    return (u16)sign;
  }
  const u32 sig = (a & 0x7fffffu) | 0x800000u;
  const u32 shift = 126u - e;  // 14..24
  u32 q = sig >> shift;
  const u32 rem = sig & ((1u << shift) - 1u);
  const u32 half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) {
    q += 1u;
  }
  return (u16)(sign | q);
}

__device__ __forceinline__ float goep_f16_bits_to_f32(u16 h) {
  const u32 sign = (u32)(h & 0x8000u) << 16;
  const u32 e = (h >> 10) & 0x1fu;
  const u32 m = h & 0x3ffu;
  if (e == 0x1fu) {
    return goep_u32_as_f32(sign | 0x7f800000u | (m << 13));
  }
  if (e == 0) {
    const float mag = (float)m * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return goep_u32_as_f32(sign | goep_f32_as_u32(mag));
  }
  return goep_u32_as_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// ---------------------------------------------------------------------------
// Element types as template parameters.

template <int DT>
struct goep_coll_type;

template <>
struct goep_coll_type<GOEP_COLL_BF16> {
  static const u32 size = 2;
  __device__ static __forceinline__ float to_f32(u32 b) { return goep_bf16_bits_to_f32((u16)b); }
  __device__ static __forceinline__ u32 from_f32(float f) { return goep_f32_to_bf16_bits(f); }
};

template <>
struct goep_coll_type<GOEP_COLL_FP16> {
  static const u32 size = 2;
  __device__ static __forceinline__ float to_f32(u32 b) { return goep_f16_bits_to_f32((u16)b); }
  __device__ static __forceinline__ u32 from_f32(float f) { return goep_f32_to_f16_bits(f); }
};

template <>
struct goep_coll_type<GOEP_COLL_FP32> {
  static const u32 size = 4;
  __device__ static __forceinline__ float to_f32(u32 b) { return goep_u32_as_f32(b); }
  __device__ static __forceinline__ u32 from_f32(float f) { return goep_f32_as_u32(f); }
};

// One step of a reduction: acc op x.
template <int OP>
__device__ __forceinline__ float goep_coll_combine(float acc, float x) {
  if (OP == GOEP_COLL_MIN) {
    return (x < acc) ? x : acc;
  }
  if (OP == GOEP_COLL_MAX) {
    return (x > acc) ? x : acc;
  }
  return acc + x;
}

// Runtime-typed versions, for the test kernels.
__device__ __forceinline__ u32 goep_coll_dt_size(u32 dt) {
  return dt == GOEP_COLL_FP32 ? 4u : (dt == GOEP_COLL_FP8E4M3 ? 1u : 2u);
}
__device__ __forceinline__ float goep_coll_to_f32(u32 dt, u32 b) {
  switch (dt) {
    case GOEP_COLL_BF16:
      return goep_bf16_bits_to_f32((u16)b);
    case GOEP_COLL_FP16:
      return goep_f16_bits_to_f32((u16)b);
    case GOEP_COLL_FP8E4M3:
      return goep_fp8e4m3_bits_to_f32((u8)b);
  }
  return goep_u32_as_f32(b);
}
__device__ __forceinline__ u32 goep_coll_from_f32(u32 dt, float f) {
  switch (dt) {
    case GOEP_COLL_BF16:
      return goep_f32_to_bf16_bits(f);
    case GOEP_COLL_FP16:
      return goep_f32_to_f16_bits(f);
    case GOEP_COLL_FP8E4M3:
      return goep_f32_to_fp8e4m3_bits(f);
  }
  return goep_f32_as_u32(f);
}
__device__ __forceinline__ float goep_coll_combine_rt(u32 op, float acc, float x) {
  if (op == GOEP_COLL_MIN) {
    return goep_coll_combine<GOEP_COLL_MIN>(acc, x);
  }
  if (op == GOEP_COLL_MAX) {
    return goep_coll_combine<GOEP_COLL_MAX>(acc, x);
  }
  return goep_coll_combine<GOEP_COLL_SUM>(acc, x);
}

// Loads of data another GPU (or another launch) wrote bypass L1, which is
// not coherent: slots are rewritten by peers every round and read again at
// the same addresses, so a line cached by an earlier round must never be
// served. 16-byte vectors use ld.global.cg (cached in L2 only), single
// elements volatile loads.
__device__ __forceinline__ goep_u128 goep_coll_ld_cg(const goep_u128* p) {
  goep_u128 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Element k of a buffer of elements of size sz, as bits, and its store.
__device__ __forceinline__ u32 goep_coll_ld_elem(const char* p, u64 k, u32 sz) {
  if (sz == 1) {
    return *(const volatile u8*)(p + k);
  }
  if (sz == 2) {
    return *(const volatile u16*)(p + 2 * k);
  }
  return *(const volatile u32*)(p + 4 * k);
}
__device__ __forceinline__ void goep_coll_st_elem(char* p, u64 k, u32 sz, u32 v) {
  if (sz == 1) {
    *(u8*)(p + k) = (u8)v;
  } else if (sz == 2) {
    *(u16*)(p + 2 * k) = (u16)v;
  } else {
    *(u32*)(p + 4 * k) = v;
  }
}

// ---------------------------------------------------------------------------
// Accumulators over packed lanes: 8 bytes (one LL16 payload) hold 4 two-byte
// or 2 four-byte elements. The reduction is a runtime code, the same for
// every thread of a launch (a uniform branch), so each kernel is
// instantiated per element type only.

template <int DT>
struct goep_coll_acc8 {
  typedef goep_coll_type<DT> T;
  static const u32 lanes = 8 / T::size;
  static const u32 bits = 8 * T::size;
  float v[lanes];
  u32 op;

  __device__ __forceinline__ explicit goep_coll_acc8(u32 o) : op(o) {}
  __device__ __forceinline__ static u32 lane(u64 w, u32 i) {
    return (u32)(w >> (bits * i)) & (u32)((bits == 32) ? 0xffffffffu : 0xffffu);
  }
  __device__ __forceinline__ void init(u64 w) {
#pragma unroll
    for (u32 i = 0; i < lanes; ++i) {
      v[i] = T::to_f32(lane(w, i));
    }
  }
  __device__ __forceinline__ void add(u64 w) {
#pragma unroll
    for (u32 i = 0; i < lanes; ++i) {
      v[i] = goep_coll_combine_rt(op, v[i], T::to_f32(lane(w, i)));
    }
  }
  __device__ __forceinline__ u64 get() const {
    u64 r = 0;
#pragma unroll
    for (u32 i = 0; i < lanes; ++i) {
      r |= (u64)T::from_f32(v[i]) << (bits * i);
    }
    return r;
  }
};

__device__ __forceinline__ u64 goep_coll_lo(const goep_u128& x) { return (u64)x.x | ((u64)x.y << 32); }
__device__ __forceinline__ u64 goep_coll_hi(const goep_u128& x) { return (u64)x.z | ((u64)x.w << 32); }
__device__ __forceinline__ goep_u128 goep_coll_u128(u64 lo, u64 hi) {
  goep_u128 r;
  r.x = (u32)lo;
  r.y = (u32)(lo >> 32);
  r.z = (u32)hi;
  r.w = (u32)(hi >> 32);
  return r;
}

// ---------------------------------------------------------------------------
// Bulk reduction: dst[d][k] = reduce over q = 0..W-1 (rank order) of
// src[q][k] for k < n elements, for every d < nd. Threads tid of nthreads
// share the work; with vec every pointer is 16-byte aligned and whole
// vectors move as 16-byte accesses (one per source in flight per thread:
// W loads, then the reduction, then nd stores), the rest element by
// element. srcs and dsts are arrays of
// GOEP_COLL_MAX_RANKS entries (unused ones ignored); with full unrolling
// they stay in registers.
template <int DT>
__device__ __forceinline__ void goep_coll_reduce_range(const char* const* srcs, u32 W, char* const* dsts, u32 nd,
                                                       u64 n, bool vec, u64 tid, u64 nthreads, u32 op) {
  typedef goep_coll_type<DT> T;
  const u64 V = 16 / T::size;
  const u64 nv = vec ? n / V : 0;
  u64 i = tid;
  for (; i < nv; i += nthreads) {
    goep_u128 a[GOEP_COLL_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < GOEP_COLL_MAX_RANKS; ++q) {
      if (q < W) {
        a[q] = goep_coll_ld_cg((const goep_u128*)srcs[q] + i);
      }
    }
    goep_coll_acc8<DT> a0(op), a1(op);
    a0.init(goep_coll_lo(a[0]));
    a1.init(goep_coll_hi(a[0]));
#pragma unroll
    for (u32 q = 1; q < GOEP_COLL_MAX_RANKS; ++q) {
      if (q < W) {
        a0.add(goep_coll_lo(a[q]));
        a1.add(goep_coll_hi(a[q]));
      }
    }
    const goep_u128 ra = goep_coll_u128(a0.get(), a1.get());
#pragma unroll
    for (u32 d = 0; d < GOEP_COLL_MAX_RANKS; ++d) {
      if (d < nd) {
        goep_copy_st<goep_u128>((goep_u128*)dsts[d] + i, ra);
      }
    }
  }
  // Elements after the whole vectors (all of them without vec).
  for (u64 k = nv * V + tid; k < n; k += nthreads) {
    float acc = T::to_f32(goep_coll_ld_elem(srcs[0], k, T::size));
#pragma unroll
    for (u32 q = 1; q < GOEP_COLL_MAX_RANKS; ++q) {
      if (q < W) {
        acc = goep_coll_combine_rt(op, acc, T::to_f32(goep_coll_ld_elem(srcs[q], k, T::size)));
      }
    }
    const u32 r = T::from_f32(acc);
#pragma unroll
    for (u32 d = 0; d < GOEP_COLL_MAX_RANKS; ++d) {
      if (d < nd) {
        goep_coll_st_elem(dsts[d], k, T::size, r);
      }
    }
  }
}

// Copies bytes from src, memory other GPUs write (loads bypass L1, see
// goep_coll_ld_cg), to dst with threads tid of n: 16-byte vectors, four in
// flight per thread, when both agree modulo 16; bytes otherwise.
__device__ __forceinline__ void goep_coll_copy_fresh(char* dst, const char* src, u64 bytes, u32 tid, u32 n) {
  if ((((u64)dst ^ (u64)src) & 15) != 0) {
    for (u64 i = tid; i < bytes; i += n) {
      dst[i] = *(const volatile char*)(src + i);
    }
    return;
  }
  u64 head = (16 - ((u64)dst & 15)) & 15;
  if (head > bytes) {
    head = bytes;
  }
  for (u64 i = tid; i < head; i += n) {
    dst[i] = *(const volatile char*)(src + i);
  }
  dst += head;
  src += head;
  bytes -= head;
  const u64 nv = bytes / 16;
  const goep_u128* s = (const goep_u128*)src;
  goep_u128* d = (goep_u128*)dst;
  u64 i = tid;
  for (; i + 3ull * n < nv; i += 4ull * n) {
    const goep_u128 a = goep_coll_ld_cg(s + i), b = goep_coll_ld_cg(s + i + n);
    const goep_u128 c = goep_coll_ld_cg(s + i + 2ull * n), e = goep_coll_ld_cg(s + i + 3ull * n);
    goep_copy_st<goep_u128>(d + i, a);
    goep_copy_st<goep_u128>(d + i + n, b);
    goep_copy_st<goep_u128>(d + i + 2ull * n, c);
    goep_copy_st<goep_u128>(d + i + 3ull * n, e);
  }
  for (; i < nv; i += n) {
    goep_copy_st<goep_u128>(d + i, goep_coll_ld_cg(s + i));
  }
  for (u64 k = nv * 16 + tid; k < bytes; k += n) {
    dst[k] = *(const volatile char*)(src + k);
  }
}

// Calls FN<dtype>(args...) for a runtime dtype code (checked by the host:
// bf16, fp16 or fp32).
#define GOEP_COLL_DISPATCH(DTYPE, FN, ...)      \
  do {                                          \
    if ((DTYPE) == GOEP_COLL_FP16) {            \
      FN<GOEP_COLL_FP16>(__VA_ARGS__);          \
    } else if ((DTYPE) == GOEP_COLL_FP32) {     \
      FN<GOEP_COLL_FP32>(__VA_ARGS__);          \
    } else {                                    \
      FN<GOEP_COLL_BF16>(__VA_ARGS__);          \
    }                                           \
  } while (0)

// ---------------------------------------------------------------------------
// Kernel prologue and block-level synchronisation.

__device__ __forceinline__ u64 goep_coll_gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 goep_coll_gthreads() { return (u64)gridDim.x * blockDim.x; }

// Copies the context into shared memory (one pass of 4-byte words).
__device__ __forceinline__ void goep_coll_load_ctx(goep_coll_ctx& dst, const goep_coll_ctx* src) {
  const u32 words = sizeof(goep_coll_ctx) / 4;
  for (u32 i = threadIdx.x; i < words; i += blockDim.x) {
    ((u32*)&dst)[i] = ((const u32*)src)[i];
  }
  __syncthreads();
}

// The next peer in this rank's rotation: (rank + j) mod world, so that at
// any moment the ranks' blocks feed different links.
__device__ __forceinline__ u32 goep_coll_peer(const goep_coll_ctx& c, u32 j) {
  u32 p = c.rank + j;
  return p >= c.world ? p - c.world : p;
}

// This block's semaphore with peer p.
__device__ __forceinline__ const goep_semaphore& goep_coll_sem(const goep_coll_ctx& c, u32 p) {
  return c.sems[(u64)blockIdx.x * GOEP_COLL_MAX_RANKS + p];
}

// Block barrier with every peer: every thread's earlier writes (to peers'
// memory too) are visible to the peers' blocks of the same index once they
// pass theirs, and theirs to this block. Lane p of warp 0 signals peer p
// (release) and waits for peer p (acquire). Returns false, in every thread,
// when a wait gave up; the kernel must then leave.
__device__ __forceinline__ bool goep_coll_barrier(const goep_coll_ctx& c, u32 stage) {
  __syncthreads();
  const u32 t = threadIdx.x;
  bool ok = true;
  if (t < c.world && t != c.rank) {
    const goep_semaphore& s = goep_coll_sem(c, t);
    goep_sem_signal(s);
    ok = goep_sem_wait(s, stage);
  }
  return !goep_block_any_failed(!ok);
}

// Entry barrier of the zero-copy kernels, which also tells each peer which
// buffers this rank uses: lane p writes this rank's descriptor into peer p's
// mailbox slot [block][rank], signals and waits for peer p, then reads peer
// p's descriptor and resolves peer p's send and recv pointers through the
// registration table (as mapped on this GPU). s_in / s_out are shared
// arrays indexed by rank; this rank's own entries are in and out.
__device__ __forceinline__ bool goep_coll_exchange(const goep_coll_ctx& c, u32 in_reg, u64 in_off, u32 out_reg,
                                                   u64 out_off, const char* in, char* out, const char** s_in,
                                                   char** s_out) {
  __syncthreads();
  const u32 t = threadIdx.x;
  bool ok = true;
  if (t < c.world && t != c.rank) {
    volatile char* box = c.mailbox[t] + ((u64)blockIdx.x * GOEP_COLL_MAX_RANKS + c.rank) * GOEP_COLL_DESC_SIZE;
    *(volatile u32*)(box + 0) = in_reg;
    *(volatile u32*)(box + 4) = out_reg;
    *(volatile u64*)(box + 8) = in_off;
    *(volatile u64*)(box + 16) = out_off;
    const goep_semaphore& s = goep_coll_sem(c, t);
    goep_sem_signal(s);
    ok = goep_sem_wait(s, GOEP_COLL_STAGE_ENTRY);
    if (ok) {
      const volatile char* mine = c.mailbox[c.rank] + ((u64)blockIdx.x * GOEP_COLL_MAX_RANKS + t) * GOEP_COLL_DESC_SIZE;
      const u32 ir = *(const volatile u32*)(mine + 0);
      const u32 orr = *(const volatile u32*)(mine + 4);
      const u64 io = *(const volatile u64*)(mine + 8);
      const u64 oo = *(const volatile u64*)(mine + 16);
      s_in[t] = (ir < c.max_regs) ? (const char*)(c.regs[(u64)ir * GOEP_COLL_MAX_RANKS + t] + io) : nullptr;
      s_out[t] = (orr < c.max_regs) ? (char*)(c.regs[(u64)orr * GOEP_COLL_MAX_RANKS + t] + oo) : nullptr;
    }
  }
  if (t == 0) {
    s_in[c.rank] = in;
    s_out[c.rank] = out;
  }
  return !goep_block_any_failed(!ok);
}

#endif  // GOEP_COLL_COMMON_CUH
