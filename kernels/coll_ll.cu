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
// Call fingerprints (coll_common.cuh): every packet's flags carry the
// call's tag (goep_coll_llf), so a matched call sends and reads exactly the
// packets it did before fingerprints, with the same load and compares;
// only a wait that is behind publishes and looks at the peers' words.
// Every launch reads at least one packet from every peer (a count-0 call
// and ll2's empty pieces send one packet a round each for that), so no rank
// finishes a launch that any peer made differently. Packets go only into
// the peers' packet buffers at offsets the launcher checked against them,
// so a mismatched peer can make the data wrong but never write out of
// bounds; the check makes the call an error on every rank.
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

// The end of an LL launch: every block arrives once for both the packet
// flag and the launch counter: the last one publishes flag and advances the
// counter (goep_ll_flag_end's protocol) after every thread of the launch is
// done with them.
__device__ __forceinline__ void goep_coll_ll_finish(const goep_coll_ctx& c, u32 flag) {
#if GOEP_NO_FINGERPRINT
  goep_ll_flag_end(c.flag, flag);  // no launch counter: the flag's protocol alone
  return;
#endif
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
  const goep_coll_llf tf = goep_coll_llf_make(flag, goep_coll_ll_tag(fp));
  const bool ain = ((u64)in & 7) == 0, aout = ((u64)out & 7) == 0;
  const u64 n = goep_coll_gthreads();
  for (u64 k = goep_coll_gtid(); k < words; k += n) {
    const u64 v = goep_ll_gather(in, k, 8, bytes, ain);
    for (u32 j = 1; j < W; ++j) {
      goep_coll_ll_store(goep_coll_pkt(c, goep_coll_peer(c, j), base, me, words, k), v, tf);
    }
    goep_coll_acc8<DT> acc(op);
    for (u32 q = 0; q < W; ++q) {
      u64 x = v;
      if (q != me && !goep_coll_get_word(c, goep_coll_pkt(c, me, base, q, words, k), tf, q, GOEP_COLL_STAGE_LL1, fp, x)) {
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
  const u32 flag = goep_coll_ll_flag_begin(c.flag);
  const u64 bytes = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_ar_ll1_run, c, (const char*)in, (char*)out, bytes, flag, op, fp);
  (void)ok;  // a wait that gave up marked the rank failed; the launch ends alike
  goep_coll_ll_finish(c, flag);
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
  const u32 tag = goep_coll_ll_tag(fp);
  const goep_coll_llf t1 = goep_coll_llf_make(f1, tag), t2 = goep_coll_llf_make(f2, tag);
  const bool ain = ((u64)in & 7) == 0, aout = ((u64)out & 7) == 0;
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  // Two ranks whose pieces are both empty (few words, W - 2 or more empty
  // pieces) would exchange no packet at all, and one of them could finish
  // a call the other made differently: each sends the other one presence
  // packet in each round, in the owner's slot [sender] at 0, where no piece
  // data goes (the owner's piece is empty), the round-2 one only after
  // reading the peer's round-1 one. Both decide alike from the same shape;
  // a rank of another shape never accepts them (their tag). One packet a
  // pair (round 1 only, read last) broke the halves' bound: a launch takes
  // two flags, so a rank's next launch wrote its first round into the same
  // half and slot, and could overwrite the packet before the peer read it
  // (matched 1-word calls on 3 ranks stalled within a few hundred calls;
  // TestEmulatedTinyLL2BackToBack). An exchange both ways in each half
  // keeps each rank within one round of the other, as the data pairs are.
  // (None without fingerprints: nothing to check.)
  const u64 len_me = (u64)me * P < words ? min(P, words - (u64)me * P) : 0;
  const bool presence = !GOEP_NO_FINGERPRINT && len_me == 0;
  if (presence) {
    for (u64 q = tid; q < W; q += n) {
      if (q != me && (u64)q * P >= words) {
        goep_coll_ll_store(goep_coll_pkt(c, (u32)q, b1, me, P, 0), fp, t1);
      }
    }
  }
  // Round 1: the other pieces to their owners.
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, j);
    const u64 lo = (u64)p * P, len = lo < words ? min(P, words - lo) : 0;
    for (u64 kk = tid; kk < len; kk += n) {
      goep_coll_ll_store(goep_coll_pkt(c, p, b1, me, P, kk), goep_ll_gather(in, lo + kk, 8, bytes, ain), t1);
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
        } else if (!goep_coll_get_word(c, goep_coll_pkt(c, me, b1, q, P, kk), t1, q, GOEP_COLL_STAGE_LL1, fp, x)) {
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
        goep_coll_ll_store(goep_coll_pkt(c, goep_coll_peer(c, j), b2, me, P, kk), r, t2);
      }
    }
  }
  // Round 2: every other piece from its owner.
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, W - j);  // the reverse rotation: owners that finish first come first
    const u64 lo = (u64)p * P, len = lo < words ? min(P, words - lo) : 0;
    for (u64 kk = tid; kk < len; kk += n) {
      u64 x;
      if (!goep_coll_get_word(c, goep_coll_pkt(c, me, b2, p, P, kk), t2, p, GOEP_COLL_STAGE_LL2, fp, x)) {
        return false;
      }
      goep_ll_scatter(out, lo + kk, 8, bytes, aout, x);
    }
  }
  // The presence packets of the peers whose pieces are empty, as this one's:
  // round 1's, then this rank's round-2 one to that peer, then the peer's.
  if (presence) {
    for (u64 q = tid; q < W; q += n) {
      if (q == me || (u64)q * P < words) {
        continue;
      }
      u64 x;
      if (!goep_coll_get_word(c, goep_coll_pkt(c, me, b1, (u32)q, P, 0), t1, (u32)q, GOEP_COLL_STAGE_LL1, fp, x)) {
        return false;
      }
      goep_coll_ll_store(goep_coll_pkt(c, (u32)q, b2, me, P, 0), fp, t2);
    }
    for (u64 q = tid; q < W; q += n) {
      u64 x;
      if (q != me && (u64)q * P >= words &&
          !goep_coll_get_word(c, goep_coll_pkt(c, me, b2, (u32)q, P, 0), t2, (u32)q, GOEP_COLL_STAGE_LL2, fp, x)) {
        return false;
      }
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
  const u32 f1 = goep_coll_ll_flag_begin(c.flag);
  const u32 f2 = goep_coll_ll_flag_next(f1);
  const u64 bytes = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_ar_ll2_run, c, (const char*)in, (char*)out, bytes, f1, f2, op, fp);
  (void)ok;
  goep_coll_ll_finish(c, f2);
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
  const goep_coll_llf tf = goep_coll_llf_make(flag, goep_coll_ll_tag(fp));
  const bool ain = ((u64)in & 7) == 0;
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  for (u64 k = tid; k < words; k += n) {
    const u64 v = goep_ll_gather(in, k, 8, bytes, ain);
    for (u32 j = 1; j < W; ++j) {
      goep_coll_ll_store(goep_coll_pkt(c, goep_coll_peer(c, j), base, me, words, k), v, tf);
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
      if (!goep_coll_get_word(c, goep_coll_pkt(c, me, base, p, words, k), tf, p, GOEP_COLL_STAGE_LL1, fp, x)) {
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
  const u32 flag = goep_coll_ll_flag_begin(c.flag);
  const bool ok = goep_coll_ag_ll_run(c, (const char*)in, (char*)out, bytes, flag, fp);
  (void)ok;  // a wait that gave up marked the rank failed; the launch ends alike
  goep_coll_ll_finish(c, flag);
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
  const goep_coll_llf tf = goep_coll_llf_make(flag, goep_coll_ll_tag(fp));
  const u64 tid = goep_coll_gtid(), n = goep_coll_gthreads();
  for (u32 j = 1; j < W; ++j) {
    const u32 p = goep_coll_peer(c, j);
    const char* src = in + (u64)p * part;
    const bool asrc = ((u64)src & 7) == 0;
    for (u64 k = tid; k < words; k += n) {
      goep_coll_ll_store(goep_coll_pkt(c, p, base, me, words, k), goep_ll_gather(src, k, 8, part, asrc), tf);
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
      } else if (!goep_coll_get_word(c, goep_coll_pkt(c, me, base, q, words, k), tf, q, GOEP_COLL_STAGE_LL1, fp, x)) {
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
  const u32 flag = goep_coll_ll_flag_begin(c.flag);
  const u64 part = count * goep_coll_dt_size(dtype);
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_rs_ll_run, c, (const char*)in, (char*)out, part, flag, op, fp);
  (void)ok;  // a wait that gave up marked the rank failed; the launch ends alike
  goep_coll_ll_finish(c, flag);
}

// ---------------------------------------------------------------------------
// A call that moves no data (count 0) still takes its place in the call
// sequence: one LL round (it advances the packet flag) in which each rank
// sends every peer one packet (tagged like data packets, payload the
// fingerprint) into slot [sender] at 0 of the round's half and reads each
// peer's, so that "count 0 on one rank, data on another" is a mismatch on
// both instead of pairing the next calls wrongly. Thread i < W of the grid
// takes peer i.
extern "C" __global__ void goep_coll_fp_sync(const goep_coll_ctx* ctx, u64 shape) {
#if GOEP_NO_FINGERPRINT
  (void)ctx, (void)shape;
  return;  // count 0 moves nothing and exchanges nothing, as before fingerprints
#endif
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  const u32 flag = goep_coll_ll_flag_begin(c.flag);
  const goep_coll_llf tf = goep_coll_llf_make(flag, goep_coll_ll_tag(fp));
  const u64 base = (u64)goep_ll_half(flag) * c.packet_half;
  const u64 q = goep_coll_gtid();
  if (q < c.world && q != c.rank) {
    goep_coll_ll_store(goep_coll_pkt(c, (u32)q, base, c.rank, 1, 0), fp, tf);
    u64 x;
    (void)goep_coll_get_word(c, goep_coll_pkt(c, c.rank, base, (u32)q, 1, 0), tf, (u32)q, GOEP_COLL_STAGE_FP, fp, x);
  }
  goep_coll_ll_finish(c, flag);
}
