// coll_ll.cu: the LL-packet collectives (small and medium messages). Every
// word of 8 payload bytes travels as one LL16 packet straight into the
// receiver's packet buffer, where the flag next to it says it has arrived:
// no semaphores, no fences, one NVLink trip per round.
//
// Packet buffer use: a round with flag f writes the half goep_ll_half(f) of
// the receiver's buffer (packet_half bytes each) at slot [sender]; every
// round is all-to-all (each rank sends to and receives from every rank), the
// condition under which the two halves let a rank run one round ahead of
// another (packet_device.cuh). The flag counter advances once per round:
// ar_ll2 takes two rounds, the others one.
//
// Call fingerprints (coll_common.cuh): the grid's last W - 1 threads, one
// per peer, send this launch's fingerprint to their peer as one LL16 packet
// before their data work and check that peer's after it
// (goep_coll_ll_fp_check), before
// the launch counts as done; block 0 also writes the fingerprint word into
// every peer's fp[rank] at the start, which a packet wait that does not end
// at its first look watches in its slow path (every GOEP_SPIN_CHECK_EVERY
// polls, so the fast path costs nothing). Packets go only into the
// peers' packet buffers at offsets the launcher checked against them, so a
// mismatched peer can make the data wrong but never write out of bounds;
// the check makes the call an error on every rank.
//
// Work is dealt by global thread index over 8-byte words; the host sizes
// the grid (at most one block per SM, so that all blocks are resident: a
// thread may wait for a packet that a peer's thread of another block
// sends).
#include "coll_common.cuh"

extern "C" {
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ar_ll1(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype, u32 op, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ar_ll2(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype, u32 op, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ag_ll(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_rs_ll(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype, u32 op, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1) goep_coll_fp_sync(const goep_coll_ctx* ctx, u64 shape);
}

// Packet k of slot `slot` (slots of `words` packets) in the half at base of
// rank p's packet buffer.
__device__ __forceinline__ goep_ll16* goep_coll_pkt(const goep_coll_ctx& c, u32 p, u64 base, u64 slot, u64 words,
                                                   u64 k) {
  return (goep_ll16*)(c.packets[p] + base) + slot * words + k;
}

__device__ __forceinline__ void goep_coll_put_word(goep_ll16* p, u64 v, u32 flag) {
  goep_ll16_store(p, (u32)v, (u32)(v >> 32), flag);
}

// The slow path of a packet read: goep_ll16_read that also watches every
// peer's fingerprint whenever it looks at the timer. False when the wait
// gave up (timeout, abort or mismatch); the rank is then marked failed.
__device__ __noinline__ bool goep_coll_ll_wait(const goep_coll_ctx& c, const goep_ll16* p, u32 flag, u32 from,
                                               u32 stage, u64 fp, u32& lo, u32& hi) {
  goep_spin s = goep_spin_start();
  u32 seen;
  while (!goep_ll16_try(p, flag, lo, hi, seen)) {
    if (!goep_spin_ok(s, c.wd, GOEP_OP_PACKET, c.ll_id[from], from, stage, flag, seen)) {
      goep_coll_set_failed(c);
      return false;
    }
    if ((s.count & (GOEP_SPIN_CHECK_EVERY - 1)) == 0 && !goep_coll_fp_watch(c, fp, GOEP_COLL_FP_PACKETS_MASK)) {
      return false;
    }
  }
  return true;
}

// Reads a packet sent by rank `from`, bounded; false when the wait gave up.
// A packet that is there at the first look costs what it did before
// fingerprints.
__device__ __forceinline__ bool goep_coll_get_word(const goep_coll_ctx& c, const goep_ll16* p, u32 flag, u32 from,
                                                   u32 stage, u64 fp, u64& v) {
  u32 lo, hi, seen;
  if (!goep_ll16_try(p, flag, lo, hi, seen) && !goep_coll_ll_wait(c, p, flag, from, stage, fp, lo, hi)) {
    return false;
  }
  v = (u64)lo | ((u64)hi << 32);
  return true;
}

// The end of an LL launch: each fingerprint thread checks its peer's
// fingerprint packet (goep_coll_ll_fp_check, skipped when its own wait gave
// up), then every block arrives once for both the packet flag and the
// launch counter: the last one publishes flag and advances the counter
// (goep_ll_flag_end's protocol), after every thread of the launch, that
// check included, is done with it.
__device__ __forceinline__ void goep_coll_ll_finish(const goep_coll_ctx& c, u64 fp, bool ok, u32 fpp, u32 first,
                                                    u32 flag) {
  if (fpp < c.world && ok) {
    (void)goep_coll_ll_fp_check(c, fpp, first, fp);
  }
  __syncthreads();
  if (threadIdx.x != 0) {
    return;
  }
  goep_ll_flag* f = c.flag;
  if (gridDim.x == 1) {
    f->value = flag;
    goep_coll_advance(c);
    return;
  }
  u32 prev;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&f->arrived) : "memory");
  if (prev == gridDim.x - 1) {
    f->arrived = 0;
    f->value = flag;
    goep_coll_advance(c);
  }
}

// The start of an LL launch after goep_coll_begin: block 0 publishes the
// fingerprint word, each fingerprint thread sends its peer this launch's
// packet (before its data work). Returns the thread's fingerprint peer
// (goep_coll_ll_fp_peer).
__device__ __forceinline__ u32 goep_coll_ll_start(const goep_coll_ctx& c, u64 fp, u32 first) {
  goep_coll_publish_fp(c, fp);
  const u32 fpp = goep_coll_ll_fp_peer(c);
  if (fpp < c.world) {
    goep_coll_ll_fp_put(c, fpp, first, fp);
  }
  return fpp;
}

// ---------------------------------------------------------------------------
// Allreduce, one shot (all pairs): every rank sends its whole input to every
// peer (slot [sender]) and reduces all of them itself, in rank order. The
// thread that reads input word k also writes output word k, so in-place
// calls are safe.
template <int DT>
__device__ __forceinline__ bool goep_coll_ar_ll1_run(const goep_coll_ctx& c, const char* in, char* out, u64 bytes,
                                                     u32 flag, u32 op, u64 fp) {
  const u32 me = c.rank, W = c.world;
  const u64 words = (bytes + 7) / 8;
  const u64 base = (u64)goep_ll_half(flag) * c.packet_half;
  const bool ain = ((u64)in & 7) == 0, aout = ((u64)out & 7) == 0;
  const u64 n = goep_coll_gthreads();
  for (u64 k = goep_coll_gtid(); k < words; k += n) {
    const u64 v = goep_ll_gather(in, k, 8, bytes, ain);
    for (u32 j = 1; j < W; ++j) {
      goep_coll_put_word(goep_coll_pkt(c, goep_coll_peer(c, j), base, me, words, k), v, flag);
    }
    goep_coll_acc8<DT> acc(op);
    for (u32 q = 0; q < W; ++q) {
      u64 x = v;
      if (q != me && !goep_coll_get_word(c, goep_coll_pkt(c, me, base, q, words, k), flag, q, GOEP_COLL_STAGE_LL1, fp, x)) {
        return false;
      }
      if (q == 0) {
        acc.init(x);
      } else {
        acc.add(x);
      }
    }
    goep_ll_scatter(out, k, 8, bytes, aout, acc.get());
  }
  return true;
}

extern "C" __global__ void goep_coll_ar_ll1(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                            u32 op, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 flag = goep_ll_flag_begin(c.flag);
  const u32 fpp = goep_coll_ll_start(c, fp, flag);
  const u64 bytes = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_ar_ll1_run, c, (const char*)in, (char*)out, bytes, flag, op, fp);
  goep_coll_ll_finish(c, fp, ok, fpp, flag, flag);
}

// ---------------------------------------------------------------------------
// Allreduce in two LL rounds: the words are cut into W pieces of P words;
// round 1 sends piece p to its owner p (slot [sender]); the owner reduces
// its piece in rank order, writes it to its output and sends it to every
// peer in round 2 (slot [owner]), which unpacks it. Output words of another
// rank's piece are written only after that rank's round-2 packet, which
// follows its read of this rank's round-1 packet, so in-place is safe.
template <int DT>
__device__ __forceinline__ bool goep_coll_ar_ll2_run(const goep_coll_ctx& c, const char* in, char* out, u64 bytes,
                                                     u32 f1, u32 f2, u32 op, u64 fp) {
  const u32 me = c.rank, W = c.world;
  const u64 words = (bytes + 7) / 8;
  const u64 P = (words + W - 1) / W;
  const u64 b1 = (u64)goep_ll_half(f1) * c.packet_half, b2 = (u64)goep_ll_half(f2) * c.packet_half;
  const bool ain = ((u64)in & 7) == 0, aout = ((u64)out & 7) == 0;
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  // Round 1: the other pieces to their owners.
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, j);
    const u64 lo = (u64)p * P, len = lo < words ? min(P, words - lo) : 0;
    for (u64 kk = tid; kk < len; kk += n) {
      goep_coll_put_word(goep_coll_pkt(c, p, b1, me, P, kk), goep_ll_gather(in, lo + kk, 8, bytes, ain), f1);
    }
  }
  // This rank's piece: reduce, keep, send to every peer.
  {
    const u64 lo = (u64)me * P, len = lo < words ? min(P, words - lo) : 0;
    for (u64 kk = tid; kk < len; kk += n) {
      goep_coll_acc8<DT> acc(op);
      for (u32 q = 0; q < W; ++q) {
        u64 x;
        if (q == me) {
          x = goep_ll_gather(in, lo + kk, 8, bytes, ain);
        } else if (!goep_coll_get_word(c, goep_coll_pkt(c, me, b1, q, P, kk), f1, q, GOEP_COLL_STAGE_LL1, fp, x)) {
          return false;
        }
        if (q == 0) {
          acc.init(x);
        } else {
          acc.add(x);
        }
      }
      const u64 r = acc.get();
      goep_ll_scatter(out, lo + kk, 8, bytes, aout, r);
      for (u32 j = 1; j < W; ++j) {
        goep_coll_put_word(goep_coll_pkt(c, goep_coll_peer(c, j), b2, me, P, kk), r, f2);
      }
    }
  }
  // Round 2: every other piece from its owner.
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, W - j);  // the reverse rotation: owners that finish first come first
    const u64 lo = (u64)p * P, len = lo < words ? min(P, words - lo) : 0;
    for (u64 kk = tid; kk < len; kk += n) {
      u64 x;
      if (!goep_coll_get_word(c, goep_coll_pkt(c, me, b2, p, P, kk), f2, p, GOEP_COLL_STAGE_LL2, fp, x)) {
        return false;
      }
      goep_ll_scatter(out, lo + kk, 8, bytes, aout, x);
    }
  }
  return true;
}

extern "C" __global__ void goep_coll_ar_ll2(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                            u32 op, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 f1 = goep_ll_flag_begin(c.flag);
  const u32 f2 = goep_ll_flag_next(f1);
  const u32 fpp = goep_coll_ll_start(c, fp, f1);
  const u64 bytes = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_ar_ll2_run, c, (const char*)in, (char*)out, bytes, f1, f2, op, fp);
  goep_coll_ll_finish(c, fp, ok, fpp, f1, f2);
}

// ---------------------------------------------------------------------------
// Allgather: every rank sends its input to every peer (slot [sender]) and
// unpacks every peer's into out + peer * bytes. In place means in is
// out + rank * bytes, which needs no copy.
__device__ __forceinline__ bool goep_coll_ag_ll_run(const goep_coll_ctx& c, const char* in, char* out, u64 bytes,
                                                    u32 flag, u64 fp) {
  const u32 me = c.rank, W = c.world;
  const u64 words = (bytes + 7) / 8;
  const u64 base = (u64)goep_ll_half(flag) * c.packet_half;
  const bool ain = ((u64)in & 7) == 0;
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  for (u64 k = tid; k < words; k += n) {
    const u64 v = goep_ll_gather(in, k, 8, bytes, ain);
    for (u32 j = 1; j < W; ++j) {
      goep_coll_put_word(goep_coll_pkt(c, goep_coll_peer(c, j), base, me, words, k), v, flag);
    }
  }
  char* mine = out + (u64)me * bytes;
  if (mine != in) {
    goep_copy(mine, in, bytes, (u32)tid, (u32)n);
  }
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, W - j);
    char* dst = out + (u64)p * bytes;
    const bool adst = ((u64)dst & 7) == 0;
    for (u64 k = tid; k < words; k += n) {
      u64 x;
      if (!goep_coll_get_word(c, goep_coll_pkt(c, me, base, p, words, k), flag, p, GOEP_COLL_STAGE_LL1, fp, x)) {
        return false;
      }
      goep_ll_scatter(dst, k, 8, bytes, adst, x);
    }
  }
  return true;
}

extern "C" __global__ void goep_coll_ag_ll(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 flag = goep_ll_flag_begin(c.flag);
  const u32 fpp = goep_coll_ll_start(c, fp, flag);
  const bool ok = goep_coll_ag_ll_run(c, (const char*)in, (char*)out, bytes, flag, fp);
  goep_coll_ll_finish(c, fp, ok, fpp, flag, flag);
}

// ---------------------------------------------------------------------------
// Reduce-scatter: the input holds W parts of count elements; part p goes to
// rank p (slot [sender]), which reduces its part in rank order. In place
// means out is in + rank * part bytes: the thread that reads input word k
// of this rank's part writes output word k.
template <int DT>
__device__ __forceinline__ bool goep_coll_rs_ll_run(const goep_coll_ctx& c, const char* in, char* out, u64 part,
                                                    u32 flag, u32 op, u64 fp) {
  const u32 me = c.rank, W = c.world;
  const u64 words = (part + 7) / 8;
  const u64 base = (u64)goep_ll_half(flag) * c.packet_half;
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, j);
    const char* src = in + (u64)p * part;
    const bool asrc = ((u64)src & 7) == 0;
    for (u64 k = tid; k < words; k += n) {
      goep_coll_put_word(goep_coll_pkt(c, p, base, me, words, k), goep_ll_gather(src, k, 8, part, asrc), flag);
    }
  }
  const char* own = in + (u64)me * part;
  const bool aown = ((u64)own & 7) == 0, aout = ((u64)out & 7) == 0;
  for (u64 k = tid; k < words; k += n) {
    goep_coll_acc8<DT> acc(op);
    for (u32 q = 0; q < W; ++q) {
      u64 x;
      if (q == me) {
        x = goep_ll_gather(own, k, 8, part, aown);
      } else if (!goep_coll_get_word(c, goep_coll_pkt(c, me, base, q, words, k), flag, q, GOEP_COLL_STAGE_LL1, fp, x)) {
        return false;
      }
      if (q == 0) {
        acc.init(x);
      } else {
        acc.add(x);
      }
    }
    goep_ll_scatter(out, k, 8, part, aout, acc.get());
  }
  return true;
}

extern "C" __global__ void goep_coll_rs_ll(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                           u32 op, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 flag = goep_ll_flag_begin(c.flag);
  const u32 fpp = goep_coll_ll_start(c, fp, flag);
  const u64 part = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_rs_ll_run, c, (const char*)in, (char*)out, part, flag, op, fp);
  goep_coll_ll_finish(c, fp, ok, fpp, flag, flag);
}

// ---------------------------------------------------------------------------
// A call that moves no data (count 0) still takes its place in the call
// sequence: one LL round (it advances the packet flag) of fingerprint
// packets only, so that "count 0 on one rank, data on another" is a
// mismatch on both instead of pairing the next calls wrongly.
extern "C" __global__ void goep_coll_fp_sync(const goep_coll_ctx* ctx, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 flag = goep_ll_flag_begin(c.flag);
  const u32 fpp = goep_coll_ll_start(c, fp, flag);
  goep_coll_ll_finish(c, fp, true, fpp, flag, flag);
}
