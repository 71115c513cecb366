// intranode.cuh: the device ABI and helpers of the v1 intranode (NVLink)
// notify, dispatch and combine kernels (intranode.cu).
//
// Every rank owns one workspace in IPC-shared device memory; kernels get a
// table peers[R] of every rank's workspace base as mapped on this GPU
// (peers[rank] is this rank's own) and byte offsets of the regions inside a
// workspace (the Go type intranode.Layout computes them; every rank uses the
// same layout, so an offset is valid in every peer's workspace).
//
// Control block (GOEP_IN_CTRL_BYTES at the layout's control offset, zeroed
// once when the workspace is created, never by a kernel):
//
//   epoch[kind]          u64, this rank only: launches of each kernel kind
//                        completed so far; the kernel itself advances it, so
//                        CUDA-graph replays need no host update.
//   arrive[kind][src]    u64, written by rank src with red.release.sys.add:
//                        every block of src's launch adds its share of
//                        GOEP_IN_ARRIVAL_UNIT after its writes into this
//                        workspace, so a launch of epoch e is complete here
//                        once the progress part (bits 0..39) of
//                        arrive[kind][src] reaches e * GOEP_IN_ARRIVAL_UNIT
//                        (mod 2^40) for every src; bits 40..63 then hold the
//                        tag of src's call (below).
//   entered[kind][src]   u64, written by rank src (st.release.sys): the epoch
//                        of src's latest launch of that kind in the progress
//                        part, the tag of that call in the tag part. A rank writes
//                        into peer d's receive regions only after d has
//                        entered the same launch, which orders the write after
//                        d's earlier work on its stream (consumers of the
//                        previous recv_x, the previous combine's reads). For
//                        combine it also says "my combine input is ready".
//   cinput[src]          {u64 y_off, u64 w_off}, written by rank src before
//                        its combine entry flag (same thread, so the flag's
//                        release covers it): where src's combine input rows
//                        and weights lie in src's own workspace
//                        (GOEP_IN_NO_OFFSET: no weights).
//   fp[src]              u64, the host kernel twins' fingerprint word
//                        (intranode/twins.go); unused by these kernels.
//   pub[src]             goep_ll16 {fp lo, n, fp hi, n}, written by rank src
//                        only off the fast path: src's call fingerprint
//                        (below) with n, the low 32 bits of its launch
//                        number, as the packet flag. Written by a wait of
//                        src that is behind (into the control block of the
//                        rank it waits on) or that saw a tag differ, and
//                        read only there: a matching call never writes or
//                        reads it.
//
// Call fingerprint (always on; intranode/fingerprint.go decodes it): bits
// 0..15 the launch's sequence number, epoch[notify] + epoch[dispatch] +
// epoch[combine] + 1 at its start (advanced by the kernels themselves, so
// graph replays stay in step), bits 16..63 the call's shape, packed by the
// launcher (kernel kind, FP8, weights, top-k, experts, hidden).
//
// The signals carry it. Its 24-bit tag (goep_in_fp_tag: any difference
// within one field changes it) rides in the top bits of the signal words a
// launch exchanges anyway: an entry flag is e + (tag << 40), and block 0 of
// a launch adds (tag - previous tag) << 40 with its arrival share, so a
// counter whose progress part says "launch e arrived in full" holds that
// launch's tag in its top bits (the steps telescope; the previous tag is
// read from the rank's own counter in its own block at the start, beside
// the epochs). A wait polls the one signal word as before fingerprints;
// once the progress part reaches its target it compares the tag part with
// its own (register arithmetic): a matching call costs no extra load,
// store or fence. A different tag is a mismatched call. A peer that made
// another kind of call at this sequence number signals words this launch
// does not wait on; a wait that is still behind therefore publishes this
// launch's word into that peer's pub[rank] and looks at the peer's
// pub[peer] in its slow path (every GOEP_SPIN_CHECK_EVERY polls), and a
// word of this launch number with another kernel kind is a mismatch too
// (other differences are left to the tag, which the peer's signal of the
// same kind brings). Publication is lazy, as the collectives' LL kernels
// do it: at the first call that differs, the per-kind epochs of all ranks
// were equal before it, so two ranks in different kinds of kernel each
// wait for a signal the other never sends (both behind: both publish and
// both see the other's word), and two ranks in the same kind see each
// other's tag (both publish before they look). Either way the first
// thread to see it fills the watchdog record with stage
// GOEP_IN_STAGE_MISMATCH, peer = that rank, expected = own fingerprint,
// observed = the peer's published word (looked at until the peer published
// this launch's, bounded by the watchdog's timeout; 0 when it never came),
// raises the abort flag, and the kernel leaves before touching data (waits
// come before the writes they guard). No rank moves past a launch before
// it saw every peer's signal of that launch carry its own tag, so a
// mismatch is seen by every rank, never by only some (a signal already
// past the target means the peer passed this launch, having checked this
// rank's signal). A published word is taken only when its flag is this
// launch's number (32 bits), so a word published long ago is never read as
// this launch's (flags repeat after 2^32 launches; a slot never written
// reads as fingerprint 0, which no launch has).
//
// GOEP_NO_FINGERPRINT (common.cuh) compiles all of this out: signals carry
// no tag, waits are goep_wait_ge_u64 again, nothing is published or
// checked, and the failed flag is neither read nor written.
//
// Block shares: block b of a grid of G blocks adds
//   floor((b+1)*U/G) - floor(b*U/G),  U = GOEP_IN_ARRIVAL_UNIT,
// so the shares of one launch sum to exactly U whatever G is: ranks may run
// different grid sizes (T-dependent grids, different configs) and a waiter
// never needs to know a peer's grid.
//
// Every wait is bounded by the goep_watchdog passed in (channel_wait.cuh):
// on a timeout the first thread fills the host-mapped record with
// {op = GOEP_OP_VALUE, id = wait id, peer = rank waited on, stage =
// GOEP_IN_STAGE_*, waited, expected, observed}, raises the abort flag and the
// kernel leaves.
#ifndef GOEP_INTRANODE_CUH
#define GOEP_INTRANODE_CUH

#include "channel_wait.cuh"
#include "common.cuh"
#include "packet_device.cuh"

#define GOEP_IN_MAX_RANKS 8
#define GOEP_IN_MAX_TOPK 32
#define GOEP_IN_MAX_EXPERTS 4096

// Largest block of each kernel (its __launch_bounds__).
#define GOEP_IN_NOTIFY_MAX_THREADS 1024
#define GOEP_IN_DISPATCH_MAX_THREADS 1024
#define GOEP_IN_DISPATCH_WIDE_MAX_THREADS 512
#define GOEP_IN_DISPATCH_TMA_MAX_THREADS 1024
#define GOEP_IN_COMBINE_MAX_THREADS 512
#define GOEP_IN_COPY_MAX_THREADS 512

// Most staging buffers per warp in the TMA dispatch (intranode_tma.cu).
#define GOEP_IN_TMA_MAX_STAGES 4

// 16-byte vectors each lane keeps in flight per dispatch copy round
// (goep_intranode_dispatch; the wide build keeps twice GOEP_IN_WIDE_UNROLL).
#ifndef GOEP_IN_UNROLL
#define GOEP_IN_UNROLL 4
#endif
#ifndef GOEP_IN_WIDE_UNROLL
#define GOEP_IN_WIDE_UNROLL 8
#endif

// Kernel kinds (index of epoch / arrive / entered).
#define GOEP_IN_KIND_NOTIFY 0
#define GOEP_IN_KIND_DISPATCH 1
#define GOEP_IN_KIND_COMBINE 2

// Control block byte offsets. Each kind's arrive and entered arrays have a
// 128-byte line of their own (peers update them over NVLink).
#define GOEP_IN_CTRL_EPOCH 0
#define GOEP_IN_CTRL_FAILED 32  // u64, this rank only: nonzero once a wait of any launch gave up
#define GOEP_IN_CTRL_FP 64      // fp[src], in the epoch line's unused half
#define GOEP_IN_CTRL_ARRIVE 128
#define GOEP_IN_CTRL_ENTERED 512
#define GOEP_IN_CTRL_KIND_STRIDE 128
#define GOEP_IN_CTRL_CINPUT 896
#define GOEP_IN_CTRL_CINPUT_STRIDE 16
#define GOEP_IN_CTRL_PUB 1024  // goep_ll16[src]: pub[src], a line of its own (peers write it off the fast path)
#define GOEP_IN_CTRL_BYTES 1152

// cinput: "this rank passes no combine weights".
#define GOEP_IN_NO_OFFSET (~0ull)

#define GOEP_IN_ARRIVAL_UNIT (1ull << 20)

// Stages named in timeout records.
#define GOEP_IN_STAGE_NOTIFY_BARRIER 1
#define GOEP_IN_STAGE_DISPATCH_ENTRY 2
#define GOEP_IN_STAGE_DISPATCH_ARRIVAL 3
#define GOEP_IN_STAGE_COMBINE_ENTRY 4
#define GOEP_IN_STAGE_COMBINE_ARRIVAL 5  // pull combine: peers finishing their reads of this rank's input
#define GOEP_IN_STAGE_MISMATCH 6         // a peer's call fingerprint differs (not a timeout)

#define GOEP_IN_FP_SEQ_MASK 0xffffull
#define GOEP_IN_FP_KIND_SHIFT 16  // 2 bits: kernel kind + 1 (intranode/fingerprint.go)

// Signal words (entered, arrive): bits 0..39 the progress part, bits 40..63
// the tag of the call (goep_in_fp_tag), see "Call fingerprint" above.
#define GOEP_IN_SIG_SHIFT 40
#define GOEP_IN_SIG_PROGRESS_MASK ((1ull << GOEP_IN_SIG_SHIFT) - 1ull)
#define GOEP_IN_SIG_TAG_MASK ((1ull << (64 - GOEP_IN_SIG_SHIFT)) - 1ull)

static_assert(GOEP_IN_CTRL_ARRIVE + 3 * GOEP_IN_CTRL_KIND_STRIDE <= GOEP_IN_CTRL_ENTERED, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_ENTERED + 3 * GOEP_IN_CTRL_KIND_STRIDE <= GOEP_IN_CTRL_BYTES, "goep: intranode ctrl");
static_assert(GOEP_IN_MAX_RANKS * 8 <= GOEP_IN_CTRL_KIND_STRIDE, "goep: intranode ctrl line");
static_assert(GOEP_IN_CTRL_EPOCH + 3 * 8 <= GOEP_IN_CTRL_FAILED, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_FAILED + 8 <= GOEP_IN_CTRL_FP, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_FP + GOEP_IN_MAX_RANKS * 8 <= GOEP_IN_CTRL_ARRIVE, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_ENTERED + 3 * GOEP_IN_CTRL_KIND_STRIDE <= GOEP_IN_CTRL_CINPUT, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_CINPUT + GOEP_IN_MAX_RANKS * GOEP_IN_CTRL_CINPUT_STRIDE <= GOEP_IN_CTRL_PUB,
              "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_PUB + GOEP_IN_MAX_RANKS * 16 <= GOEP_IN_CTRL_BYTES, "goep: intranode ctrl");

__device__ __forceinline__ u64* goep_in_ctrl(u64 base, u64 off_ctrl) { return (u64*)(base + off_ctrl); }
__device__ __forceinline__ u64* goep_in_epoch(u64* ctrl, int kind) {
  return (u64*)((char*)ctrl + GOEP_IN_CTRL_EPOCH) + kind;
}
__device__ __forceinline__ u64* goep_in_arrive(u64* ctrl, int kind, int src) {
  return (u64*)((char*)ctrl + GOEP_IN_CTRL_ARRIVE + kind * GOEP_IN_CTRL_KIND_STRIDE) + src;
}
__device__ __forceinline__ u64* goep_in_entered(u64* ctrl, int kind, int src) {
  return (u64*)((char*)ctrl + GOEP_IN_CTRL_ENTERED + kind * GOEP_IN_CTRL_KIND_STRIDE) + src;
}
// cinput[src]: {y_off, w_off}.
__device__ __forceinline__ u64* goep_in_cinput(u64* ctrl, int src) {
  return (u64*)((char*)ctrl + GOEP_IN_CTRL_CINPUT + src * GOEP_IN_CTRL_CINPUT_STRIDE);
}

// pub[src]: src's published fingerprint.
__device__ __forceinline__ goep_ll16* goep_in_pub(u64* ctrl, int src) {
  return (goep_ll16*)((char*)ctrl + GOEP_IN_CTRL_PUB) + src;
}

// Thread 0 of each block, at the start of a launch of kind: s_epoch, and
// with fingerprints s_fp and s_step (goep_in_begin). Without them the
// start is the one load of the epoch it was before fingerprints.
#if GOEP_NO_FINGERPRINT
#define GOEP_IN_BEGIN(ctrl, kind, rank, shape, s_epoch, s_fp, s_step) \
  ((s_epoch) = goep_in_ld_volatile_u64(goep_in_epoch((ctrl), (kind))) + 1ull)
// A launch's fingerprint and arrival step as the kernels read them back
// from shared memory: constants without fingerprints (no load).
#define GOEP_IN_FPVAL(x) 1ull
#define GOEP_IN_STEPVAL(x) 0ull
#else
#define GOEP_IN_BEGIN(ctrl, kind, rank, shape, s_epoch, s_fp, s_step) \
  ((s_fp) = goep_in_begin((ctrl), (kind), (rank), (shape), &(s_epoch), &(s_step)))
#define GOEP_IN_FPVAL(x) (x)
#define GOEP_IN_STEPVAL(x) (x)
#endif

// The 24-bit tag of a fingerprint that signal words carry: the word folded
// by XOR of its 24-bit thirds. Each field of the fingerprint lands on
// distinct tag bits (sequence 0..15, kind 16..17, FP8 18, weights 19, top-k
// 20..23 and 0..1, experts 2..14, hidden 15..23 and 0..14), so any
// difference confined to one field changes the tag; the fold is linear, so
// only differences in several fields that cancel exactly go unseen.
__device__ __forceinline__ u64 goep_in_fp_tag(u64 fp) {
  return (fp ^ (fp >> 24) ^ (fp >> 48)) & GOEP_IN_SIG_TAG_MASK;
}
// The tag part of a signal word less its target.
__device__ __forceinline__ u64 goep_in_sig_tag(u64 d) { return (d >> GOEP_IN_SIG_SHIFT) & GOEP_IN_SIG_TAG_MASK; }

// The start of a launch of kind (thread 0 of each block, before any epoch
// of this launch advances): its epoch e (epoch[kind] + 1), its fingerprint
// (the launcher's shape word with the sequence number, epoch[notify] +
// epoch[dispatch] + epoch[combine] + 1, in the low bits) and the high-part
// step its block 0 adds to the arrival counters (goep_in_arrive_all). All
// loads are independent words of this rank's own control block, issued
// together: the start costs one load latency, as it did before
// fingerprints. The fingerprint is 0 (never one: the kind bits are nonzero)
// once an earlier launch of this rank gave up a wait: its epochs no longer
// count calls, so every later launch leaves at once without signalling
// (peers then fail too, never proceed).
__device__ __forceinline__ u64 goep_in_begin(u64* ctrl, int kind, int rank, u64 shape, u64* e_out, u64* step_out) {
  const volatile u64* ep = goep_in_epoch(ctrl, 0);
  const u64 failed = *(const volatile u64*)((char*)ctrl + GOEP_IN_CTRL_FAILED);
  const u64 e0 = ep[GOEP_IN_KIND_NOTIFY], e1 = ep[GOEP_IN_KIND_DISPATCH], e2 = ep[GOEP_IN_KIND_COMBINE];
  const u64 own = *(const volatile u64*)goep_in_arrive(ctrl, kind, rank);
  const u64 prev = kind == GOEP_IN_KIND_NOTIFY ? e0 : (kind == GOEP_IN_KIND_DISPATCH ? e1 : e2);
  *e_out = prev + 1ull;
  const u64 fp = (shape & ~GOEP_IN_FP_SEQ_MASK) | ((e0 + e1 + e2 + 1ull) & GOEP_IN_FP_SEQ_MASK);
  // This rank's counter in its own block holds its previous launch's tag
  // (every launch of kind adds to it like to a peer's, and the previous one
  // completed here before this one started).
  const u64 prev_tag = goep_in_sig_tag(own - prev * GOEP_IN_ARRIVAL_UNIT);
  *step_out = ((goep_in_fp_tag(fp) - prev_tag) & GOEP_IN_SIG_TAG_MASK) << GOEP_IN_SIG_SHIFT;
  return failed != 0 ? 0 : fp;
}

// The running launch's number, the flag of the words it publishes: the low
// 32 bits of epoch[notify] + epoch[dispatch] + epoch[combine] + 1, read
// from this rank's own control block (off the fast path only). Any wait of
// a launch reads the values of its start: a launch advances its epoch
// after its last wait (block 0, once every block of every rank, this
// rank's included, arrived).
__device__ __forceinline__ u32 goep_in_launch_no(u64* ctrl) {
  const volatile u64* ep = goep_in_epoch(ctrl, 0);
  return (u32)(ep[GOEP_IN_KIND_NOTIFY] + ep[GOEP_IN_KIND_DISPATCH] + ep[GOEP_IN_KIND_COMBINE] + 1ull);
}

// Who a wait is, in one word for the calls off the fast path (every field
// below 256): the peer waited on, this rank, the number of ranks and the
// stage named in records.
__device__ __forceinline__ u32 goep_in_who(u32 peer, u32 rank, u32 num_ranks, u32 stage) {
  return peer | (rank << 8) | (num_ranks << 16) | (stage << 24);
}
__device__ __forceinline__ u32 goep_in_who_peer(u32 who) { return who & 0xffu; }
__device__ __forceinline__ u32 goep_in_who_rank(u32 who) { return (who >> 8) & 0xffu; }
__device__ __forceinline__ u32 goep_in_who_ranks(u32 who) { return (who >> 16) & 0xffu; }
__device__ __forceinline__ u32 goep_in_who_stage(u32 who) { return who >> 24; }
static_assert(GOEP_IN_MAX_RANKS < 256, "goep: goep_in_who");

// This launch's fingerprint into every rank's pub[rank] (one 16-byte store
// each, flagged with the launch number; never just before a release of
// the same thread, which would then wait for it). Off the fast path only.
// Every rank, not only the peer waited on: a rank that saw a mismatch
// aborts its other waits, some of which may not have published yet, and
// their peers must still find its word.
__device__ __forceinline__ void goep_in_publish(const u64* peers, u64 off_ctrl, u32 who, u64 fp, u32 no) {
  const u32 rank = goep_in_who_rank(who), n = goep_in_who_ranks(who);
#pragma unroll
  for (u32 d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
    if (d < n) {
      goep_ll16_store(goep_in_pub(goep_in_ctrl(peers[d], off_ctrl), (int)rank), (u32)fp, (u32)(fp >> 32), no);
    }
  }
}

// Peer's word published for launch number no, 0 when it published none
// for it (yet).
__device__ __forceinline__ u64 goep_in_published(u64* ctrl, u32 peer, u32 no) {
  u32 lo, hi, seen;
  if (!goep_ll16_try(goep_in_pub(ctrl, (int)peer), no, lo, hi, seen)) {
    return 0;
  }
  return (u64)lo | ((u64)hi << 32);
}

// How a peer's fingerprint word compares with this launch's: the peer is
// behind (an older launch), ahead (a later one), the same call, or a
// mismatch. Sequence numbers compare as 16-bit signed distances (ranks are
// never 2^15 launches apart: every launch waits on every rank). Also the
// result of goep_in_sig_cmp.
#define GOEP_IN_FP_BEHIND 0
#define GOEP_IN_FP_SAME 1
#define GOEP_IN_FP_AHEAD 2
#define GOEP_IN_FP_MISMATCH 3
__device__ __forceinline__ int goep_in_fp_cmp(u64 mine, u64 theirs) {
  const short d = (short)(unsigned short)((theirs & GOEP_IN_FP_SEQ_MASK) - (mine & GOEP_IN_FP_SEQ_MASK));
  if (d < 0) {
    return GOEP_IN_FP_BEHIND;
  }
  if (d > 0) {
    return GOEP_IN_FP_AHEAD;
  }
  return theirs == mine ? GOEP_IN_FP_SAME : GOEP_IN_FP_MISMATCH;
}

// How a signal word v compares with what this launch waits for: target in
// the progress part (e for an entry flag, e * GOEP_IN_ARRIVAL_UNIT for an
// arrival counter) and tag (goep_in_fp_tag of this launch's fingerprint) in
// the tag part. Behind: the progress part, as a signed 40-bit distance, has
// not reached target (an older launch, or this one partly arrived). Ahead:
// past it (the peer passed this launch, having checked it against this
// rank's signal). Exactly at it: the peer's launch of this epoch arrived in
// full, and its tag says whether it is the same call.
__device__ __forceinline__ int goep_in_sig_cmp(u64 v, u64 target, u64 tag) {
  const u64 d = v - target;
  const u64 lo = d & GOEP_IN_SIG_PROGRESS_MASK;
  if (lo != 0) {
    return (lo >> (GOEP_IN_SIG_SHIFT - 1)) != 0 ? GOEP_IN_FP_BEHIND : GOEP_IN_FP_AHEAD;
  }
  return goep_in_sig_tag(d) == tag ? GOEP_IN_FP_SAME : GOEP_IN_FP_MISMATCH;
}

// Records a mismatch with peer (first thread of the watchdog wins) and
// aborts the launch's other waits.
__device__ __forceinline__ void goep_in_mismatch(goep_watchdog* wd, u32 wait_id, u32 peer, u64 mine, u64 theirs) {
  goep_watchdog_expire(wd, GOEP_OP_VALUE, wait_id, peer, GOEP_IN_STAGE_MISMATCH, 0, mine, theirs);
}

// The end of a wait that failed (off the fast path, not inlined). A
// signal whose tag differs (sig_mismatch) is a mismatch for certain: this
// launch's word goes out (the peer saw this rank's tag differ too and
// looks for it), and the record names the fields from the peer's word,
// looked at until the peer published this launch's (bounded by the
// watchdog's timeout; past it, the record holds 0 for the peer's). Either
// way this rank's control block is marked failed, so its later launches
// leave at once.
__device__ __noinline__ void goep_in_wait_failed(const u64* peers, u64 off_ctrl, u64 fp, bool sig_mismatch,
                                                 goep_watchdog* wd, u32 wait_id, u32 who) {
  u64* const ctrl = goep_in_ctrl(peers[goep_in_who_rank(who)], off_ctrl);
  if (sig_mismatch) {
    const u32 peer = goep_in_who_peer(who), no = goep_in_launch_no(ctrl);
    goep_in_publish(peers, off_ctrl, who, fp, no);
    u64 f = goep_in_published(ctrl, peer, no);
    const u64 start = goep_globaltimer();
    while (f == 0 && !goep_aborted(wd) && goep_globaltimer() - start < wd->timeout_ns) {
      f = goep_in_published(ctrl, peer, no);
    }
    goep_in_mismatch(wd, wait_id, peer, fp, f);
  }
  *(volatile u64*)((char*)ctrl + GOEP_IN_CTRL_FAILED) = 1;
}

// The slow path of a wait that is behind (every GOEP_SPIN_CHECK_EVERY
// polls): this launch's word out, then a look at the peer's. The peer at
// this launch number in another kind of kernel is a mismatch: its signals
// go to words this launch does not wait on, so no tag would ever show it
// (and it waits for this rank in turn, so it publishes too). Any other
// difference is left to the tag of the signal this wait gets (the peer, in
// the same kind of launch, sends it).
__device__ __noinline__ bool goep_in_fp_peek(const u64* peers, u64 off_ctrl, u64 fp, goep_watchdog* wd, u32 wait_id,
                                             u32 who) {
  u64* const ctrl = goep_in_ctrl(peers[goep_in_who_rank(who)], off_ctrl);
  const u32 peer = goep_in_who_peer(who), no = goep_in_launch_no(ctrl);
  goep_in_publish(peers, off_ctrl, who, fp, no);
  const u64 f = goep_in_published(ctrl, peer, no);
  if (f == 0 || goep_in_fp_cmp(fp, f) != GOEP_IN_FP_MISMATCH || (((f ^ fp) >> GOEP_IN_FP_KIND_SHIFT) & 3ull) == 0) {
    return true;
  }
  goep_in_mismatch(wd, wait_id, peer, fp, f);
  return false;
}

// Waits on a signal word of a peer (entry flag or arrival counter) until
// its progress part reaches target, then checks its tag: the fast path
// polls that one word and ends with the acquire, exactly the loads of a
// wait before fingerprints. Fails on a timeout, or on a mismatch: a tag
// that differs once the peer's launch of this epoch arrived, or (slow
// path) the peer's published word of this launch number with another
// call. peers and off_ctrl address the control blocks; who names the wait
// (goep_in_who).
__device__ __forceinline__ bool goep_in_wait_sig(const u64* p, u64 target, u64 tag, const u64* peers, u64 off_ctrl,
                                                 u64 fp, goep_watchdog* wd, u32 wait_id, u32 who) {
  goep_spin s = goep_spin_start();
  u64 v;
  int c;
  while ((c = goep_in_sig_cmp(v = goep_chan_ld_relaxed_sys_u64(p), target, tag)) == GOEP_IN_FP_BEHIND) {
    if (!goep_spin_ok(s, wd, GOEP_OP_VALUE, wait_id, goep_in_who_peer(who), goep_in_who_stage(who), target, v)) {
      goep_in_wait_failed(peers, off_ctrl, fp, false, wd, wait_id, who);
      return false;
    }
    if ((s.count & (GOEP_SPIN_CHECK_EVERY - 1)) == 0 && !goep_in_fp_peek(peers, off_ctrl, fp, wd, wait_id, who)) {
      goep_in_wait_failed(peers, off_ctrl, fp, false, wd, wait_id, who);
      return false;
    }
  }
  (void)goep_ld_acquire_sys_u64(p);
  if (c == GOEP_IN_FP_MISMATCH) {
    goep_in_wait_failed(peers, off_ctrl, fp, true, wd, wait_id, who);
    return false;
  }
  return true;
}

// This block's share of GOEP_IN_ARRIVAL_UNIT.
__device__ __forceinline__ u64 goep_in_block_share() {
  const u64 g = gridDim.x, b = blockIdx.x;
  return ((b + 1ull) * GOEP_IN_ARRIVAL_UNIT) / g - (b * GOEP_IN_ARRIVAL_UNIT) / g;
}

// ---------------------------------------------------------------------------
// Memory operations.

// Reduction with relaxed semantics at system scope. After a
// fence.acq_rel.sys of the same thread it is a release pattern (PTX memory
// model), so one fence covers the reductions to every peer.
__device__ __forceinline__ void goep_in_red_add_relaxed_sys_u64(u64* p, u64 v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Streaming 16-byte load of data that no one writes during the kernel (the
// caller's local input): non-coherent path, no L1 allocation, 256-byte L2
// prefetch.
__device__ __forceinline__ uint4 goep_in_ld_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16-byte load of a peer's combine input (NVLink), read after the acquire
// of the peer's entry flag: a plain (weak, coherent) load that does not
// allocate in L1, with a 256-byte L2 prefetch hint. Not .nc: the peer wrote
// the rows while this kernel may already have been running.
__device__ __forceinline__ uint4 goep_in_ld_peer_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// 16-byte store that does not allocate in L1 (the target is usually a peer
// GPU's memory over NVLink).
__device__ __forceinline__ void goep_in_st_v4(void* p, uint4 v) {
  asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Plain load of a local word written by an earlier kernel on this stream.
__device__ __forceinline__ u64 goep_in_ld_volatile_u64(const u64* p) { return *(const volatile u64*)p; }

// ---------------------------------------------------------------------------
// Protocol steps shared by the kernels. All are called by every thread of
// the block; lanes 0..R-1 of warp 0 do the remote work, one peer each.

// goep_in_wait_sig, not inlined: the slow path of goep_in_wait_sig_fast.
// The waits of the block-wide helpers below come before or after the
// dispatch's copy loop, whose registers (a 64-register budget at 1024
// threads) the timer, watchdog and fingerprint handling would otherwise
// share. Its arguments are few and cost the call site no load (the tag is
// computed again from fp, the control blocks from the peer table, which
// is a kernel parameter), so that the fast path keeps its registers.
__device__ __noinline__ bool goep_in_wait_sig_call(const u64* p, u64 target, const u64* peers, u64 off_ctrl, u64 fp,
                                                   goep_watchdog* wd, u32 wait_id, u32 who) {
  return goep_in_wait_sig(p, target, goep_in_fp_tag(fp), peers, off_ctrl, fp, wd, wait_id, who);
}

// Polls inline before a wait leaves for its slow path (bounded, so no timer
// is needed here: fewer than the slow path's first timer look).
#define GOEP_IN_FAST_POLLS (GOEP_SPIN_CHECK_EVERY / 2)

// goep_in_wait_sig with its common case inline: a tight loop of at most
// GOEP_IN_FAST_POLLS relaxed loads of the signal word and one register
// comparison each (the progress and tag parts at once: want holds target
// and tag as a matching signal would), then the acquire. Only a signal
// still behind after that, or one whose tag differs, calls the cold
// function, which starts the full wait (timer, fingerprint word, mismatch
// record). A matched call that finds its signal within the fast polls thus
// runs exactly the instructions of a wait before fingerprints: no call, no
// extra load.
__device__ __forceinline__ bool goep_in_wait_sig_fast(const u64* p, u64 target, u64 tag, const u64* peers,
                                                      u64 off_ctrl, u64 fp, goep_watchdog* wd, u32 wait_id, u32 who) {
  const u64 want = target + (tag << GOEP_IN_SIG_SHIFT);
  u64 d = goep_chan_ld_relaxed_sys_u64(p) - want;
#pragma unroll 1
  for (u32 n = 0; n < GOEP_IN_FAST_POLLS && ((d & GOEP_IN_SIG_PROGRESS_MASK) >> (GOEP_IN_SIG_SHIFT - 1)) != 0; ++n) {
    d = goep_chan_ld_relaxed_sys_u64(p) - want;
  }
  // Done when exactly at want (the same call's signal) or ahead in the
  // progress part (goep_in_sig_cmp's AHEAD: the tag part is not compared).
  const u64 lo = d & GOEP_IN_SIG_PROGRESS_MASK;
  if (lo != 0 ? (lo >> (GOEP_IN_SIG_SHIFT - 1)) == 0 : d == 0) {
    (void)goep_ld_acquire_sys_u64(p);
    return true;
  }
  return goep_in_wait_sig_call(p, target, peers, off_ctrl, fp, wd, wait_id, who);
}

// Block 0 announces to every peer that this rank entered epoch e of kind
// with the call whose fingerprint is fp: the entry flag's value is e with
// fp's tag in the tag part (the same single release store as before
// fingerprints, another value; without fingerprints, e).
__device__ __forceinline__ void goep_in_announce(const u64* peers, u64 off_ctrl, int kind, int num_ranks, int rank,
                                                 u64 e, u64 fp) {
  if (blockIdx.x == 0 && (int)threadIdx.x < num_ranks) {
    u64* peer_ctrl = goep_in_ctrl(peers[threadIdx.x], off_ctrl);
#if GOEP_NO_FINGERPRINT
    (void)fp;
    goep_st_release_sys_u64(goep_in_entered(peer_ctrl, kind, rank), e);
#else
    goep_st_release_sys_u64(goep_in_entered(peer_ctrl, kind, rank), e + (goep_in_fp_tag(fp) << GOEP_IN_SIG_SHIFT));
#endif
  }
}

// Thread d < R: waits for the signal word p of peer d to reach target (an
// entry epoch, or an arrival count) with this launch's tag; without
// fingerprints, the plain wait it was before them.
__device__ __forceinline__ bool goep_in_wait_peer(const u64* p, u64 target, const u64* peers, u64 off_ctrl, u64 fp,
                                                  int num_ranks, int rank, goep_watchdog* wd, u32 wait_id,
                                                  u32 stage) {
#if GOEP_NO_FINGERPRINT
  (void)peers, (void)off_ctrl, (void)fp, (void)num_ranks, (void)rank;
  return goep_wait_ge_u64(p, target, wd, wait_id, threadIdx.x, stage);
#else
  return goep_in_wait_sig_fast(p, target, goep_in_fp_tag(fp), peers, off_ctrl, fp, wd, wait_id,
                               goep_in_who(threadIdx.x, rank, num_ranks, stage));
#endif
}

// Waits until every peer announced epoch e of kind, with this launch's tag.
// Returns false (for the whole block) when a wait gave up.
__device__ __forceinline__ bool goep_in_wait_entered(const u64* peers, u64 off_ctrl, u64* ctrl, int kind,
                                                     int num_ranks, int rank, u64 e, u64 fp, goep_watchdog* wd,
                                                     u32 wait_id, u32 stage) {
  bool ok = true;
  if ((int)threadIdx.x < num_ranks) {
    ok = goep_in_wait_peer(goep_in_entered(ctrl, kind, threadIdx.x), e, peers, off_ctrl, fp, num_ranks, rank, wd,
                           wait_id, stage);
  }
  return !goep_block_any_failed(!ok);
}

// After this block's writes into the peers' workspaces (or, in combine, its
// reads of them): barrier, then one thread makes them visible system-wide
// (fence.acq_rel.sys, cumulative over what the block's threads did before
// the barrier) and adds the block's share to every peer's
// arrive[kind][rank] with relaxed reductions: fence + relaxed write is a
// release pattern, so one fence serves every peer instead of one release
// per peer. Block 0 adds step with its share (goep_in_begin): the tag part
// of every counter of this rank then holds this launch's tag once its
// progress part says the launch arrived in full.
__device__ __forceinline__ void goep_in_arrive_all(const u64* peers, u64 off_ctrl, int kind, int num_ranks, int rank,
                                                   u64 step) {
  __syncthreads();
  if (threadIdx.x == 0) {
    goep_fence_acq_rel_sys();
    const u64 share = goep_in_block_share() + (!GOEP_NO_FINGERPRINT && blockIdx.x == 0 ? step : 0ull);
    for (int d = 0; d < num_ranks; ++d) {
      goep_in_red_add_relaxed_sys_u64(goep_in_arrive(goep_in_ctrl(peers[d], off_ctrl), kind, rank), share);
    }
  }
}

// Waits until every source's launch of epoch e has fully arrived here, with
// this launch's tag. Returns false (for the whole block) when a wait gave
// up.
__device__ __forceinline__ bool goep_in_wait_arrived(const u64* peers, u64 off_ctrl, u64* ctrl, int kind,
                                                     int num_ranks, int rank, u64 e, u64 fp, goep_watchdog* wd,
                                                     u32 wait_id, u32 stage) {
  bool ok = true;
  if ((int)threadIdx.x < num_ranks) {
    ok = goep_in_wait_peer(goep_in_arrive(ctrl, kind, threadIdx.x), e * GOEP_IN_ARRIVAL_UNIT, peers, off_ctrl, fp,
                           num_ranks, rank, wd, wait_id, stage);
  }
  return !goep_block_any_failed(!ok);
}

// Builds, in registers, the list of destinations of one token: bit d of mask
// set when pos (lane d's value) >= 0. Outputs, for i < popc(mask), the rank
// dst[i] (ascending) and the value val[i] of lane dst[i]. Every lane of the
// warp must call it.
__device__ __forceinline__ int goep_in_gather_dests(int pos_lane, int val_lane, u32 rank_mask, int* dst, int* val) {
  const u32 mask = __ballot_sync(0xffffffffu, pos_lane >= 0) & rank_mask;
  u32 m = mask;
#pragma unroll
  for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
    const int d = m ? __ffs(m) - 1 : 0;
    m &= m ? m - 1u : 0u;
    dst[i] = d;
    val[i] = __shfl_sync(0xffffffffu, val_lane, d);
  }
  return __popc(mask);
}

// ---------------------------------------------------------------------------
// Dispatch pieces shared by goep_intranode_dispatch (intranode.cu) and
// goep_intranode_dispatch_tma (intranode_tma.cu).
//
// Work split: block b takes tokens [T*b/G, T*(b+1)/G) (contiguous tokens, so
// a block's rows land contiguously at every destination) and cuts each of
// its rows into num_slices slices of 16-byte chunks; unit u of the block is
// slice u % S of token t_lo + u / S, and warp w takes units w, w + nwarps,
// ... With S = 1 (many tokens) a warp moves whole rows; with few tokens the
// launcher raises S so that every warp of every SM has work.

// Chunk range [lo, hi) of one slice of a row of nchunks 16-byte chunks.
__device__ __forceinline__ void goep_in_slice_range(int nchunks, int slice, int num_slices, int* lo, int* hi) {
  *lo = (int)((i64)nchunks * slice / num_slices);
  *hi = (int)((i64)nchunks * (slice + 1) / num_slices);
}

// Announces epoch e of dispatch and, unless skip_entry (a dispatch that
// directly follows notify on the same stream: notify's barrier already
// proved that every rank finished the work before it), waits until every
// rank entered it. False (whole block) when the wait gave up.
// The entry flag carries the call's tag. A skipped entry leaves the check
// to notify (whose fingerprint carries this dispatch's layout) and to the
// arrival wait.
__device__ __forceinline__ bool goep_in_dispatch_enter(const u64* peers, u64 off_ctrl, u64* ctrl, int num_ranks,
                                                       int rank, u64 e, u64 fp, int skip_entry, goep_watchdog* wd,
                                                       u32 wait_id) {
  goep_in_announce(peers, off_ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank, e, fp);
  if (skip_entry) {
    return true;
  }
  return goep_in_wait_entered(peers, off_ctrl, ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank, e, fp, wd, wait_id,
                              GOEP_IN_STAGE_DISPATCH_ENTRY);
}

// After the block's rows: arrival; block 0 waits for every source and
// advances the epoch (the kernel ends once this rank's receive region is
// complete).
__device__ __forceinline__ void goep_in_dispatch_finish(const u64* peers, u64 off_ctrl, u64* ctrl, int num_ranks,
                                                        int rank, u64 e, u64 fp, u64 step, goep_watchdog* wd,
                                                        u32 wait_id) {
  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank, step);
  if (blockIdx.x == 0) {
    if (!goep_in_wait_arrived(peers, off_ctrl, ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank, e, fp, wd, wait_id,
                              GOEP_IN_STAGE_DISPATCH_ARRIVAL)) {
      return;
    }
    if (threadIdx.x == 0) {
      *goep_in_epoch(ctrl, GOEP_IN_KIND_DISPATCH) = e;
    }
  }
}

// Per-row metadata of token t to its nd destinations (warp-collective):
// local expert ids and weights (lanes < k), the source token (lane 0), the
// FP8 scales (lanes strided), read at element strides {scale_stride_t,
// scale_stride_c} (row-major {num_scales, 1}, column-major {1, T}, ...).
__device__ __forceinline__ void goep_in_dispatch_meta(const u64* s_peers, u64 off_recv_scales, u64 off_recv_src,
                                                      u64 off_recv_topk, u64 off_recv_weights, const float* scales,
                                                      const i64* topk_idx, const float* topk_weights, i64 t, int k,
                                                      int local_experts, int num_scales, i64 scale_stride_t,
                                                      i64 scale_stride_c, int nd, const int* dst, const int* row,
                                                      int lane) {
  i64 eid = -1;
  float w = 0.0f;
  if (lane < k) {
    eid = topk_idx[t * k + lane];
    if (topk_weights != nullptr) {
      w = topk_weights[t * k + lane];
    }
  }
#pragma unroll
  for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
    if (i < nd) {
      const u64 base = s_peers[dst[i]];
      const i64 r = row[i];
      if (lane < k) {
        const i64 lo = (i64)dst[i] * local_experts;
        const bool mine = eid >= lo && eid < lo + local_experts;
        ((i64*)(base + off_recv_topk))[r * k + lane] = mine ? eid - lo : (i64)-1;
        if (topk_weights != nullptr) {
          ((float*)(base + off_recv_weights))[r * k + lane] = mine ? w : 0.0f;
        }
      }
      if (lane == 0) {
        ((i32*)(base + off_recv_src))[r] = (i32)t;
      }
    }
  }
  for (int c = lane; c < num_scales; c += 32) {
    const float v = scales[t * scale_stride_t + (i64)c * scale_stride_c];  // strided scales, read in place
#pragma unroll
    for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
      if (i < nd) {
        ((float*)(s_peers[dst[i]] + off_recv_scales))[(i64)row[i] * num_scales + c] = v;
      }
    }
  }
}

// Loads this lane's U 16-byte chunks c0, c0 + 32, ... (those below c_hi)
// of a local row.
template <int U>
__device__ __forceinline__ void goep_in_load_round(uint4 (&v)[U], const u8* src, int c0, int c_hi) {
#pragma unroll
  for (int q = 0; q < U; ++q) {
    const int c = c0 + 32 * q;
    if (c < c_hi) {
      v[q] = goep_in_ld_nc_v4(src + (u64)c * 16);
    }
  }
}

// Stores them to each of the nd destination rows in drow (shared memory).
template <int U>
__device__ __forceinline__ void goep_in_store_round(const uint4 (&v)[U], const u64* drow, int nd, int c0, int c_hi) {
  for (int i = 0; i < nd; ++i) {
    u8* const d = (u8*)drow[i];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int c = c0 + 32 * q;
      if (c < c_hi) {
        goep_in_st_v4(d + (u64)c * 16, v[q]);
      }
    }
  }
}

// The rows of one dispatch block with plain loads and stores: units of
// (token, slice) over the block's warps; per unit the warp writes the
// destination rows (compacted, ascending rank) to my_drow, the metadata
// (slice 0 only), then copies the slice: U vectors per lane per round, and
// with kPrefetch the next round's loads issued before this round's stores
// (2U vectors in flight per lane). Token and unit counts fit in int32 (the
// launcher checks T * S).
template <int U, bool kPrefetch>
__device__ __forceinline__ void goep_in_dispatch_rows(const u64* s_peers, const i32* s_base, u64* my_drow,
                                                      u64 off_recv_x, u64 off_recv_scales, u64 off_recv_src,
                                                      u64 off_recv_topk, u64 off_recv_weights, const u8* x,
                                                      const float* scales, const i64* topk_idx,
                                                      const float* topk_weights, const i32* send_pos,
                                                      int num_tokens, int k, int num_ranks, int local_experts,
                                                      int row_bytes, int num_scales, i64 scale_stride_t,
                                                      i64 scale_stride_c, int num_slices) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const u32 rank_mask = (1u << num_ranks) - 1u;
  const int nchunks = row_bytes >> 4;
  const int t_lo = (int)((i64)num_tokens * blockIdx.x / gridDim.x);
  const int t_hi = (int)((i64)num_tokens * (blockIdx.x + 1) / gridDim.x);
  const int nunits = (t_hi - t_lo) * num_slices;
  for (int u = warp; u < nunits; u += nwarps) {
    const int q_t = u / num_slices;
    const i64 t = t_lo + q_t;
    const int slice = u - q_t * num_slices;
    int pos = -1, row_here = 0;
    if (lane < num_ranks) {
      pos = send_pos[t * num_ranks + lane];
      row_here = s_base[lane] + pos;
    }
    const u32 mask = __ballot_sync(0xffffffffu, pos >= 0) & rank_mask;
    const int nd = __popc(mask);
    if (nd == 0) {
      continue;
    }
    __syncwarp();  // the previous unit's readers of my_drow are done
    if (pos >= 0 && lane < num_ranks) {
      my_drow[__popc(mask & ((1u << lane) - 1u))] = s_peers[lane] + off_recv_x + (u64)row_here * (u64)row_bytes;
    }
    if (slice == 0) {
      int dst[GOEP_IN_MAX_RANKS], row[GOEP_IN_MAX_RANKS];
      goep_in_gather_dests(pos, row_here, rank_mask, dst, row);
      goep_in_dispatch_meta(s_peers, off_recv_scales, off_recv_src, off_recv_topk, off_recv_weights, scales,
                            topk_idx, topk_weights, t, k, local_experts, num_scales, scale_stride_t,
                            scale_stride_c, nd, dst, row, lane);
    }
    __syncwarp();

    int c_lo, c_hi;
    goep_in_slice_range(nchunks, slice, num_slices, &c_lo, &c_hi);
    const u8* src = x + t * row_bytes;
    if (!kPrefetch) {
      for (int c0 = c_lo + lane; c0 < c_hi; c0 += 32 * U) {
        uint4 v[U];
        goep_in_load_round<U>(v, src, c0, c_hi);
        goep_in_store_round<U>(v, my_drow, nd, c0, c_hi);
      }
    } else {
      uint4 a[U], b[U];
      int c0 = c_lo + lane;
      goep_in_load_round<U>(a, src, c0, c_hi);
      for (; c0 < c_hi; c0 += 64 * U) {
        const int c1 = c0 + 32 * U, c2 = c1 + 32 * U;
        if (c1 < c_hi) {
          goep_in_load_round<U>(b, src, c1, c_hi);
        }
        goep_in_store_round<U>(a, my_drow, nd, c0, c_hi);
        if (c2 < c_hi) {
          goep_in_load_round<U>(a, src, c2, c_hi);
        }
        if (c1 < c_hi) {
          goep_in_store_round<U>(b, my_drow, nd, c1, c_hi);
        }
      }
    }
  }
}

// The whole plain dispatch kernel body (shared memory, entry, rows,
// completion), for the kernels that differ only in UNROLL, PREFETCH and
// their launch bounds MAXT. Expects the dispatch parameter names.
#define GOEP_IN_DISPATCH_KERNEL_BODY(UNROLL, PREFETCH, MAXT)                                                       \
  __shared__ u64 s_epoch;                                                                                         \
  __shared__ u64 s_fp;                                                                                            \
  __shared__ u64 s_step;                                                                                          \
  __shared__ u64 s_peers[GOEP_IN_MAX_RANKS];                                                                      \
  __shared__ i32 s_base[GOEP_IN_MAX_RANKS];                                                                       \
  __shared__ u64 s_drow[(MAXT) / 32][GOEP_IN_MAX_RANKS];                                                          \
  const int tid = threadIdx.x;                                                                                    \
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);                                                          \
  if (tid == 0) {                                                                                                 \
    GOEP_IN_BEGIN(ctrl, GOEP_IN_KIND_DISPATCH, rank, fp_shape, s_epoch, s_fp, s_step);                           \
  }                                                                                                               \
  if (tid < num_ranks) {                                                                                          \
    s_peers[tid] = peers[tid];                                                                                    \
    s_base[tid] = recv_base[tid];                                                                                 \
  }                                                                                                               \
  __syncthreads();                                                                                                \
  const u64 e = s_epoch;                                                                               \
  if (GOEP_IN_FPVAL(s_fp) == 0) { /* an earlier launch of this rank failed */                          \
    return;                                                                                            \
  }                                                                                                    \
  if (!goep_in_dispatch_enter(peers, off_ctrl, ctrl, num_ranks, rank, e, GOEP_IN_FPVAL(s_fp), skip_entry, wd,       \
                              wait_id)) {                                                                         \
    return;                                                                                                       \
  }                                                                                                               \
  goep_in_dispatch_rows<UNROLL, PREFETCH>(s_peers, s_base, s_drow[tid >> 5], off_recv_x, off_recv_scales,        \
                                          off_recv_src, off_recv_topk, off_recv_weights, x, scales, topk_idx,     \
                                          topk_weights, send_pos, num_tokens, k, num_ranks, local_experts,        \
                                          row_bytes, num_scales, scale_token_stride, scale_hidden_stride,        \
                                          num_slices);                                                            \
  goep_in_dispatch_finish(peers, off_ctrl, ctrl, num_ranks, rank, e, GOEP_IN_FPVAL(*(volatile u64*)&s_fp),    \
                          GOEP_IN_STEPVAL(*(volatile u64*)&s_step), wd, wait_id);

#endif  // GOEP_INTRANODE_CUH
