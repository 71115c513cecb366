// lowlatency.cu: low-latency (decode) dispatch and combine inside one node.
//
// Semantics: lowlatency.ReferenceDispatch / ReferenceCombine (plain Go);
// Go twins: lowlatency/twins.go; launchers and layout: package lowlatency
// (DESIGN.md there has the protocol and why it is safe).
//
// Every rank owns one workspace (IPC-shared); kernels get peers[R] (every
// rank's workspace as mapped here) and byte offsets, the same in every
// workspace, of the regions of one buffer set. Two sets alternate; each has
// its own epochs, counters and regions, so consecutive calls need no
// cleaning and a call on one set never waits for the other.
//
// Dispatch, send step (rank s): one row per (token, destination rank):
// token t goes to rank d when one of its top-k experts lives there; the row
// (cast to FP8 here when asked) lands in d's staging row (s, t) with the
// token's local expert ids at d and weights, every active d gets the ids of
// every token (all -1 when not sent), then arrival shares. Receive step
// (rank d): block 0 waits for every active source, then every block
// expands the staged rows into the expert-major layout (local expert le's
// rows ordered by source, token, top-k slot: a deterministic block scan per
// expert, no atomics), writes the tables combine needs, and tells the
// sources it is done reading their rows ("freed").
//
// Combine, send step (rank d): for every token (s, t) it received, one row
// partial = bf16(sum_j w_j * y[row of (s, t, j)]) over its local top-k
// entries into owner s's combine staging row (d, t); receive step (owner):
// out[t] = bf16(sum over destinations d ascending of partial_d[t]).
//
// Epochs: a kernel of set b runs as e = epoch[b] + 1; the receive step's
// last block (a done counter) advances epoch[b]. A send of epoch e writes
// into a peer only after that peer finished reading the set's rows of e-1
// (freed >= (e-1) * unit). Every wait is bounded (goep_watchdog); with
// elastic != 0 a peer that does not arrive in time is masked instead.
#include "intranode.cuh"
#include "port_device.cuh"

#define GOEP_LL_MAX_RANKS 32
#define GOEP_LL_MAX_TOPK 32
#define GOEP_LL_MAX_THREADS 512

#define GOEP_LL_SEND 1
#define GOEP_LL_RECV 2

#define GOEP_LL_BF16 0
#define GOEP_LL_FP8 1
#define GOEP_LL_UE8M0 2

// Control block (lowlatency.Layout.Ctrl; Go constants Ctrl*).
#define GOEP_LL_CTRL_DISP_EPOCH 0
#define GOEP_LL_CTRL_COMB_EPOCH 16
#define GOEP_LL_CTRL_DISP_DONE 32
#define GOEP_LL_CTRL_COMB_DONE 40
#define GOEP_LL_CTRL_MASK 48
#define GOEP_LL_CTRL_OWN_T 52
#define GOEP_LL_CTRL_DISP_GATE 64
#define GOEP_LL_CTRL_DISP_EFF 80
#define GOEP_LL_CTRL_COMB_GATE 88
#define GOEP_LL_CTRL_COMB_EFF 104
#define GOEP_LL_CTRL_INVALID_ACC 112
#define GOEP_LL_CTRL_INVALID_OUT 120
#define GOEP_LL_CTRL_DISP_SEND_DONE 128
#define GOEP_LL_CTRL_COMB_SEND_DONE 136
#define GOEP_LL_CTRL_DISP_ARRIVE 256
#define GOEP_LL_CTRL_DISP_FREED 768
#define GOEP_LL_CTRL_COMB_ARRIVE 1280
#define GOEP_LL_CTRL_COMB_FREED 1792
#define GOEP_LL_CTRL_NTOK 2304
#define GOEP_LL_CTRL_SEND_NTOK 2560
#define GOEP_LL_CTRL_TRACE 3072
#define GOEP_LL_CTRL_BYTES 265216

#define GOEP_LL_STAGE_DISP_FREED 1
#define GOEP_LL_STAGE_DISP_ARRIVAL 2
#define GOEP_LL_STAGE_DISP_GATE 3
#define GOEP_LL_STAGE_COMB_FREED 4
#define GOEP_LL_STAGE_COMB_ARRIVAL 5
#define GOEP_LL_STAGE_COMB_GATE 6
#define GOEP_LL_STAGE_PORT_PUSH 7

// Phase trace, for measurement only (lowlatency/trace.go reads it back):
// compiled in with -DGOEP_LL_TRACE=1 (internal/kernelflags, $GOEP_LL_TRACE);
// by default every GOEP_LL_TR* macro below expands to nothing, so the
// default kernels are the code they were. The region sits in the control
// block at GOEP_LL_CTRL_TRACE (zeroed with it, addressed from off_ctrl: no
// kernel parameter): u64 [kernel: dispatch, combine][GOEP_LL_TRACE_BLOCKS]
// [GOEP_LL_TRACE_SLOTS]; blocks at or above GOEP_LL_TRACE_BLOCKS record
// nothing (the launchers never run more blocks than the GPU has SMs). Slot
// 0 is the tag of the call that wrote the record (epoch e: bits 0-47, set:
// 48-51, phases: 52-55, kernel + 1: 56-59, bit 63 set), slot 1 the block's
// work (low 32 bits: send units with rows to move; high: receive rows
// copied (dispatch) or output units summed (combine)), slots 2.. the
// %globaltimer stamps of the events below (0: not reached), each taken by
// thread 0 after the barrier that ends the phase where there is one.
#ifndef GOEP_LL_TRACE
#define GOEP_LL_TRACE 0
#endif
#define GOEP_LL_TRACE_BLOCKS 1024
#define GOEP_LL_TRACE_SLOTS 16
#define GOEP_LL_TRACE_HEAD 2
// Events of both kernels (lowlatency.DispatchEvents, CombineEvents).
#define GOEP_LL_EV_ENTRY 0
#define GOEP_LL_EV_SEND_GATE 1
#define GOEP_LL_EV_SEND_ISSUED 2
#define GOEP_LL_EV_SEND_SIGNALLED 3
#define GOEP_LL_EV_RECV_ENTRY 4
#define GOEP_LL_EV_RECV_GATE 5
// Dispatch only.
#define GOEP_LL_EV_D_TABLES 6
#define GOEP_LL_EV_D_SCAN 7
#define GOEP_LL_EV_D_COPY 8
#define GOEP_LL_EV_D_RECV_FENCED 9
#define GOEP_LL_EV_D_EXIT 10
// Combine only.
#define GOEP_LL_EV_C_REDUCED 6
#define GOEP_LL_EV_C_RECV_FENCED 7
#define GOEP_LL_EV_C_EXIT 8

// The parameters of every dispatch (combine) kernel and of its body, and
// the body's arguments: the general and the specialised kernels share
// them (lowlatency.Workspace picks the kernel).
#define GOEP_LL_DISPATCH_PARAMS                                                                                    \
  const u64* peers, u64 off_ctrl, u64 off_stage_x, u64 off_stage_s, u64 off_stage_ids, u64 off_stage_w,            \
  u64 off_recv_x, u64 off_recv_s, u64 off_recv_src, u64 off_recv_range, u64 off_recv_count, u64 off_tab_pos,       \
  u64 off_tab_w, u64 off_tab_t, u64 off_tab_row, u64 off_own_mask, const u8* x, const void* topk_idx, int ids_i64, \
  const float* topk_weights, int num_tokens, int k, int num_ranks, int rank, int local_experts, int max_tokens,    \
  int hidden, int format, int rank_major, int set, int phases, int elastic, int num_slices, goep_watchdog* wd,     \
  u32 wait_id, const goep_port_channel* ports, u32 node_mask, u64 off_send_x, u64 off_send_s, u64 off_send_ids,    \
  u64 off_send_w
#define GOEP_LL_DISPATCH_ARGS                                                                                        \
  peers, off_ctrl, off_stage_x, off_stage_s, off_stage_ids, off_stage_w, off_recv_x, off_recv_s, off_recv_src,       \
  off_recv_range, off_recv_count, off_tab_pos, off_tab_w, off_tab_t, off_tab_row, off_own_mask, x, topk_idx,         \
  ids_i64, topk_weights, num_tokens, k, num_ranks, rank, local_experts, max_tokens, hidden, format, rank_major, set, \
  phases, elastic, num_slices, wd, wait_id, ports, node_mask, off_send_x, off_send_s, off_send_ids, off_send_w
#define GOEP_LL_COMBINE_PARAMS                                                                                     \
  const u64* peers, u64 off_ctrl, u64 off_tab_pos, u64 off_tab_w, u64 off_tab_t, u64 off_own_mask, u64 off_cstage, \
  const u8* y, const float* y_scales, int y_fp8, u8* out, int num_tokens, int k, int num_ranks, int rank,          \
  int local_experts, int max_tokens, int hidden, int rank_major, int set, int phases, int elastic, int num_slices, \
  goep_watchdog* wd, u32 wait_id, const goep_port_channel* ports, u32 node_mask, u64 off_csend
#define GOEP_LL_COMBINE_ARGS                                                                                         \
  peers, off_ctrl, off_tab_pos, off_tab_w, off_tab_t, off_own_mask, off_cstage, y, y_scales, y_fp8, out, num_tokens, \
  k, num_ranks, rank, local_experts, max_tokens, hidden, rank_major, set, phases, elastic, num_slices, wd, wait_id,  \
  ports, node_mask, off_csend

extern "C" {
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_dispatch(GOEP_LL_DISPATCH_PARAMS);
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_dispatch_bf16(GOEP_LL_DISPATCH_PARAMS);
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_dispatch_fp8(GOEP_LL_DISPATCH_PARAMS);
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_dispatch_ue8m0(GOEP_LL_DISPATCH_PARAMS);
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_combine(GOEP_LL_COMBINE_PARAMS);
__global__ void __launch_bounds__(GOEP_LL_MAX_THREADS) goep_ll_combine_fast(GOEP_LL_COMBINE_PARAMS);
__global__ void goep_ll_set_mask(u32* mask, u32 value, int op);
}

// Float operations rounded one by one: NVRTC would otherwise fuse a*b+c
// into one FMA, and the reference (and the CPU emulation) rounds twice.
#if defined(__CUDACC__)
__device__ __forceinline__ float goep_ll_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float goep_ll_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float goep_ll_div(float a, float b) { return __fdiv_rn(a, b); }
#else
__device__ __forceinline__ float goep_ll_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float goep_ll_add(float a, float b) { return a + b; }
__device__ __forceinline__ float goep_ll_div(float a, float b) { return a / b; }
#endif

__device__ __forceinline__ u8* goep_ll_ctrl(u64 base, u64 off_ctrl) { return (u8*)(base + off_ctrl); }
__device__ __forceinline__ u64* goep_ll_u64(u8* ctrl, int off, int set, int r) {
  return (u64*)(ctrl + off + 8 * GOEP_LL_MAX_RANKS * set + 8 * r);
}
__device__ __forceinline__ u64 goep_ll_u64_off(int off, int set, int r) {
  return (u64)(off + 8 * GOEP_LL_MAX_RANKS * set + 8 * r);
}
__device__ __forceinline__ u32* goep_ll_mask(u8* ctrl) { return (u32*)(ctrl + GOEP_LL_CTRL_MASK); }

#if GOEP_LL_TRACE
// The phase trace (see GOEP_LL_CTRL_TRACE). A launch with the send step
// starts a new record (clears every stamp); a receive-only launch (split
// calls) clears and stamps only the receive events, keeping its send
// launch's, and stamps its start as recv_entry.
__device__ __forceinline__ u64* goep_ll_tr_open(u8* ctrl, int kernel, u64 e, int set, int phases, u64 t0) {
  if (blockIdx.x >= GOEP_LL_TRACE_BLOCKS) {
    return nullptr;
  }
  u64* tr = (u64*)(ctrl + GOEP_LL_CTRL_TRACE) +
            ((u64)kernel * GOEP_LL_TRACE_BLOCKS + blockIdx.x) * GOEP_LL_TRACE_SLOTS;
  if (threadIdx.x == 0) {
    const int first = (phases & GOEP_LL_SEND) ? GOEP_LL_EV_ENTRY : GOEP_LL_EV_RECV_ENTRY;
    for (int i = first; i < GOEP_LL_TRACE_SLOTS - GOEP_LL_TRACE_HEAD; ++i) {
      tr[GOEP_LL_TRACE_HEAD + i] = 0;
    }
    tr[1] = (phases & GOEP_LL_SEND) ? 0 : (tr[1] & 0xffffffffull);
    tr[0] = (e & 0xffffffffffffull) | ((u64)(set & 15) << 48) | ((u64)(phases & 15) << 52) |
            ((u64)(kernel + 1) << 56) | (1ull << 63);
    tr[GOEP_LL_TRACE_HEAD + first] = t0;
  }
  return tr;
}

__device__ __forceinline__ void goep_ll_tr_stamp(u64* tr, int ev) {
  if (tr != nullptr && threadIdx.x == 0) {
    tr[GOEP_LL_TRACE_HEAD + ev] = goep_globaltimer();
  }
}

// The launch's last stamp and the block's work counts (complete: every
// caller passed a barrier after the last count).
__device__ __forceinline__ void goep_ll_tr_close(u64* tr, int ev, const u32* s_trn, int phases) {
  if (tr != nullptr && threadIdx.x == 0) {
    tr[GOEP_LL_TRACE_HEAD + ev] = goep_globaltimer();
    const u64 lo = (phases & GOEP_LL_SEND) ? (u64)s_trn[0] : (tr[1] & 0xffffffffull);
    const u64 hi = (phases & GOEP_LL_RECV) ? (u64)s_trn[1] : (tr[1] >> 32);
    tr[1] = lo | (hi << 32);
  }
}

// First in a kernel (before its first barrier): the entry time and the
// work counters.
#define GOEP_LL_TR_INIT                  \
  __shared__ u32 s_trn[2];               \
  u64 tr_t0 = 0;                         \
  if (threadIdx.x == 0) {                \
    tr_t0 = goep_globaltimer();          \
    s_trn[0] = 0;                        \
    s_trn[1] = 0;                        \
  }
#define GOEP_LL_TR_OPEN(kernel) u64* const tr = goep_ll_tr_open(ctrl, (kernel), e, set, phases, tr_t0)
#define GOEP_LL_TR(ev) goep_ll_tr_stamp(tr, (ev))
#define GOEP_LL_TR_COUNT(i)     \
  if (lane == 0) {              \
    atomicAdd(&s_trn[(i)], 1u); \
  }
#define GOEP_LL_TR_CLOSE(ev) goep_ll_tr_close(tr, (ev), s_trn, phases)
#define GOEP_LL_TR_PARAM , u64 *tr
#define GOEP_LL_TR_ARG , tr
#define GOEP_LL_TR_FINISH_PARAM , u64 *tr, int ev_bar, int ev_fenced
#define GOEP_LL_TR_FINISH_ARG(bar, fenced) , tr, (bar), (fenced)
#else
#define GOEP_LL_TR_INIT
#define GOEP_LL_TR_OPEN(kernel)
#define GOEP_LL_TR(ev)
#define GOEP_LL_TR_COUNT(i)
#define GOEP_LL_TR_CLOSE(ev)
#define GOEP_LL_TR_PARAM
#define GOEP_LL_TR_ARG
#define GOEP_LL_TR_FINISH_PARAM
#define GOEP_LL_TR_FINISH_ARG(bar, fenced)
#endif

// The ranks a launch talks to: every rank not masked, none when this rank
// itself is masked.
__device__ __forceinline__ u32 goep_ll_active(u32 masked, int num_ranks, int rank) {
  const u32 all = (num_ranks >= 32) ? 0xffffffffu : ((1u << num_ranks) - 1u);
  if ((masked >> rank) & 1u) {
    return 0;
  }
  return all & ~masked;
}

// Every rank: counters are signalled to masked ranks too (without data), so
// that they stay in step and a mask can be cleared later.
__device__ __forceinline__ u32 goep_ll_all(int num_ranks) {
  return (num_ranks >= 32) ? 0xffffffffu : ((1u << num_ranks) - 1u);
}

// Waits until *p >= target. 0: reached; 1: gave up on peer, which is now
// masked (elastic: it did not arrive within the watchdog's timeout, or
// another block masked it meanwhile); 2: failed (watchdog record written or
// the watchdog aborted).
__device__ __forceinline__ int goep_ll_wait(const u64* p, u64 target, u32* mask, int peer, int elastic,
                                            goep_watchdog* wd, u32 wait_id, u32 stage) {
  if (!elastic) {
    return goep_wait_ge_u64(p, target, wd, wait_id, (u32)peer, stage) ? 0 : 2;
  }
  u64 start = 0;
  u32 count = 0;
  while (goep_chan_ld_relaxed_sys_u64(p) < target) {
    if (((++count) & (GOEP_SPIN_CHECK_EVERY - 1)) != 0) {
      continue;
    }
    if (goep_aborted(wd)) {
      return 2;
    }
    if ((goep_ld_relaxed_sys_u32(mask) >> peer) & 1u) {
      return 1;
    }
    const u64 now = goep_globaltimer();
    if (start == 0) {
      start = now;
    } else if (now - start >= wd->timeout_ns) {
      atomicOr(mask, 1u << peer);
      return 1;
    }
  }
  (void)goep_ld_acquire_sys_u64(p);
  return 0;
}

// Threads tid < R wait for counter(tid) >= target for every rank in want
// (all threads call it). False when a wait failed (whole block).
__device__ __forceinline__ bool goep_ll_wait_ranks(u8* ctrl, int off, int set, u32 want, u64 target, int elastic,
                                                   goep_watchdog* wd, u32 wait_id, u32 stage) {
  int r = 0;
  const int tid = threadIdx.x;
  if (tid < GOEP_LL_MAX_RANKS && ((want >> tid) & 1u)) {
    r = goep_ll_wait(goep_ll_u64(ctrl, off, set, tid), target, goep_ll_mask(ctrl), tid, elastic, wd, wait_id, stage);
  }
  return !goep_block_any_failed(r == 2);
}

// After the block's writes to (or reads of) peers' memory: barrier, one
// fence, then the block's share of the unit to counter[set][rank] of every
// rank in to.
__device__ __forceinline__ void goep_ll_signal(const u64* s_peers, u64 off_ctrl, int off, int set, int rank,
                                               u32 to GOEP_LL_TR_PARAM) {
  __syncthreads();
  if (threadIdx.x == 0) {
    GOEP_LL_TR(GOEP_LL_EV_SEND_ISSUED);
    goep_fence_acq_rel_sys();
    const u64 share = goep_in_block_share();
    for (int d = 0; d < GOEP_LL_MAX_RANKS; ++d) {
      if ((to >> d) & 1u) {
        goep_in_red_add_relaxed_sys_u64(goep_ll_u64(goep_ll_ctrl(s_peers[d], off_ctrl), off, set, rank), share);
      }
    }
    GOEP_LL_TR(GOEP_LL_EV_SEND_SIGNALLED);
  }
}

// Across nodes. Where a row for destination d goes: d's staging row srow
// (this rank's block there) when d is on this node, else row drow (d's
// block) of this rank's send region, which one put per destination moves
// after the step (goep_ll_port_rows).
__device__ __forceinline__ u8* goep_ll_row(const u64* s_peers, u64 base, u32 node_mask, int d, u64 off_stage,
                                           u64 off_send, u64 srow, u64 drow, u64 row_bytes) {
  if ((node_mask >> d) & 1u) {
    return (u8*)(s_peers[d] + off_stage) + srow * row_bytes;
  }
  return (u8*)(base + off_send) + drow * row_bytes;
}

// Puts rows 0..rows-1 of d's block of a send region into this rank's
// block of d's staging region (same offsets in every workspace; the
// channel's memories are the whole workspaces). Nothing for no rows.
__device__ __forceinline__ bool goep_ll_port_rows(const goep_port_channel& ch, u64 off_stage, u64 off_send, int d,
                                                  int rank, int max_tokens, int rows, u64 row_bytes) {
  if (rows <= 0) {
    return true;
  }
  return goep_pc_put(ch, off_stage + (u64)rank * max_tokens * row_bytes, off_send + (u64)d * max_tokens * row_bytes,
                     (u64)rows * row_bytes, GOEP_LL_STAGE_PORT_PUSH);
}

// True in every thread of the step's last block to get here (a done
// counter per set, reset by that block): every other block fenced its
// writes (system scope: the copy engines read them) before adding, so the
// last one may hand the send regions to the proxy. Every thread calls it.
__device__ __forceinline__ bool goep_ll_last_block(u8* ctrl, int off_done, int set, int* s_last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    u32* done = (u32*)(ctrl + off_done) + set;
    goep_fence_acq_rel_sys();
    const bool last = atomicAdd(done, 1u) == gridDim.x - 1;
    if (last) {
      goep_fence_acq_rel_sys();
      *(volatile u32*)done = 0;
    }
    *s_last = last ? 1 : 0;
  }
  __syncthreads();
  return *s_last != 0;
}

// A send step's start: the ranks this launch talks to (*s_active), once
// they finished reading this set's rows of the previous epoch (freed >=
// (e-1) units; elastic waits may mask some meanwhile, so the set is read
// again after). False (whole block) when a wait failed.
__device__ __forceinline__ bool goep_ll_send_gate(u8* ctrl, int off_freed, int set, int num_ranks, int rank, u64 e,
                                                  int elastic, goep_watchdog* wd, u32 wait_id, u32 stage,
                                                  u32* s_active) {
  // Threads tid < R read the mask themselves (one round trip, no barrier
  // before the waits); the waits' closing barrier publishes *s_active.
  const int tid = threadIdx.x;
  int r = 0;
  if (tid < GOEP_LL_MAX_RANKS) {
    const u32 act = goep_ll_active(goep_ld_relaxed_sys_u32(goep_ll_mask(ctrl)), num_ranks, rank);
    if (tid == 0) {
      *s_active = act;
    }
    if ((act >> tid) & 1u) {
      r = goep_ll_wait(goep_ll_u64(ctrl, off_freed, set, tid), (e - 1) * GOEP_IN_ARRIVAL_UNIT, goep_ll_mask(ctrl), tid,
                       elastic, wd, wait_id, stage);
    }
  }
  if (goep_block_any_failed(r == 2)) {
    return false;
  }
  if (!elastic) {
    return true;  // the mask cannot change during a non-elastic call
  }
  if (threadIdx.x == 0) {
    *s_active = goep_ll_active(goep_ld_relaxed_sys_u32(goep_ll_mask(ctrl)), num_ranks, rank);
  }
  __syncthreads();
  return true;
}

// Eight BF16 values of a 16-byte chunk as floats (exact), and back
// (rounded to nearest even).
__device__ __forceinline__ void goep_ll_bf16x8_to_f32(uint4 v, float f[8]) {
  const u32 wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    f[2 * q] = goep_u32_as_f32(wv[q] << 16);
    f[2 * q + 1] = goep_u32_as_f32(wv[q] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 goep_ll_f32x8_to_bf16(const float f[8]) {
  uint4 o;
  o.x = (u32)goep_f32_to_bf16_bits(f[0]) | ((u32)goep_f32_to_bf16_bits(f[1]) << 16);
  o.y = (u32)goep_f32_to_bf16_bits(f[2]) | ((u32)goep_f32_to_bf16_bits(f[3]) << 16);
  o.z = (u32)goep_f32_to_bf16_bits(f[4]) | ((u32)goep_f32_to_bf16_bits(f[5]) << 16);
  o.w = (u32)goep_f32_to_bf16_bits(f[6]) | ((u32)goep_f32_to_bf16_bits(f[7]) << 16);
  return o;
}

// The receive gate. Without elastic, every block waits for every active
// rank's counter itself (the mask cannot change during a call: only
// SetMask, stream-ordered, writes it), so no block depends on another
// block of its grid being scheduled; block 0 alone publishes eff and, with
// tab_t, the sources' token counts (0 for masked ones) for later kernels.
// With elastic, a wait may mask a peer, so block 0 waits and publishes the
// mask it ended with (eff) behind the gate and the other blocks wait for
// the gate: every block then agrees on eff (this needs the whole grid
// resident, which the spin budget gives). s_ntok (when not null) gets the
// token counts in every block. Returns false (whole block) when a wait
// failed.
__device__ __forceinline__ bool goep_ll_gate(u8* ctrl, int off_counter, int off_gate, int off_eff, int set,
                                             int num_ranks, int rank, u64 e, int elastic, goep_watchdog* wd,
                                             u32 wait_id, u32 stage, u32 gate_stage, u32* s_eff, i32* tab_t,
                                             int* s_ntok) {
  u64* gate = (u64*)(ctrl + off_gate) + set;
  u32* eff = (u32*)(ctrl + off_eff) + set;
  if (!elastic) {
    // Thread s < R reads the mask (it cannot change during a non-elastic
    // call: one read), waits for source s, then reads s's token count
    // itself after its own acquire: one round trip for all the counts
    // instead of thread 0 reading them one after another, and no barrier
    // but the closing one.
    const int tid = threadIdx.x;
    int r = 0;
    if (tid < GOEP_LL_MAX_RANKS) {
      u32 m = goep_ld_relaxed_sys_u32(goep_ll_mask(ctrl));
      if ((m >> rank) & 1u) {
        m = 0xffffffffu;
      }
      const bool want = tid < num_ranks && !((m >> tid) & 1u);
      if (want) {
        r = goep_ll_wait(goep_ll_u64(ctrl, off_counter, set, tid), e * GOEP_IN_ARRIVAL_UNIT, goep_ll_mask(ctrl), tid, 0,
                         wd, wait_id, stage);
      }
      if (s_ntok != nullptr && tid < num_ranks && r == 0) {
        const i32 n = want ? ((volatile i32*)(ctrl + GOEP_LL_CTRL_NTOK + 4 * GOEP_LL_MAX_RANKS * set))[tid] : 0;
        s_ntok[tid] = n;
        if (blockIdx.x == 0 && tab_t != nullptr) {
          tab_t[tid] = n;
        }
      }
      if (tid == 0) {
        *s_eff = m;
        if (blockIdx.x == 0) {
          *(volatile u32*)eff = m;
        }
      }
    }
    return !goep_block_any_failed(r == 2);
  }
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      *s_eff = goep_ll_active(goep_ld_relaxed_sys_u32(goep_ll_mask(ctrl)), num_ranks, rank);  // the ranks to wait for
    }
    __syncthreads();
    if (!goep_ll_wait_ranks(ctrl, off_counter, set, *s_eff, e * GOEP_IN_ARRIVAL_UNIT, elastic, wd, wait_id, stage)) {
      return false;
    }
    if (threadIdx.x == 0) {
      u32 m = goep_ld_relaxed_sys_u32(goep_ll_mask(ctrl));
      if ((m >> rank) & 1u) {
        m = 0xffffffffu;
      }
      if (s_ntok != nullptr) {
        for (int s = 0; s < num_ranks; ++s) {
          const i32 n = ((volatile i32*)(ctrl + GOEP_LL_CTRL_NTOK + 4 * GOEP_LL_MAX_RANKS * set))[s];
          s_ntok[s] = ((m >> s) & 1u) ? 0 : n;
        }
      }
      *s_eff = m;
      if (blockIdx.x == 0) {
        *(volatile u32*)eff = m;
        if (tab_t != nullptr) {
          for (int s = 0; s < num_ranks; ++s) {
            tab_t[s] = s_ntok[s];
          }
        }
        goep_st_release_sys_u64(gate, e);
      }
    }
    __syncthreads();
  } else {
    bool ok = true;
    if (threadIdx.x == 0) {
      ok = goep_wait_ge_u64(gate, e, wd, wait_id, (u32)rank, gate_stage);
    }
    if (goep_block_any_failed(!ok)) {
      return false;
    }
    if (threadIdx.x == 0) {
      *s_eff = *(volatile u32*)eff;
      if (s_ntok != nullptr) {
        for (int s = 0; s < num_ranks; ++s) {
          s_ntok[s] = ((volatile i32*)tab_t)[s];
        }
      }
    }
    __syncthreads();
  }
  return true;
}

// A receive step's end, after its reads of what peers wrote: every block
// adds its share of the unit to the freed counter (off_freed) of this rank
// at every rank in `to` (this node's), and the last block (a done counter)
// resets that counter and advances the set's epoch (every block read the
// epoch at its start); a dispatch's also moves the invalid-id count of its
// send step to InvalidOut. One system-scope fence covers both the freed
// shares and the done count, and the shares go out after the done count:
// a fence after them (the done count's, as it was) waited for those
// remote reductions to complete, one NVLink round trip in every block.
// Across nodes (remote != 0), the last block then adds the unit to the
// freed counter of this rank at every rank of another node, one
// port-channel atomic add each (masked ranks too: counters stay in step).
__device__ __forceinline__ void goep_ll_finish(const u64* s_peers, u8* ctrl, int off_done, int off_epoch, int set,
                                               u64 e, bool invalid, const goep_port_channel* ports, u32 to,
                                               u32 remote, int rank, u64 off_ctrl, int off_freed,
                                               int* s_last GOEP_LL_TR_FINISH_PARAM) {
  __syncthreads();
  if (threadIdx.x == 0) {
    GOEP_LL_TR(ev_bar);
    u32* done = (u32*)(ctrl + off_done) + set;
    *s_last = 0;
    goep_fence_acq_rel_sys();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *s_last = 1;
      goep_fence_acq_rel_gpu();
      *(volatile u32*)done = 0;
      if (invalid) {
        volatile u32* acc = (volatile u32*)(ctrl + GOEP_LL_CTRL_INVALID_ACC) + set;
        ((volatile u32*)(ctrl + GOEP_LL_CTRL_INVALID_OUT))[set] = *acc;
        *acc = 0;
      }
      *(volatile u64*)((u64*)(ctrl + off_epoch) + set) = e;
    }
    GOEP_LL_TR(ev_fenced);
    const u64 share = goep_in_block_share();
    for (int d = 0; d < GOEP_LL_MAX_RANKS; ++d) {
      if ((to >> d) & 1u) {
        goep_in_red_add_relaxed_sys_u64(goep_ll_u64(goep_ll_ctrl(s_peers[d], off_ctrl), off_freed, set, rank), share);
      }
    }
  }
  if (remote == 0) {
    return;
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (*s_last != 0 && d < GOEP_LL_MAX_RANKS && ((remote >> d) & 1u)) {
    (void)goep_pc_atomic_add(ports[d], off_ctrl + goep_ll_u64_off(off_freed, set, rank), GOEP_IN_ARRIVAL_UNIT,
                             GOEP_LL_STAGE_PORT_PUSH);
  }
}

// Exclusive prefix of v over the block; *total gets the sum. Every thread
// calls it; s_warp holds 33 ints.
__device__ __forceinline__ int goep_ll_block_scan(int v, int* total, int* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) {
      incl += n;
    }
  }
  if (lane == 31) {
    s_warp[warp] = incl;
  }
  __syncthreads();
  if (warp == 0) {
    int w = lane < nwarps ? s_warp[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) {
        w += n;
      }
    }
    s_warp[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = warp > 0 ? s_warp[warp - 1] : 0;
  *total = s_warp[nwarps - 1];
  __syncthreads();  // s_warp is free again
  return before + incl - v;
}

// Rounds of 32 16-byte chunks [r_lo, r_hi) of one slice of a row of
// nchunks chunks (slices cut at round boundaries, so an FP8 group of 16
// chunks never spans two slices).
__device__ __forceinline__ void goep_ll_slice_rounds(int nchunks, int slice, int num_slices, int* r_lo, int* r_hi) {
  const int rounds = (nchunks + 31) >> 5;
  *r_lo = (int)((i64)rounds * slice / num_slices);
  *r_hi = (int)((i64)rounds * (slice + 1) / num_slices);
}

// ---------------------------------------------------------------------------
// Dispatch.

// The dispatch kernels' body. FAST: the common case compiled alone
// (goep_ll_dispatch_{bf16,fp8,ue8m0}): one node, expert-major, not
// elastic, format FMT. The general kernel carries every path behind run-
// time flags; its SASS is about twice the specialised one's (NVRTC 11.8:
// 142 KB against 79 KB), and a decode-sized call runs most of its code
// once per launch. Measured (session 10, EP2, H200): the specialised pair
// 2.1-2.5 us faster per BF16 dispatch + combine, at 1 and 128 tokens.
template <int FAST, int FMT>
__device__ __forceinline__ void goep_ll_dispatch_run(GOEP_LL_DISPATCH_PARAMS) {
  __shared__ u64 s_epoch;
  __shared__ int s_last;
  __shared__ u64 s_peers[GOEP_LL_MAX_RANKS];
  __shared__ u32 s_active;
  __shared__ u32 s_eff;
  __shared__ int s_ntok[GOEP_LL_MAX_RANKS];
  __shared__ int s_warp[33];
  __shared__ int s_tokbeg[GOEP_LL_MAX_RANKS + 1];
  __shared__ int s_cnt[GOEP_LL_MAX_RANKS];
  GOEP_LL_TR_INIT
  if (FAST) {
    format = FMT;
    rank_major = 0;
    elastic = 0;
    node_mask = goep_ll_all(num_ranks);
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u8* const ctrl = goep_ll_ctrl(peers[rank], off_ctrl);
  const u64 base = peers[rank];
  if (tid == 0) {
    s_epoch = goep_in_ld_volatile_u64((u64*)(ctrl + GOEP_LL_CTRL_DISP_EPOCH) + set) + 1;
  }
  if (tid < num_ranks) {
    s_peers[tid] = peers[tid];
  }
  __syncthreads();
  const u64 e = s_epoch;
  GOEP_LL_TR_OPEN(0);
  const int quant = format != GOEP_LL_BF16;
  const int ns = hidden / 128;  // scales per row (FP8)
  const u64 row2 = (u64)hidden * 2;  // staging row stride
  const i64 num_experts = (i64)num_ranks * local_experts;
  // Ranks on other nodes: reached through port channels (none inside one
  // node: then nothing below changes the single-node path).
  const u32 remote = goep_ll_all(num_ranks) & ~node_mask;

  if (phases & GOEP_LL_SEND) {
    // The destinations finished reading this set's rows of the previous
    // epoch.
    if (!goep_ll_send_gate(ctrl, GOEP_LL_CTRL_DISP_FREED, set, num_ranks, rank, e, elastic, wd, wait_id,
                           GOEP_LL_STAGE_DISP_FREED, &s_active)) {
      return;
    }
    GOEP_LL_TR(GOEP_LL_EV_SEND_GATE);
    const u32 active = s_active;
    const int nchunks = hidden >> 3;  // 16-byte chunks of the BF16 input row
    const int units = num_tokens * num_slices;
    for (int u = blockIdx.x * nwarps + warp; u < units; u += gridDim.x * nwarps) {
      const int t = u / num_slices, slice = u - t * num_slices;
      int r_lo, r_hi;
      goep_ll_slice_rounds(nchunks, slice, num_slices, &r_lo, &r_hi);
      const u8* src = x + (u64)t * row2;
      // The slice's first row load goes out before the ids' (the row of
      // token t is valid memory whether or not it goes anywhere), and
      // every next round's before this round's stores: a unit's chain was
      // ids, then per round a load then its stores; now the ids' round trip
      // and the first load's overlap, and later loads hide behind stores.
      uint4 vn = make_uint4(0, 0, 0, 0);
      if (r_lo < r_hi && r_lo * 32 + lane < nchunks) {
        vn = goep_in_ld_nc_v4(src + (u64)(r_lo * 32 + lane) * 16);
      }
      i64 id = -1;
      float w = 1.0f;
      if (lane < k) {
        id = ids_i64 ? ((const i64*)topk_idx)[(i64)t * k + lane] : (i64)((const i32*)topk_idx)[(i64)t * k + lane];
        if (topk_weights != nullptr) {
          w = topk_weights[(i64)t * k + lane];
        }
      }
      const bool valid = id >= 0 && id < num_experts;
      const int dst = valid ? (int)(id / local_experts) : -1;
      u32 bits = valid ? (1u << dst) : 0u;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        bits |= __shfl_xor_sync(0xffffffffu, bits, o);
      }
      const u32 tmask = bits & active;
      const u64 srow = (u64)rank * max_tokens + t;  // staging row at every destination
      if (slice == 0) {
        for (int d = 0; d < num_ranks; ++d) {
          if (((active >> d) & 1u) && lane < k) {
            const bool here = dst == d && ((tmask >> d) & 1u);
            const u64 drow = (u64)d * max_tokens + t;
            ((i32*)goep_ll_row(s_peers, base, node_mask, d, off_stage_ids, off_send_ids, srow, drow, 4ull * k))[lane] =
                here ? (i32)(id - (i64)d * local_experts) : -1;
            ((float*)goep_ll_row(s_peers, base, node_mask, d, off_stage_w, off_send_w, srow, drow, 4ull * k))[lane] =
                here ? w : 0.0f;
          }
        }
        // Ids outside [-1, E) are ignored; the receive step publishes
        // their count (InvalidOut) for the host.
        const u32 bad = __ballot_sync(0xffffffffu, lane < k && id != -1 && !valid);
        if (lane == 0) {
          ((u32*)(base + off_own_mask))[t] = tmask;
          if (bad != 0) {
            atomicAdd((u32*)(ctrl + GOEP_LL_CTRL_INVALID_ACC) + set, (u32)__popc(bad));
          }
        }
      }
      if (tmask == 0) {
        continue;
      }
      GOEP_LL_TR_COUNT(0)
      for (int rr = r_lo; rr < r_hi; ++rr) {
        const int c = rr * 32 + lane;
        const bool in = c < nchunks;
        const uint4 v = vn;  // zero where !in
        vn = make_uint4(0, 0, 0, 0);
        if (rr + 1 < r_hi && c + 32 < nchunks) {
          vn = goep_in_ld_nc_v4(src + (u64)(c + 32) * 16);
        }
        if (!quant) {
          if (in) {
            for (int d = 0; d < num_ranks; ++d) {
              if ((tmask >> d) & 1u) {
                goep_in_st_v4(goep_ll_row(s_peers, base, node_mask, d, off_stage_x, off_send_x, srow,
                                          (u64)d * max_tokens + t, row2) +
                                  (u64)c * 16,
                              v);
              }
            }
          }
          continue;
        }
        // FP8: 8 elements a lane, a 128-group over 16 lanes.
        float f[8];
        float amax = 0.0f;
        goep_ll_bf16x8_to_f32(v, f);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float a = goep_u32_as_f32(goep_f32_as_u32(f[i]) & 0x7fffffffu);
          if (a > amax) {
            amax = a;
          }
        }
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) {
          const float n = __shfl_xor_sync(0xffffffffu, amax, o);
          if (n > amax) {
            amax = n;
          }
        }
        if (amax < 1e-4f) {
          amax = 1e-4f;
        }
        float scale = goep_ll_div(amax, 448.0f);
        float inv = goep_ll_div(448.0f, amax);
        if (format == GOEP_LL_UE8M0) {
          u32 b = goep_f32_as_u32(scale);
          if (b & 0x7fffffu) {
            b = (b & 0x7f800000u) + 0x800000u;
          }
          const u32 ex = b >> 23;
          scale = goep_u32_as_f32(b);
          inv = ex < 254 ? goep_u32_as_f32((254u - ex) << 23) : 0.0f;
        }
        u32 lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo |= (u32)goep_f32_to_fp8e4m3_bits(goep_ll_mul(f[i], inv)) << (8 * i);
          hi |= (u32)goep_f32_to_fp8e4m3_bits(goep_ll_mul(f[4 + i], inv)) << (8 * i);
        }
        if (in) {
          for (int d = 0; d < num_ranks; ++d) {
            if ((tmask >> d) & 1u) {
              const u64 drow = (u64)d * max_tokens + t;
              // One 8-byte store a lane (the row and c * 8 are 8-byte
              // aligned): two 4-byte ones made each warp's write two
              // strided, half-masked 256-byte writes over NVLink instead of
              // one whole one.
              *(u64*)(goep_ll_row(s_peers, base, node_mask, d, off_stage_x, off_send_x, srow, drow, row2) +
                      (u64)c * 8) = (u64)lo | ((u64)hi << 32);  // little-endian: lo, then hi
              if ((lane & 15) == 0) {
                ((float*)goep_ll_row(s_peers, base, node_mask, d, off_stage_s, off_send_s, srow, drow,
                                     4ull * ns))[c >> 4] = scale;
              }
            }
          }
        }
      }
    }
    // Block 0 tells every rank how many tokens to look at (0 for ranks
    // masked here), before its arrival, so the share's release covers it.
    // Ranks on other nodes get it through their put (CtrlSendNTok).
    if (blockIdx.x == 0 && tid == 0) {
      for (int d = 0; d < num_ranks; ++d) {
        const i32 n = ((active >> d) & 1u) ? num_tokens : 0;
        if ((node_mask >> d) & 1u) {
          ((volatile i32*)(goep_ll_ctrl(s_peers[d], off_ctrl) + GOEP_LL_CTRL_NTOK + 4 * GOEP_LL_MAX_RANKS * set))[rank] =
              n;
        } else {
          ((volatile i32*)(ctrl + GOEP_LL_CTRL_SEND_NTOK + 4 * GOEP_LL_MAX_RANKS * set))[d] = n;
        }
      }
      ((volatile i32*)(ctrl + GOEP_LL_CTRL_OWN_T))[set] = num_tokens;
    }
    goep_ll_signal(s_peers, off_ctrl, GOEP_LL_CTRL_DISP_ARRIVE, set, rank,
                   goep_ll_all(num_ranks) & node_mask GOEP_LL_TR_ARG);
    // Across nodes: the last block moves every destination's rows with one
    // put per region (thread d for rank d), then the token count, then the
    // whole unit on d's arrival counter of this rank, all on one channel:
    // the proxy applies them in order, so the counter never overtakes the
    // rows. Masked destinations get the count (0) and the unit only.
    if (remote != 0 && goep_ll_last_block(ctrl, GOEP_LL_CTRL_DISP_SEND_DONE, set, &s_last)) {
      const int d = tid;
      if (d < num_ranks && ((remote >> d) & 1u)) {
        const goep_port_channel& ch = ports[d];
        const int rows = ((active >> d) & 1u) ? num_tokens : 0;
        const u64 nt = off_ctrl + GOEP_LL_CTRL_NTOK + 4ull * GOEP_LL_MAX_RANKS * set;
        const u64 snt = off_ctrl + GOEP_LL_CTRL_SEND_NTOK + 4ull * GOEP_LL_MAX_RANKS * set;
        (void)(goep_ll_port_rows(ch, off_stage_x, off_send_x, d, rank, max_tokens, rows, row2) &&
               (!quant || goep_ll_port_rows(ch, off_stage_s, off_send_s, d, rank, max_tokens, rows, 4ull * ns)) &&
               goep_ll_port_rows(ch, off_stage_ids, off_send_ids, d, rank, max_tokens, rows, 4ull * k) &&
               goep_ll_port_rows(ch, off_stage_w, off_send_w, d, rank, max_tokens, rows, 4ull * k) &&
               goep_pc_put(ch, nt + 4ull * rank, snt + 4ull * d, 4, GOEP_LL_STAGE_PORT_PUSH) &&
               goep_pc_atomic_add(ch, off_ctrl + goep_ll_u64_off(GOEP_LL_CTRL_DISP_ARRIVE, set, rank),
                                  GOEP_IN_ARRIVAL_UNIT, GOEP_LL_STAGE_PORT_PUSH));
      }
    }
  }

  if (!(phases & GOEP_LL_RECV)) {
    GOEP_LL_TR_CLOSE(GOEP_LL_EV_D_EXIT);
    return;
  }
  // Receive: every active source's rows are here, and every block agrees on
  // which sources count.
  i32* const tab_t = (i32*)(base + off_tab_t);
  if (!goep_ll_gate(ctrl, GOEP_LL_CTRL_DISP_ARRIVE, GOEP_LL_CTRL_DISP_GATE, GOEP_LL_CTRL_DISP_EFF, set, num_ranks,
                    rank, e, elastic, wd, wait_id, GOEP_LL_STAGE_DISP_ARRIVAL, GOEP_LL_STAGE_DISP_GATE, &s_eff,
                    tab_t, s_ntok)) {
    return;
  }
  GOEP_LL_TR(GOEP_LL_EV_RECV_GATE);
  // The sources masked (s_eff) are already folded into s_ntok (0 tokens).
  const i32* stage_ids = (const i32*)(base + off_stage_ids);
  const float* stage_w = (const float*)(base + off_stage_w);
  i32* tab_pos = (i32*)(base + off_tab_pos);
  float* tab_w = (float*)(base + off_tab_w);
  // Tables: weights of every entry; -1 for entries of other ranks
  // (rank-major: 0 marks a local entry, the row itself is the output).
  // One entry (s, t, j) per thread, in runs of 32 (a warp, coalesced)
  // dealt to the blocks in turn: a thread per (s, t) looping over j put
  // every entry in block 0 (R x MaxTokens threads), each of its threads
  // waiting out k dependent load round trips (the stores between them may
  // alias the loads) before that block could start its expansion.
  {
    const i64 entries = (i64)num_ranks * max_tokens * k;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 q = ((i64)warp * gridDim.x + blockIdx.x) * 32 + lane; q < entries; q += stride) {
      const i64 i = q / k;
      const int s = (int)(i / max_tokens), t = (int)(i - (i64)s * max_tokens);
      if (t >= s_ntok[s]) {
        continue;
      }
      const i32 id = stage_ids[q];
      const float w = stage_w[q];
      tab_w[q] = w;
      if (id < 0) {
        tab_pos[q] = -1;
      } else if (rank_major) {
        tab_pos[q] = 0;
      }
    }
  }
  if (rank_major) {
    GOEP_LL_TR(GOEP_LL_EV_D_TABLES);  // thread 0's share only: no barrier follows the tables here
  }
  if (!rank_major) {
    const int slots = num_ranks * max_tokens;
    const int out_row = quant ? hidden : 2 * hidden;
    const int nw = (ns + 3) / 4;
    i32* tab_row = (i32*)(base + off_tab_row);
    i32* recv_src = (i32*)(base + off_recv_src);
    // With fewer local experts than blocks (EP8, 32 experts a rank on 132
    // SMs), `copies` blocks take the same expert: each runs the (cheap,
    // ids-only) scan and copies the rows p with p % copies == part, so
    // every SM copies instead of one block per expert; part 0 writes the
    // expert's tables, each part tab_row of its own rows (no two blocks
    // write one word).
    const int copies = max(1, (int)gridDim.x / local_experts);
    // One scan over every source's tokens at once (flattened: source,
    // then token, the order of the rows), not one per source: each
    // per-source scan was a dependent global load of the ids and three
    // barriers, R of them in a row (8 at EP8). Per-source totals (the
    // layout ranges) from shared integer atomics, which are exact in any
    // order.
    if (tid == 0) {
      int acc = 0;
      for (int s = 0; s < num_ranks; ++s) {
        s_tokbeg[s] = acc;
        acc += s_ntok[s];
      }
      s_tokbeg[num_ranks] = acc;
    }
    __syncthreads();
    GOEP_LL_TR(GOEP_LL_EV_D_TABLES);
    const int ntot = s_tokbeg[num_ranks];
    const int per = (ntot + blockDim.x - 1) / blockDim.x;
    const int g0 = min(ntot, tid * per), g1 = min(ntot, g0 + per);
    for (int u = blockIdx.x; u < local_experts * copies; u += gridDim.x) {
      const int le = u / copies, part = u - le * copies;
      if (tid < num_ranks) {
        s_cnt[tid] = 0;
      }
      __syncthreads();
      int cnt = 0;
      {
        int s = 0, cs = 0;
        for (int g = g0; g < g1; ++g) {
          while (g >= s_tokbeg[s + 1]) {
            if (cs != 0) {
              atomicAdd(&s_cnt[s], cs);
            }
            cnt += cs;
            cs = 0;
            ++s;
          }
          const i64 row = (i64)s * max_tokens + (g - s_tokbeg[s]);
          for (int j = 0; j < k; ++j) {
            cs += stage_ids[row * k + j] == le;
          }
        }
        if (cs != 0) {
          atomicAdd(&s_cnt[s], cs);
        }
        cnt += cs;
      }
      int total_all;
      int p = goep_ll_block_scan(cnt, &total_all, s_warp);  // its barriers also complete s_cnt
      {
        int s = 0;
        for (int g = g0; g < g1; ++g) {
          while (g >= s_tokbeg[s + 1]) {
            ++s;
          }
          const int t = g - s_tokbeg[s];
          for (int j = 0; j < k; ++j) {
            const i64 q = ((i64)s * max_tokens + t) * k + j;
            if (stage_ids[q] == le) {
              if (part == 0) {
                tab_pos[q] = le * slots + p;
                recv_src[(i64)le * slots + p] = t;
              }
              if (p % copies == part) {
                tab_row[(i64)le * slots + p] = s * max_tokens + t;
              }
              ++p;
            }
          }
        }
      }
      if (part == 0 && tid < num_ranks) {
        int begin = 0;
        for (int s = 0; s < tid; ++s) {
          begin += s_cnt[s];
        }
        ((u64*)(base + off_recv_range))[(i64)le * num_ranks + tid] = (u64)(u32)begin | ((u64)(u32)s_cnt[tid] << 32);
      }
      if (tid == 0 && part == 0) {
        ((i32*)(base + off_recv_count))[le] = total_all;
      }
      __syncthreads();  // tab_row of this part's rows, written by the block, is complete
      GOEP_LL_TR(GOEP_LL_EV_D_SCAN);  // a block with several experts: the last one's
      const int nch = out_row >> 4;
      for (int p = part + copies * warp; p < total_all; p += copies * nwarps) {
        GOEP_LL_TR_COUNT(1)
        const i64 from = tab_row[(i64)le * slots + p];
        const i64 to = (i64)le * slots + p;
        const u8* srow = (const u8*)(base + off_stage_x) + from * row2;
        u8* drow = (u8*)(base + off_recv_x) + to * out_row;
        // Eight loads in flight per lane before their stores: one load
        // then its store per chunk waits out a memory round trip each
        // (the asm's memory clobber keeps that order), 28 of them a BF16
        // row at H 7168; with eight, 4 a BF16 row and 2 an FP8 one (four
        // in flight left 7 and 4, and one warp copies a whole row).
        for (int c0 = lane; c0 < nch; c0 += 8 * 32) {
          uint4 v[8];
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            if (c0 + 32 * q < nch) {
              v[q] = goep_in_ld_peer_v4(srow + (u64)(c0 + 32 * q) * 16);
            }
          }
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            if (c0 + 32 * q < nch) {
              goep_in_st_v4(drow + (u64)(c0 + 32 * q) * 16, v[q]);
            }
          }
        }
        if (format == GOEP_LL_FP8) {
          const float* ss = (const float*)(base + off_stage_s) + from * ns;
          for (int g = lane; g < ns; g += 32) {
            ((float*)(base + off_recv_s))[to * ns + g] = ss[g];
          }
        } else if (format == GOEP_LL_UE8M0) {
          const u32* ss = (const u32*)(base + off_stage_s) + from * ns;
          for (int wi = lane; wi < nw; wi += 32) {
            u32 word = 0;
            for (int b = 0; b < 4 && 4 * wi + b < ns; ++b) {
              word |= ((ss[4 * wi + b] >> 23) & 0xffu) << (8 * b);
            }
            ((u32*)(base + off_recv_s))[to * nw + wi] = word;
          }
        }
      }
      __syncthreads();
    }
    if ((int)blockIdx.x >= local_experts * copies) {
      GOEP_LL_TR(GOEP_LL_EV_D_SCAN);  // a block without an expert part: it passed the scan with nothing to do
    }
  }
  // Done reading the staged rows: the sources may write this set again.
  goep_ll_finish(s_peers, ctrl, GOEP_LL_CTRL_DISP_DONE, GOEP_LL_CTRL_DISP_EPOCH, set, e, true, ports,
                 goep_ll_all(num_ranks) & node_mask, remote, rank, off_ctrl, GOEP_LL_CTRL_DISP_FREED,
                 &s_last GOEP_LL_TR_FINISH_ARG(GOEP_LL_EV_D_COPY, GOEP_LL_EV_D_RECV_FENCED));
  GOEP_LL_TR_CLOSE(GOEP_LL_EV_D_EXIT);
}

// ---------------------------------------------------------------------------
// Combine.

// Combine send: unit u's source s, token t and slice. Units run over the
// tokens this rank received only, source after source (s_tokbeg: exclusive
// prefix of the sources' token counts, R + 1 entries): u / num_slices is
// the received token's index in that order.
__device__ __forceinline__ void goep_ll_comb_unit(int u, int num_slices, const int* s_tokbeg, int* s, int* t,
                                                  int* slice) {
  const int i = u / num_slices;
  int r = 0;
  while (i >= s_tokbeg[r + 1]) {  // sources without tokens have equal bounds and are skipped
    ++r;
  }
  *s = r;
  *t = i - s_tokbeg[r];
  *slice = u - i * num_slices;
}

// Combine send: the table entries of unit u (lane j < k: entry j's
// position, -1 when not local, and weight) when u is a token this rank
// received from an active source; false (and -1) otherwise.
__device__ __forceinline__ bool goep_ll_comb_entry(int u, int units, int num_slices, int max_tokens, const int* s_tokbeg,
                                                   u32 active, int k, int lane, const i32* tab_pos,
                                                   const float* tab_w, int* pos, float* w) {
  *pos = -1;
  *w = 0.0f;
  if (u >= units) {
    return false;
  }
  int s, t, slice;
  goep_ll_comb_unit(u, num_slices, s_tokbeg, &s, &t, &slice);
  if (!((active >> s) & 1u)) {
    return false;
  }
  const i64 i = (i64)s * max_tokens + t;
  if (lane < k) {
    *pos = tab_pos[i * k + lane];
    *w = tab_w[i * k + lane];
  }
  return true;
}

// Combine send: chunk c of expert-major row p of y (BF16, or FP8 with its
// group's scale in *sc), and its weighted addition acc += w * y.
__device__ __forceinline__ uint4 goep_ll_y_chunk(const u8* y, const float* y_scales, int y_fp8, int p, int hidden,
                                                 int ns, int c, float* sc) {
  if (y_fp8) {
    const u32* q8 = (const u32*)(y + (u64)p * hidden + (u64)c * 8);
    *sc = y_scales[(i64)p * ns + (c >> 4)];
    return make_uint4(q8[0], q8[1], 0, 0);
  }
  *sc = 0.0f;
  return goep_in_ld_nc_v4(y + (u64)p * hidden * 2 + (u64)c * 16);
}

__device__ __forceinline__ void goep_ll_y_acc(uint4 v, float sc, int y_fp8, float w, float acc[8]) {
  float yv[8];
  if (y_fp8) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      yv[x] = goep_ll_mul(goep_fp8e4m3_bits_to_f32((u8)(v.x >> (8 * x))), sc);
      yv[4 + x] = goep_ll_mul(goep_fp8e4m3_bits_to_f32((u8)(v.y >> (8 * x))), sc);
    }
  } else {
    goep_ll_bf16x8_to_f32(v, yv);
  }
#pragma unroll
  for (int x = 0; x < 8; ++x) {
    acc[x] = goep_ll_add(acc[x], goep_ll_mul(w, yv[x]));
  }
}


// The combine kernels' body. FAST (goep_ll_combine_fast): one node,
// expert-major BF16 input, not elastic (see goep_ll_dispatch_run).
template <int FAST>
__device__ __forceinline__ void goep_ll_combine_run(GOEP_LL_COMBINE_PARAMS) {
  __shared__ u64 s_epoch;
  __shared__ int s_last;
  __shared__ u64 s_peers[GOEP_LL_MAX_RANKS];
  __shared__ u32 s_active;
  __shared__ u32 s_eff;
  __shared__ int s_ntok[GOEP_LL_MAX_RANKS];
  __shared__ int s_tokbeg[GOEP_LL_MAX_RANKS + 1];
  GOEP_LL_TR_INIT
  if (FAST) {
    y_fp8 = 0;
    rank_major = 0;
    elastic = 0;
    node_mask = goep_ll_all(num_ranks);
  }
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u8* const ctrl = goep_ll_ctrl(peers[rank], off_ctrl);
  const u64 base = peers[rank];
  if (tid == 0) {
    s_epoch = goep_in_ld_volatile_u64((u64*)(ctrl + GOEP_LL_CTRL_COMB_EPOCH) + set) + 1;
  }
  if (tid < num_ranks) {
    s_peers[tid] = peers[tid];
  }
  if (warp == 0) {
    // The sources' token counts and their exclusive prefix (warp 0 alone,
    // before the first barrier): the send step's units run over received
    // tokens only.
    const int n = lane < num_ranks ? ((const i32*)(base + off_tab_t))[lane] : 0;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) {
        incl += v;
      }
    }
    if (lane < num_ranks) {
      s_ntok[lane] = n;
    }
    s_tokbeg[lane + 1] = incl;
    if (lane == 0) {
      s_tokbeg[0] = 0;
    }
  }
  __syncthreads();
  const u64 e = s_epoch;
  GOEP_LL_TR_OPEN(1);
  const u64 row2 = (u64)hidden * 2;
  const int nchunks = hidden >> 3;
  const int ns = hidden / 128;
  const u32 remote = goep_ll_all(num_ranks) & ~node_mask;  // ranks on other nodes

  if (phases & GOEP_LL_SEND) {
    if (!goep_ll_send_gate(ctrl, GOEP_LL_CTRL_COMB_FREED, set, num_ranks, rank, e, elastic, wd, wait_id,
                           GOEP_LL_STAGE_COMB_FREED, &s_active)) {
      return;
    }
    GOEP_LL_TR(GOEP_LL_EV_SEND_GATE);
    const u32 active = s_active;
    const i32* tab_pos = (const i32*)(base + off_tab_pos);
    const float* tab_w = (const float*)(base + off_tab_w);
    // Units: (received token, slice), over the tokens this rank received
    // only (source, then token). They ran over every (source, token) slot
    // of the workspace, R x MaxTokens x slices, which put all of source s's
    // units in the warps' s-th pass: at 1 token, block 0's first 16 warps
    // walked the R sources one after another while the other blocks had
    // nothing (a row load round trip per source in a row).
    const int units = s_tokbeg[num_ranks] * num_slices;
    const int ustride = gridDim.x * nwarps;
    // Software-pipelined over a warp's units (4 a warp at EP4 x 128
    // tokens): the next unit's table entries are loaded before this
    // unit's rows, so their round trip hides behind this unit's work
    // instead of opening every unit.
    int u = blockIdx.x * nwarps + warp;
    int pos_n;
    float w_n;
    bool ok_n =
        goep_ll_comb_entry(u, units, num_slices, max_tokens, s_tokbeg, active, k, lane, tab_pos, tab_w, &pos_n, &w_n);
    for (; u < units; u += ustride) {
      const int pos = pos_n;
      const float w = w_n;
      const bool ok = ok_n;
      const i64 un = (i64)u + ustride;
      ok_n = un < units && goep_ll_comb_entry((int)un, units, num_slices, max_tokens, s_tokbeg, active, k, lane,
                                              tab_pos, tab_w, &pos_n, &w_n);
      if (!ok) {
        continue;
      }
      int s, t, slice;
      goep_ll_comb_unit(u, num_slices, s_tokbeg, &s, &t, &slice);
      const i64 i = (i64)s * max_tokens + t;  // the (source, token) slot: rank-major row of y
      const u32 local = __ballot_sync(0xffffffffu, pos >= 0);
      if (local == 0) {
        continue;
      }
      GOEP_LL_TR_COUNT(0)
      u8* const dst = goep_ll_row(s_peers, base, node_mask, s, off_cstage, off_csend, (u64)rank * max_tokens + t,
                                  (u64)s * max_tokens + t, row2);
      int r_lo, r_hi;
      goep_ll_slice_rounds(nchunks, slice, num_slices, &r_lo, &r_hi);
      // Two rounds at a time: the loads of both go out before any add
      // (one round trip per two rounds; 1-2 rounds a unit at 16 slices).
      for (int rr = r_lo; rr < r_hi; rr += 2) {
        const int c0 = rr * 32 + lane, c1 = c0 + 32;
        const bool in0 = c0 < nchunks, in1 = rr + 1 < r_hi && c1 < nchunks;  // in1 implies in0
        if (rank_major) {
          uint4 a = make_uint4(0, 0, 0, 0), b = make_uint4(0, 0, 0, 0);
          if (in0) {
            a = goep_in_ld_nc_v4(y + (u64)i * row2 + (u64)c0 * 16);
          }
          if (in1) {
            b = goep_in_ld_nc_v4(y + (u64)i * row2 + (u64)c1 * 16);
          }
          if (in0) {
            goep_in_st_v4(dst + (u64)c0 * 16, a);
          }
          if (in1) {
            goep_in_st_v4(dst + (u64)c1 * 16, b);
          }
          continue;
        }
        float acc0[8], acc1[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          acc0[q] = 0.0f;
          acc1[q] = 0.0f;
        }
        // Up to four of the token's local rows loaded before any is added
        // (one memory round trip per four entries instead of one each),
        // added in ascending slot order as the reference does.
        u32 m = local;
        while (m != 0) {
          int pq[4];
          float wq[4];
          int nb = 0;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            pq[q] = 0;
            wq[q] = 0.0f;
            if (m != 0) {  // warp-uniform (a ballot)
              const int j = __ffs(m) - 1;
              m &= m - 1u;
              pq[q] = __shfl_sync(0xffffffffu, pos, j);
              wq[q] = __shfl_sync(0xffffffffu, w, j);
              nb = q + 1;
            }
          }
          if (!in0) {
            continue;
          }
          uint4 v0[4], v1[4];
          float sc0[4], sc1[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < nb) {
              v0[q] = goep_ll_y_chunk(y, y_scales, y_fp8, pq[q], hidden, ns, c0, &sc0[q]);
              if (in1) {
                v1[q] = goep_ll_y_chunk(y, y_scales, y_fp8, pq[q], hidden, ns, c1, &sc1[q]);
              }
            }
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (q < nb) {
              goep_ll_y_acc(v0[q], sc0[q], y_fp8, wq[q], acc0);
              if (in1) {
                goep_ll_y_acc(v1[q], sc1[q], y_fp8, wq[q], acc1);
              }
            }
          }
        }
        if (in0) {
          goep_in_st_v4(dst + (u64)c0 * 16, goep_ll_f32x8_to_bf16(acc0));
        }
        if (in1) {
          goep_in_st_v4(dst + (u64)c1 * 16, goep_ll_f32x8_to_bf16(acc1));
        }
      }
    }
    goep_ll_signal(s_peers, off_ctrl, GOEP_LL_CTRL_COMB_ARRIVE, set, rank,
                   goep_ll_all(num_ranks) & node_mask GOEP_LL_TR_ARG);
    // Across nodes: one put of the owner's partial rows (its token count),
    // then the unit on its arrival counter, on one channel.
    if (remote != 0 && goep_ll_last_block(ctrl, GOEP_LL_CTRL_COMB_SEND_DONE, set, &s_last)) {
      const int s = tid;
      if (s < num_ranks && ((remote >> s) & 1u)) {
        const int rows = ((active >> s) & 1u) ? s_ntok[s] : 0;
        (void)(goep_ll_port_rows(ports[s], off_cstage, off_csend, s, rank, max_tokens, rows, row2) &&
               goep_pc_atomic_add(ports[s], off_ctrl + goep_ll_u64_off(GOEP_LL_CTRL_COMB_ARRIVE, set, rank),
                                  GOEP_IN_ARRIVAL_UNIT, GOEP_LL_STAGE_PORT_PUSH));
      }
    }
  }

  if (!(phases & GOEP_LL_RECV)) {
    GOEP_LL_TR_CLOSE(GOEP_LL_EV_C_EXIT);
    return;
  }
  if (!goep_ll_gate(ctrl, GOEP_LL_CTRL_COMB_ARRIVE, GOEP_LL_CTRL_COMB_GATE, GOEP_LL_CTRL_COMB_EFF, set, num_ranks,
                    rank, e, elastic, wd, wait_id, GOEP_LL_STAGE_COMB_ARRIVAL, GOEP_LL_STAGE_COMB_GATE, &s_eff,
                    nullptr, nullptr)) {
    return;
  }
  GOEP_LL_TR(GOEP_LL_EV_RECV_GATE);
  const u32 eff = s_eff;
  const u32* own_mask = (const u32*)(base + off_own_mask);
  const u8* cstage = (const u8*)(base + off_cstage);
  const int units = num_tokens * num_slices;
  for (int u = blockIdx.x * nwarps + warp; u < units; u += gridDim.x * nwarps) {
    GOEP_LL_TR_COUNT(1)
    const int t = u / num_slices, slice = u - t * num_slices;
    const u32 dm = own_mask[t] & ~eff;
    int r_lo, r_hi;
    goep_ll_slice_rounds(nchunks, slice, num_slices, &r_lo, &r_hi);
    // Two rounds at a time: the partial loads of both go out before any
    // add (one round trip per two rounds: 1-2 rounds a unit at 16 slices).
    for (int rr = r_lo; rr < r_hi; rr += 2) {
      const int c0 = rr * 32 + lane, c1 = c0 + 32;
      const bool in1 = rr + 1 < r_hi && c1 < nchunks;  // implies c0 < nchunks
      if (c0 >= nchunks) {
        continue;
      }
      float acc0[8], acc1[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        acc0[q] = 0.0f;
        acc1[q] = 0.0f;
      }
      // Up to four partials (of each round) loaded before any is added
      // (one memory round trip per four destinations instead of one
      // each), added in ascending d as the reference does.
      u32 m = dm;
      while (m != 0) {
        uint4 v0[4], v1[4];
        int nb = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (m != 0) {
            const int d = __ffs(m) - 1;
            m &= m - 1u;
            const u8* prow = cstage + ((u64)d * max_tokens + t) * row2;
            v0[q] = goep_in_ld_peer_v4(prow + (u64)c0 * 16);
            if (in1) {
              v1[q] = goep_in_ld_peer_v4(prow + (u64)c1 * 16);
            }
            nb = q + 1;
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (q < nb) {
            float pv[8];
            goep_ll_bf16x8_to_f32(v0[q], pv);
#pragma unroll
            for (int x = 0; x < 8; ++x) {
              acc0[x] = goep_ll_add(acc0[x], pv[x]);
            }
            if (in1) {
              goep_ll_bf16x8_to_f32(v1[q], pv);
#pragma unroll
              for (int x = 0; x < 8; ++x) {
                acc1[x] = goep_ll_add(acc1[x], pv[x]);
              }
            }
          }
        }
      }
      goep_in_st_v4(out + (u64)t * row2 + (u64)c0 * 16, goep_ll_f32x8_to_bf16(acc0));
      if (in1) {
        goep_in_st_v4(out + (u64)t * row2 + (u64)c1 * 16, goep_ll_f32x8_to_bf16(acc1));
      }
    }
  }
  // Done reading the partials: the expert ranks may write this set again.
  goep_ll_finish(s_peers, ctrl, GOEP_LL_CTRL_COMB_DONE, GOEP_LL_CTRL_COMB_EPOCH, set, e, false, ports,
                 goep_ll_all(num_ranks) & node_mask, remote, rank, off_ctrl, GOEP_LL_CTRL_COMB_FREED,
                 &s_last GOEP_LL_TR_FINISH_ARG(GOEP_LL_EV_C_REDUCED, GOEP_LL_EV_C_RECV_FENCED));
  GOEP_LL_TR_CLOSE(GOEP_LL_EV_C_EXIT);
}

// The kernels: the general ones and the specialised ones (same
// parameters; lowlatency.Workspace picks).
extern "C" __global__ void goep_ll_dispatch(GOEP_LL_DISPATCH_PARAMS) {
  goep_ll_dispatch_run<0, GOEP_LL_BF16>(GOEP_LL_DISPATCH_ARGS);
}
extern "C" __global__ void goep_ll_dispatch_bf16(GOEP_LL_DISPATCH_PARAMS) {
  goep_ll_dispatch_run<1, GOEP_LL_BF16>(GOEP_LL_DISPATCH_ARGS);
}
extern "C" __global__ void goep_ll_dispatch_fp8(GOEP_LL_DISPATCH_PARAMS) {
  goep_ll_dispatch_run<1, GOEP_LL_FP8>(GOEP_LL_DISPATCH_ARGS);
}
extern "C" __global__ void goep_ll_dispatch_ue8m0(GOEP_LL_DISPATCH_PARAMS) {
  goep_ll_dispatch_run<1, GOEP_LL_UE8M0>(GOEP_LL_DISPATCH_ARGS);
}
extern "C" __global__ void goep_ll_combine(GOEP_LL_COMBINE_PARAMS) {
  goep_ll_combine_run<0>(GOEP_LL_COMBINE_ARGS);
}
extern "C" __global__ void goep_ll_combine_fast(GOEP_LL_COMBINE_PARAMS) {
  goep_ll_combine_run<1>(GOEP_LL_COMBINE_ARGS);
}

// Mask update, stream-ordered and graph-capturable: op 0 sets the mask to
// value, 1 adds the ranks in value, 2 removes them.
extern "C" __global__ void goep_ll_set_mask(u32* mask, u32 value, int op) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    u32 m = *(volatile u32*)mask;
    m = op == 0 ? value : (op == 1 ? (m | value) : (m & ~value));
    *(volatile u32*)mask = m;
  }
}
