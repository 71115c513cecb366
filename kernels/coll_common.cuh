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
//     offset they use (the peer reads its own mapping in the regs table);
//   - the control block of every rank (GOEP_COLL_CTRL_*, in its scratch
//     buffer after the mailboxes, zeroed once at setup): pub[src], the
//     fingerprint src published last (an LL16 packet, written by src). This
//     rank's launch counter and failed flag live in its own goep_coll_ctx
//     (seq, failed), which every launch copies anyway: reading them costs no
//     extra load at the start of a kernel.
//
// Call fingerprint (always on; collectives/fingerprint.go packs and decodes
// it): bits 0..11 the launch's sequence number, ctx.seq + 1 at its start
// (the kernels advance ctx.seq themselves, so CUDA-graph replays and
// direct calls stay in step), bits 12..63 the call's shape as the launcher
// packed it (kind, dtype, op, algorithm, bulk grid, count), passed as the
// kernel's last argument. Its 32-bit tag (goep_coll_fp_tag) rides in the
// messages a launch exchanges anyway, so that a matching call pays no
// extra instruction on its critical path beyond comparing the flags it
// compared before fingerprints, no extra load, store, fence or wait:
//   - LL kernels: the tag (without the sequence number) is folded into the
//     flags of every data packet (goep_coll_llf): a packet is accepted only
//     with this round's flag AND this call's tag, so accepting it proves
//     the sender made the same call. Every LL launch reads at least one
//     packet from every peer (count 0: goep_coll_fp_sync; ll2's empty
//     pieces: a presence packet), so no rank can finish a launch that
//     differs from any peer's;
//   - bulk kernels: each block's entry signal adds the tag above the signal
//     count (goep_coll_sem_signal_tag); the entry wait reaches its target
//     only with the same tag in the same register comparison that sees the
//     count (goep_coll_sem_wait_tag).
// The whole word, needed to name the fields and to see a peer that is in
// another kind of kernel (it sends nothing a wait could see), is published
// into every peer's pub[rank] only off the fast path: by bulk kernels'
// block 0 right after its entry signal (no release follows it), and by LL
// kernels only once one of their waits is behind (goep_coll_ll_publish,
// every GOEP_SPIN_CHECK_EVERY polls, or at once on a packet of this round
// with another tag). A published word carries the full 32-bit launch
// number as its packet flag, so a word published many launches ago is
// never taken for this launch's. Waits that are behind read the peers'
// published words (goep_coll_fp_watch): a peer at this launch with another
// word is a mismatch. Since a mismatched rank can never accept a packet or
// signal of a peer whose call differs, every rank of a mismatched launch
// ends up waiting, publishes, and sees a peer's word that differs from its
// own (whatever two ranks differ in, every rank differs from one of them):
// the mismatch fails every rank, never a hang until the timeout. The first
// thread to see a mismatch fills the watchdog record with stage
// GOEP_COLL_STAGE_MISMATCH, peer = that rank, expected = own fingerprint,
// observed = the peer's, raises the abort flag and the kernel leaves.
//
// GOEP_NO_FINGERPRINT (common.cuh, a measurement switch) compiles all of
// this out: goep_coll_begin returns a constant without looking at failed,
// LL flags are the round's alone (goep_ll_flag_begin/_end, no tag, no
// presence packets, count-0 launches do nothing), semaphore signals add 1
// and waits are goep_sem_wait, nothing is published, and ctx.seq does not
// advance (no launch counter): the kernels before fingerprints.
//
// ctx.failed: once any wait of a launch gave up (mismatch or timeout),
// every later launch of this rank leaves at once without writing to a peer,
// so peers never pair a stale sequence number of a broken rank with calls.
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
#define GOEP_COLL_STAGE_MISMATCH 7  // a peer's call fingerprint differs (not a timeout)
#define GOEP_COLL_STAGE_FP 8        // waiting for a count-0 call's packet (goep_coll_fp_sync; the twins: a fingerprint)

// Control block byte offsets (GOEP_COLL_CTRL_BYTES per rank), written by
// peers only.
#define GOEP_COLL_CTRL_FP 0    // u64[GOEP_COLL_MAX_RANKS]: the host kernel twins' fp[src] (collectives/twins.go)
#define GOEP_COLL_CTRL_PUB 64  // goep_ll16[GOEP_COLL_MAX_RANKS]: pub[src], src's published fingerprint
#define GOEP_COLL_CTRL_BYTES 192
#define GOEP_COLL_FP_SEQ_MASK 0xfffull
static_assert(GOEP_COLL_CTRL_FP + GOEP_COLL_MAX_RANKS * 8 <= GOEP_COLL_CTRL_PUB, "goep: coll ctrl");
static_assert(GOEP_COLL_CTRL_PUB + GOEP_COLL_MAX_RANKS * 16 <= GOEP_COLL_CTRL_BYTES, "goep: coll ctrl");

// Semaphore values of the bulk kernels: bits 0..31 the progress part (the
// signals so far), bits 32..63 the running sum of the tags (goep_coll_fp_tag)
// that entry signals add, see "Call fingerprint" above.
#define GOEP_COLL_SIG_SHIFT 32
#define GOEP_COLL_SIG_PROGRESS_MASK ((1ull << GOEP_COLL_SIG_SHIFT) - 1ull)

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
  char* ctrl[GOEP_COLL_MAX_RANKS];  // every rank's control block
  // Written by this rank's kernels (through self), zero at setup:
  u64 seq;                     // launches completed
  u64 failed;                  // nonzero once a wait gave up
  u32 arrived;                 // blocks of the running bulk launch that finished
  u32 pad;                     // zero; in a block's shared copy: nonzero once it published (goep_coll_ll_publish)
  struct goep_coll_ctx* self;  // this struct's own device address
};
static_assert(sizeof(goep_coll_ctx) == 384, "goep: goep_coll_ctx layout");
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
static_assert(GOEP_OFFSETOF(goep_coll_ctx, ctrl) == 288, "goep: goep_coll_ctx.ctrl");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, seq) == 352, "goep: goep_coll_ctx.seq");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, failed) == 360, "goep: goep_coll_ctx.failed");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, arrived) == 368, "goep: goep_coll_ctx.arrived");
static_assert(GOEP_OFFSETOF(goep_coll_ctx, self) == 376, "goep: goep_coll_ctx.self");

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

// The same, assigning FN's result to RES.
#define GOEP_COLL_DISPATCH_R(RES, DTYPE, FN, ...) \
  do {                                          \
    if ((DTYPE) == GOEP_COLL_FP16) {            \
      RES = FN<GOEP_COLL_FP16>(__VA_ARGS__);    \
    } else if ((DTYPE) == GOEP_COLL_FP32) {     \
      RES = FN<GOEP_COLL_FP32>(__VA_ARGS__);    \
    } else {                                    \
      RES = FN<GOEP_COLL_BF16>(__VA_ARGS__);    \
    }                                           \
  } while (0)

// ---------------------------------------------------------------------------
// Kernel prologue and block-level synchronisation.

__device__ __forceinline__ u64 goep_coll_gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 goep_coll_gthreads() { return (u64)gridDim.x * blockDim.x; }

// ---------------------------------------------------------------------------
// Call fingerprints (see the top of this file).

// This launch's number, the flag of the fingerprint it publishes: the low
// 32 bits of ctx.seq + 1 (the fingerprint keeps only 12 of them).
__device__ __forceinline__ u32 goep_coll_launch_no(const goep_coll_ctx& c) { return (u32)(c.seq + 1ull); }

// pub[src] in rank p's control block.
__device__ __forceinline__ goep_ll16* goep_coll_pub_slot(const goep_coll_ctx& c, u32 p, u32 src) {
  return (goep_ll16*)(c.ctrl[p] + GOEP_COLL_CTRL_PUB) + src;
}

// Kernel prologue: copies the context into shared memory (one pass of
// 4-byte words, seq and failed with it: the launch counter cannot move
// before every block of the launch has copied it, see goep_coll_end) and
// returns this launch's fingerprint, the launcher's shape with the sequence
// number, read from the shared copy so that every thread of a block agrees.
// Returns 0 (never a fingerprint: the kind bits are nonzero) in every
// thread when a launch of this rank failed: the kernel must leave at once.
__device__ __forceinline__ u64 goep_coll_begin(goep_coll_ctx& dst, const goep_coll_ctx* src, u64 shape) {
  const u32 words = sizeof(goep_coll_ctx) / 4;
  for (u32 i = threadIdx.x; i < words; i += blockDim.x) {
    ((u32*)&dst)[i] = ((const u32*)src)[i];
  }
  __syncthreads();
#if GOEP_NO_FINGERPRINT
  (void)shape;
  return 1;  // a constant: every "fp == 0" test folds away
#endif
  if (dst.failed != 0) {
    return 0;
  }
  return (shape & ~GOEP_COLL_FP_SEQ_MASK) | ((dst.seq + 1ull) & GOEP_COLL_FP_SEQ_MASK);
}

// This launch's fingerprint into peer p's pub[rank] (one relaxed 16-byte
// store, flag = the launch number: never just before a release of the same
// thread, which would then wait for it).
__device__ __forceinline__ void goep_coll_pub_put(const goep_coll_ctx& c, u32 p, u64 fp) {
  goep_ll16_store(goep_coll_pub_slot(c, p, c.rank), (u32)fp, (u32)(fp >> 32), goep_coll_launch_no(c));
}

// Peer q's published fingerprint of this launch into theirs; false when q
// has not published one for this launch (yet). A slot never written reads
// as fp 0, which no launch has.
__device__ __forceinline__ bool goep_coll_pub_get(const goep_coll_ctx& c, u32 q, u64& theirs) {
  u32 lo, hi, seen;
  if (!goep_ll16_try(goep_coll_pub_slot(c, c.rank, q), goep_coll_launch_no(c), lo, hi, seen)) {
    return false;
  }
  theirs = (u64)lo | ((u64)hi << 32);
  return theirs != 0;
}

// How a peer's fingerprint compares with this launch's: the peer is behind
// (an older launch: keep waiting), ahead (it already passed this launch,
// having checked it), the same call, or a mismatch. Sequence numbers
// compare as 12-bit signed distances (ranks are never 2^11 launches apart:
// every launch waits on every rank). Also the result of goep_coll_sig_cmp.
#define GOEP_COLL_FP_BEHIND 0
#define GOEP_COLL_FP_SAME 1
#define GOEP_COLL_FP_AHEAD 2
#define GOEP_COLL_FP_MISMATCH 3

// The 32-bit tag of a fingerprint that the bulk kernels' entry signals
// carry: the word folded by XOR of its halves. Each field lands on distinct
// tag bits (sequence 0..11, kind 12..13, dtype 14..16, op 17..19, algorithm
// 20..22, grid 23..31 and 0, count 1..31), so any difference confined to
// one field changes the tag; the fold is linear, so only differences in
// several fields that cancel exactly go unseen.
__device__ __forceinline__ u64 goep_coll_fp_tag(u64 fp) { return (fp ^ (fp >> 32)) & GOEP_COLL_SIG_PROGRESS_MASK; }

// A wait of this launch gave up: later launches of this rank leave at once.
__device__ __forceinline__ void goep_coll_set_failed(const goep_coll_ctx& c) {
#if !GOEP_NO_FINGERPRINT
  *(volatile u64*)&c.self->failed = 1;
#endif
}

// The launch counter's last step (one thread of the launch): the value
// every block copied at its start, plus one (a store, no load).
__device__ __forceinline__ void goep_coll_advance(const goep_coll_ctx& c) {
#if !GOEP_NO_FINGERPRINT
  *(volatile u64*)&c.self->seq = c.seq + 1ull;
#endif
}

// Records a mismatch with peer (the first thread of the watchdog wins; the
// record's id is the LL wait id of that peer, which tells the host the
// record is this communicator's), aborts the launch's other waits and marks
// the rank failed.
__device__ __noinline__ void goep_coll_mismatch(const goep_coll_ctx& c, u32 peer, u64 mine, u64 theirs) {
  goep_watchdog_expire(c.wd, GOEP_OP_VALUE, c.ll_id[peer], peer, GOEP_COLL_STAGE_MISMATCH, 0, mine, theirs);
  goep_coll_set_failed(c);
}

// One look at every peer's published fingerprint (the slow path of a
// wait): false, with the mismatch recorded, when a peer published another
// word for this launch. Any difference counts: two ranks at the same
// launch number are at the same call of the sequence.
__device__ __noinline__ bool goep_coll_fp_watch(const goep_coll_ctx& c, u64 fp) {
  for (u32 q = 0; q < c.world; ++q) {
    u64 f;
    if (q != c.rank && goep_coll_pub_get(c, q, f) && f != fp) {
      goep_coll_mismatch(c, q, fp, f);
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// LL launches: the tag in the packet flags. A packet {lo, fa, hi, fb} of an
// LL round with flag f (the coll flag counter, goep_coll_ll_flag_next) and
// call tag t = goep_coll_fp_tag of the fingerprint without its sequence
// number carries fa = f ^ (t << 16) and fb = f ^ (t & 0xffff0000): the
// round in the low 16 bits of both, the tag's two halves XORed into the
// high 16 bits of one each. A reader accepts a packet only with both flags
// equal to its own, which is the check it made before fingerprints (two
// 32-bit compares of the same load), now also proving the sender's call
// has the same 32-bit tag.
//
// Stale packets (buffers are never cleared): a half written in round r'
// with tag t' equals this round's (r, t) only when r' and r agree in their
// low 16 bits and r' ^ r == (t' ^ t) << 16 in the high ones: never within
// 2^16 rounds, and for the same call (t' = t) only when r' = r, as before
// fingerprints (flags repeat after 2^32 rounds). The counter skips values
// whose low 16 bits are 0 (and keeps parity alternating), so a tagged flag
// is never 0, the flag of memory never written.
//
// A flag whose low 16 bits are this round's but whose high bits are not
// (goep_coll_ll_suspect) is most likely a peer's packet of this round with
// another tag: the wait publishes and looks at the peers' words at once
// (a stale packet that happens to look so is then seen to be no mismatch,
// and the wait goes on).
struct goep_coll_llf {
  u32 a, b;
};

__device__ __forceinline__ u32 goep_coll_ll_flag_next(u32 f) {
#if GOEP_NO_FINGERPRINT
  return goep_ll_flag_next(f);
#else
  f += 1u;
  return (f & 0xffffu) != 0u ? f : f + 2u;
#endif
}
__device__ __forceinline__ u32 goep_coll_ll_flag_begin(const goep_ll_flag* f) {
  return goep_coll_ll_flag_next(*(const volatile u32*)&f->value);
}

// The call tag of fp for LL flags: the sequence number left out (rounds are
// ordered by the flag itself), so one call repeated keeps the 2^32-round
// flag period.
__device__ __forceinline__ u32 goep_coll_ll_tag(u64 fp) {
#if GOEP_NO_FINGERPRINT
  (void)fp;
  return 0;  // flags {round, round}: goep_ll16_store's packets
#else
  return (u32)goep_coll_fp_tag(fp & ~GOEP_COLL_FP_SEQ_MASK);
#endif
}

__device__ __forceinline__ goep_coll_llf goep_coll_llf_make(u32 flag, u32 tag) {
  goep_coll_llf r;
  r.a = flag ^ (tag << 16);
  r.b = flag ^ (tag & 0xffff0000u);
  return r;
}

__device__ __forceinline__ void goep_coll_ll_store(goep_ll16* p, u64 v, goep_coll_llf f) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" : : "l"(p), "r"((u32)v), "r"(f.a),
               "r"((u32)(v >> 32)), "r"(f.b) : "memory");
}

// One look at a packet: 0 (with the payload) when both flags are f's, else
// the flags' difference (f.a ^ first) | (f.b ^ second).
__device__ __forceinline__ u32 goep_coll_ll_look(const goep_ll16* p, goep_coll_llf f, u32& lo, u32& hi) {
  u32 a, b, c, d;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p)
               : "memory");
  lo = a;
  hi = c;
  return (b ^ f.a) | (d ^ f.b);
}

// A look's difference that says "this round, another tag".
__device__ __forceinline__ bool goep_coll_ll_suspect(u32 diff) { return diff != 0 && (diff & 0xffffu) == 0; }

// Publishes this launch's fingerprint to every peer, once per block (the
// block's shared copy of the context remembers it in pad): the slow path
// of LL waits. Racing threads of a block may both publish the same words.
__device__ __noinline__ void goep_coll_ll_publish(const goep_coll_ctx& c, u64 fp) {
  volatile u32* done = (volatile u32*)&c.pad;
  if (*done != 0) {
    return;
  }
  *done = 1;
  for (u32 q = 0; q < c.world; ++q) {
    if (q != c.rank) {
      goep_coll_pub_put(c, q, fp);
    }
  }
}

// The slow path of a packet read (the packet was not there at the first
// look): waits for it, bounded by the watchdog; publishes and watches the
// peers' words every GOEP_SPIN_CHECK_EVERY polls, and at every look that
// finds a packet of this round with another tag. False when the wait gave
// up (timeout, abort or mismatch); the rank is then marked failed.
__device__ __noinline__ bool goep_coll_ll_wait(const goep_coll_ctx& c, const goep_ll16* p, goep_coll_llf f, u32 from,
                                               u32 stage, u64 fp, u32& lo, u32& hi) {
  goep_spin s = goep_spin_start();
  u32 diff;
  while ((diff = goep_coll_ll_look(p, f, lo, hi)) != 0) {
    if (!goep_spin_ok(s, c.wd, GOEP_OP_PACKET, c.ll_id[from], from, stage, f.a, f.a ^ diff)) {
      goep_coll_set_failed(c);
      return false;
    }
    if (!GOEP_NO_FINGERPRINT && (goep_coll_ll_suspect(diff) || (s.count & (GOEP_SPIN_CHECK_EVERY - 1)) == 0)) {
      goep_coll_ll_publish(c, fp);
      if (!goep_coll_fp_watch(c, fp)) {
        return false;
      }
    }
  }
  return true;
}

// Reads a packet sent by rank `from`, bounded; false when the wait gave up.
// A packet that is there at the first look costs what it did before
// fingerprints: one load, two compares.
__device__ __forceinline__ bool goep_coll_get_word(const goep_coll_ctx& c, const goep_ll16* p, goep_coll_llf f,
                                                   u32 from, u32 stage, u64 fp, u64& v) {
  u32 lo, hi;
  if (goep_coll_ll_look(p, f, lo, hi) != 0 && !goep_coll_ll_wait(c, p, f, from, stage, fp, lo, hi)) {
    return false;
  }
  v = (u64)lo | ((u64)hi << 32);
  return true;
}

// ---------------------------------------------------------------------------
// Bulk launches: tagged semaphore signals. A block's entry signal to peer p
// adds 1 + (tag << 32) (goep_coll_fp_tag of this launch's fingerprint), its
// later signals add 1. The receiver keeps the same running sum in its
// expected word: an entry wait waits for expected + 1 + (own tag << 32),
// the others for expected + 1. A wait polls the semaphore alone, as before
// fingerprints; once the progress part reaches its target it compares the
// tag part with its own in registers: a matching call costs no extra load,
// store or fence. The fingerprint itself is published after the entry
// signal (block 0 only: a release would otherwise wait for it; a peer in
// an LL kernel that waits for this rank looks for it) and the peers' are
// read only off the fast path: every GOEP_SPIN_CHECK_EVERY polls of a wait
// that is behind (a peer in another kind of kernel signals nothing here)
// and, after a tag that differs, to name the fields.

__device__ __forceinline__ void goep_coll_sem_signal_tag(const goep_semaphore& s, u64 tag) {
#if GOEP_NO_FINGERPRINT
  (void)tag;
  goep_sem_signal(s);
  return;
#endif
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(s.remote), "l"(1ull + (tag << GOEP_COLL_SIG_SHIFT))
               : "memory");
}

// How a semaphore value v compares with target (progress and tag parts,
// see above): behind (the progress part, as a signed 32-bit distance, has
// not reached it), ahead (past it: the peer passed this wait, which it does
// only after its own wait saw this rank's signal carry its tag), or exactly
// at it, where the tag part says whether the signal is this call's.
__device__ __forceinline__ int goep_coll_sig_cmp(u64 v, u64 target) {
  const u64 d = v - target;
  const u64 lo = d & GOEP_COLL_SIG_PROGRESS_MASK;
  if (lo != 0) {
    return (lo >> (GOEP_COLL_SIG_SHIFT - 1)) != 0 ? GOEP_COLL_FP_BEHIND : GOEP_COLL_FP_AHEAD;
  }
  return (d >> GOEP_COLL_SIG_SHIFT) == 0 ? GOEP_COLL_FP_SAME : GOEP_COLL_FP_MISMATCH;
}

// The end of a semaphore wait that saw a signal with another tag (off the
// fast path): names the fields from the peer's published fingerprint, which
// the peer's block 0 writes just after its entry signal without ordering it
// before it: looks until it is this launch's (bounded by the watchdog's
// timeout; past it, the record names no fields of the peer).
__device__ __noinline__ void goep_coll_sig_mismatch(const goep_coll_ctx& c, u32 peer, u64 fp) {
  u64 f = 0;
  const u64 start = goep_globaltimer();
  while (!goep_coll_pub_get(c, peer, f) && !goep_aborted(c.wd) && goep_globaltimer() - start < c.wd->timeout_ns) {
  }
  goep_coll_mismatch(c, peer, fp, f);
}

// Waits for peer's next signal on s, with tag (this launch's for an entry
// wait, 0 for the others). Fails on a timeout, or on a mismatch: a signal
// whose tag differs, or (slow path) a peer's published fingerprint of this
// launch that differs.
__device__ __noinline__ bool goep_coll_sem_wait_tag(const goep_coll_ctx& c, const goep_semaphore& s, u32 peer, u64 fp,
                                                    u64 tag, u32 stage) {
#if GOEP_NO_FINGERPRINT
  (void)c, (void)peer, (void)fp, (void)tag;
  return goep_sem_wait(s, stage);
#endif
  const u64 target = goep_sem_expected(s) + 1ull + (tag << GOEP_COLL_SIG_SHIFT);
  goep_spin sp = goep_spin_start();
  u64 v;
  int r;
  while ((r = goep_coll_sig_cmp(v = goep_chan_ld_relaxed_sys_u64(s.inbound), target)) == GOEP_COLL_FP_BEHIND) {
    if (!goep_spin_ok(sp, s.wd, GOEP_OP_SEM_WAIT, s.id, s.peer, stage, target & GOEP_COLL_SIG_PROGRESS_MASK,
                      v & GOEP_COLL_SIG_PROGRESS_MASK)) {
      goep_coll_set_failed(c);
      return false;
    }
    if ((sp.count & (GOEP_SPIN_CHECK_EVERY - 1)) == 0 && !goep_coll_fp_watch(c, fp)) {
      return false;
    }
  }
  if (r == GOEP_COLL_FP_MISMATCH) {
    goep_coll_sig_mismatch(c, peer, fp);
    return false;
  }
  (void)goep_ld_acquire_sys_u64(s.inbound);
  goep_sem_consumed(s, target);
  return true;
}

// Advances this rank's launch counter once every block of the launch has
// arrived here (every block read it in goep_coll_begin before arriving).
// Call from every thread of every block, as the kernel's last step. LL
// kernels use goep_coll_ll_end instead (one arrival for flag and counter).
__device__ __forceinline__ void goep_coll_end(const goep_coll_ctx& c) {
#if GOEP_NO_FINGERPRINT
  (void)c;
  return;  // no launch counter to advance
#endif
  __syncthreads();
  if (threadIdx.x != 0) {
    return;
  }
  if (gridDim.x == 1) {
    goep_coll_advance(c);
    return;
  }
  u32 prev;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&c.self->arrived) : "memory");
  if (prev == gridDim.x - 1) {
    *(volatile u32*)&c.self->arrived = 0;
    goep_coll_advance(c);
  }
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
// (release) and waits for peer p (acquire). The entry barrier (entry =
// true) signals with this launch's tag and waits for the peer's signal to
// carry the same (goep_coll_sem_wait_tag), so every block checks every
// peer's call before it moves data; block 0 then writes the fingerprint
// word into peer p's fp[rank], after the release so that it never waits
// for it. Returns false, in every thread, when a wait gave up; the kernel
// must then leave.
__device__ __forceinline__ bool goep_coll_barrier(const goep_coll_ctx& c, u64 fp, u32 stage, bool entry = false) {
  __syncthreads();
  const u32 t = threadIdx.x;
  bool ok = true;
  if (t < c.world && t != c.rank) {
    const goep_semaphore& s = goep_coll_sem(c, t);
    const u64 tag = entry ? goep_coll_fp_tag(fp) : 0ull;
    goep_coll_sem_signal_tag(s, tag);
    if (!GOEP_NO_FINGERPRINT && entry && blockIdx.x == 0) {
      goep_coll_pub_put(c, t, fp);
    }
    ok = goep_coll_sem_wait_tag(c, s, t, fp, tag, stage);
  }
  return !goep_block_any_failed(!ok);
}

// Entry barrier of the zero-copy kernels, which also tells each peer which
// buffers this rank uses: lane p writes this rank's descriptor into peer
// p's mailbox slot [block][rank], signals with this launch's tag (the
// release covers the descriptor; block 0 then publishes the fingerprint,
// as in goep_coll_barrier) and waits for peer p's tagged signal, then reads peer
// p's descriptor and resolves peer p's send and recv pointers through the
// registration table (as mapped on this GPU). s_in / s_out are shared
// arrays indexed by rank; this rank's own entries are in and out.
__device__ __forceinline__ bool goep_coll_exchange(const goep_coll_ctx& c, u64 fp, u32 in_reg, u64 in_off,
                                                   u32 out_reg, u64 out_off, const char* in, char* out,
                                                   const char** s_in, char** s_out) {
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
    const u64 tag = goep_coll_fp_tag(fp);
    goep_coll_sem_signal_tag(s, tag);
    if (!GOEP_NO_FINGERPRINT && blockIdx.x == 0) {
      goep_coll_pub_put(c, t, fp);
    }
    ok = goep_coll_sem_wait_tag(c, s, t, fp, tag, GOEP_COLL_STAGE_ENTRY);
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
