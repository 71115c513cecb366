// intranode.cu: intranode (NVLink) notify, dispatch and combine.
//
// The plain-Go semantics are intranode.ReferenceDispatch / ReferenceCombine;
// the Go twins are in intranode/twins.go; the launchers (which
// validate every argument before a launch) are in package intranode. The
// workspace ABI (control block, arrival shares, epochs, combine input
// descriptors) is described in intranode.cuh; the TMA variant of dispatch
// is in intranode_tma.cu (its own module).
//
// Handle (device memory of the rank that dispatches, reused by cached
// dispatch and by combine):
//   send_pos[T][R]  i32: index of token t among this rank's tokens that go to
//                   rank d (ascending t), or -1
//   rank_prefix[R]  i32: tokens this rank receives from sources 0..s
//                   (inclusive); rank_prefix[R-1] is the received total
//   recv_base[R]    i32: where this rank's tokens start in rank d's receive
//                   region (tokens sources < rank send to d)
//   num_recv[1]     i32: received total
//
// Receive region of rank d (views the caller reads after dispatch):
//   recv_x[N][row_bytes], recv_scales[N][H/128] f32 (FP8), recv_src_token[N]
//   i32, recv_topk[N][K] i64 (local expert ids, -1 for experts elsewhere),
//   recv_weights[N][K] f32 (0 where recv_topk is -1). Row of token t of
//   source s: recv_base_s[d] + send_pos_s[t][d]; ordered by source, then t.
//
// Combine (pull): rank d's combine input y_d [N_d][H] bf16 (and weights
// [N_d][K] f32) lies in d's workspace, in d's receive order, so the row that
// d returns for token t of owner s is y_d[recv_base_s[d] + send_pos_s[t][d]].
// The owner reads those rows over NVLink and computes
//   out[t] = bf16_rne(((0 + y_d0[.]) + y_d1[.] + ...) + bias0 + bias1)
// over d ascending with send_pos[t][d] >= 0, in fp32: the summation order of
// intranode.ReferenceCombine, so results match it bit for bit.
#include "intranode.cuh"

// 16-byte chunks per lane per combine round; each needs one load per source
// rank, all issued before the first add (GOEP_IN_COMBINE_UNROLL * 8 loads in
// flight per lane at 8 ranks).
#ifndef GOEP_IN_COMBINE_UNROLL
#define GOEP_IN_COMBINE_UNROLL 2
#endif

// Block-size bounds (GOEP_IN_*_MAX_THREADS, intranode.cuh), given on
// declarations because the definitions keep the plain
// `extern "C" __global__ void name(` form the registry test looks for (a
// definition inherits the bounds of its declaration). They cap registers so
// that the launchers' block sizes always fit, whatever NVRTC version compiles
// this: notify and dispatch up to 1024 threads (64 registers), combine and
// the staging copy up to 512 (128 registers).

extern "C" {
__global__ void __launch_bounds__(GOEP_IN_NOTIFY_MAX_THREADS)
    goep_intranode_notify(const u64* peers, u64 off_ctrl, u64 off_counts, u64 off_expert_counts, const i64* topk_idx,
                          int num_tokens, int k, int num_experts, int num_ranks, int rank, int expert_alignment,
                          i32* send_pos, i32* rank_prefix, i32* recv_base, i32* num_recv, i32* mapped_num_recv,
                          i32* expert_counts, i32* invalid, goep_watchdog* wd, u32 wait_id, u64 fp_shape);
__global__ void __launch_bounds__(GOEP_IN_DISPATCH_MAX_THREADS)
    goep_intranode_dispatch(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales, u64 off_recv_src,
                            u64 off_recv_topk, u64 off_recv_weights, const u8* x, const float* scales,
                            const i64* topk_idx, const float* topk_weights, const i32* send_pos, const i32* recv_base,
                            int num_tokens, int k, int num_ranks, int rank, int local_experts, int row_bytes,
                            int num_scales, int num_slices, int skip_entry, goep_watchdog* wd, u32 wait_id,
                            i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape);
__global__ void __launch_bounds__(GOEP_IN_DISPATCH_WIDE_MAX_THREADS)
    goep_intranode_dispatch_wide(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales,
                                 u64 off_recv_src, u64 off_recv_topk, u64 off_recv_weights, const u8* x,
                                 const float* scales, const i64* topk_idx, const float* topk_weights,
                                 const i32* send_pos, const i32* recv_base, int num_tokens, int k, int num_ranks,
                                 int rank, int local_experts, int row_bytes, int num_scales, int num_slices,
                                 int skip_entry, goep_watchdog* wd, u32 wait_id,
                                 i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape);
__global__ void __launch_bounds__(GOEP_IN_COMBINE_MAX_THREADS)
    goep_intranode_combine(const u64* peers, u64 off_ctrl, u64 off_y, u64 off_w, const i32* recv_base,
                           const i32* send_pos, const u8* bias0, const u8* bias1, u8* out, float* out_weights,
                           int num_tokens, int k, int num_ranks, int rank, int hidden, int num_slices,
                           goep_watchdog* wd, u32 wait_id, u64 fp_shape);
__global__ void __launch_bounds__(GOEP_IN_COPY_MAX_THREADS)
    goep_intranode_copy_rows(const u8* src, u8* dst, const i32* num_rows, int max_rows, u64 row_bytes);
}

// A peer's combine weight (NVLink), read after the acquire of its entry
// flag: plain load, no L1 allocation.
__device__ __forceinline__ float goep_in_ld_peer_f32(const float* p) {
  float v;
  asm volatile("ld.global.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
// ---------------------------------------------------------------------------
// Notify (one block): send positions, count exchange, barrier, prefixes.
//
// Counts region of every rank (two parities, alternating by epoch, so that a
// fast peer's next notify never overwrites counts this rank is still
// reading): counts[2][R][R] i32 (row s = what rank s sends to each rank) at
// off_counts, expert_counts[2][R][E/R] i32 (entries of source s for each local
// expert) at off_expert_counts.
//
// Each thread takes a contiguous run of tokens, counts their destinations,
// a block-wide scan turns the counts into each run's first send position, and
// a second pass writes send_pos. Expert ids outside [-1, E) are ignored
// (counted in *invalid when given), exactly as the dispatch kernel treats
// them.
extern "C" __global__ void goep_intranode_notify(const u64* peers, u64 off_ctrl, u64 off_counts,
                                                 u64 off_expert_counts, const i64* topk_idx, int num_tokens, int k,
                                                 int num_experts, int num_ranks, int rank, int expert_alignment,
                                                 i32* send_pos, i32* rank_prefix, i32* recv_base, i32* num_recv,
                                                 i32* mapped_num_recv, i32* expert_counts, i32* invalid,
                                                 goep_watchdog* wd, u32 wait_id, u64 fp_shape) {
  extern __shared__ i32 s_expert[];  // [num_experts]
  __shared__ i32 s_warp[32][GOEP_IN_MAX_RANKS];
  __shared__ i32 s_total[GOEP_IN_MAX_RANKS];
  __shared__ i32 s_matrix[GOEP_IN_MAX_RANKS][GOEP_IN_MAX_RANKS];
  __shared__ i32 s_bad;
  __shared__ u64 s_epoch;
  __shared__ u64 s_fp;
  __shared__ u64 s_step;

  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  for (int i = tid; i < num_experts; i += nthreads) {
    s_expert[i] = 0;
  }
  if (tid == 0) {
    s_bad = 0;
    GOEP_IN_BEGIN(ctrl, GOEP_IN_KIND_NOTIFY, rank, fp_shape, s_epoch, s_fp, s_step);
  }
  __syncthreads();
  const u64 e = s_epoch, fp = GOEP_IN_FPVAL(s_fp);
  if (fp == 0) {  // an earlier launch of this rank failed
    return;
  }
  const int parity = (int)(e & 1ull);
  const int le = num_experts / num_ranks;

  // Pass 1: destinations of this thread's tokens.
  const i64 chunk = ((i64)num_tokens + nthreads - 1) / nthreads;
  const i64 t0 = min((i64)num_tokens, (i64)tid * chunk), t1 = min((i64)num_tokens, t0 + chunk);
  i32 cnt[GOEP_IN_MAX_RANKS];
#pragma unroll
  for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
    cnt[d] = 0;
  }
  i32 bad = 0;
  for (i64 t = t0; t < t1; ++t) {
    u32 m = 0;
    for (int j = 0; j < k; ++j) {
      const i64 x = topk_idx[t * k + j];
      if (x >= 0 && x < num_experts) {
        m |= 1u << (u32)(x / le);
        atomicAdd(&s_expert[x], 1);
      } else if (x != -1) {
        ++bad;
      }
    }
#pragma unroll
    for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
      cnt[d] += (i32)((m >> d) & 1u);
    }
  }
  if (bad != 0) {
    atomicAdd(&s_bad, bad);
  }

  // Block-wide exclusive scan of cnt[d] over threads (thread order = token
  // order, since runs are contiguous and ascending).
  i32 incl[GOEP_IN_MAX_RANKS];
#pragma unroll
  for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
    i32 v = cnt[d];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const i32 n = __shfl_up_sync(0xffffffffu, v, off);
      if (lane >= off) {
        v += n;
      }
    }
    incl[d] = v;
    if (lane == 31) {
      s_warp[warp][d] = v;
    }
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
      i32 v = lane < nwarps ? s_warp[lane][d] : 0;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const i32 n = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) {
          v += n;
        }
      }
      if (lane < nwarps) {
        s_warp[lane][d] = v;  // inclusive over warps 0..lane
      }
      if (lane == nwarps - 1) {
        s_total[d] = v;
      }
    }
  }
  __syncthreads();

  // Pass 2: send positions.
  i32 run[GOEP_IN_MAX_RANKS];
#pragma unroll
  for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
    run[d] = (warp > 0 ? s_warp[warp - 1][d] : 0) + incl[d] - cnt[d];
  }
  for (i64 t = t0; t < t1; ++t) {
    u32 m = 0;
    for (int j = 0; j < k; ++j) {
      const i64 x = topk_idx[t * k + j];
      if (x >= 0 && x < num_experts) {
        m |= 1u << (u32)(x / le);
      }
    }
#pragma unroll
    for (int d = 0; d < GOEP_IN_MAX_RANKS; ++d) {
      if (d < num_ranks) {
        send_pos[t * num_ranks + d] = ((m >> d) & 1u) ? run[d]++ : -1;
      }
    }
  }

  // This rank's count row and per-expert counts into every rank's counts.
  for (int i = tid; i < num_ranks * num_ranks; i += nthreads) {
    const int d = i / num_ranks, c = i % num_ranks;
    i32* m = (i32*)(peers[d] + off_counts);
    m[(parity * num_ranks + rank) * num_ranks + c] = s_total[c];
  }
  for (int i = tid; i < num_experts; i += nthreads) {
    const int d = i / le;
    i32* ec = (i32*)(peers[d] + off_expert_counts);
    ec[(parity * num_ranks + rank) * le + (i - d * le)] = s_expert[i];
  }

  // Barrier: every rank's counts of this epoch are here.
  // The arrivals carry the call's tag (notify's fingerprint holds the layout
  // of the dispatch that follows); the fingerprint word itself is published
  // only by a wait that is behind.
  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_NOTIFY, num_ranks, rank, GOEP_IN_STEPVAL(s_step));
  if (!goep_in_wait_arrived(peers, off_ctrl, ctrl, GOEP_IN_KIND_NOTIFY, num_ranks, rank, e, fp, wd, wait_id,
                            GOEP_IN_STAGE_NOTIFY_BARRIER)) {
    return;
  }
  const i32* own_counts = (const i32*)(peers[rank] + off_counts) + parity * num_ranks * num_ranks;
  for (int i = tid; i < num_ranks * num_ranks; i += nthreads) {
    s_matrix[i / num_ranks][i % num_ranks] = *(const volatile i32*)(own_counts + i);
  }
  __syncthreads();
  if (tid < num_ranks) {
    i32 prefix = 0, base = 0;
    for (int s = 0; s <= tid; ++s) {
      prefix += s_matrix[s][rank];
    }
    for (int s = 0; s < rank; ++s) {
      base += s_matrix[s][tid];
    }
    rank_prefix[tid] = prefix;
    recv_base[tid] = base;
  }
  if (expert_counts != nullptr) {
    const i32* own_ec = (const i32*)(peers[rank] + off_expert_counts) + parity * num_ranks * le;
    for (int i = tid; i < le; i += nthreads) {
      i32 n = 0;
      for (int s = 0; s < num_ranks; ++s) {
        n += *(const volatile i32*)(own_ec + s * le + i);
      }
      if (expert_alignment > 1) {
        n = (n + expert_alignment - 1) / expert_alignment * expert_alignment;
      }
      expert_counts[i] = n;
    }
  }
  __syncthreads();
  if (tid == 0) {
    i32 total = 0;
    for (int s = 0; s < num_ranks; ++s) {
      total += s_matrix[s][rank];
    }
    num_recv[0] = total;
    if (invalid != nullptr) {
      *invalid = s_bad;
    }
    if (mapped_num_recv != nullptr) {
      // The expert counts (possibly host-mapped too) before the total: a host
      // that sees total >= 0 sees them.
      goep_fence_acq_rel_sys();
      goep_st_release_sys_u32((u32*)mapped_num_recv, (u32)total);
    }
    *goep_in_epoch(ctrl, GOEP_IN_KIND_NOTIFY) = e;
  }
}


// ---------------------------------------------------------------------------
// Dispatch (cached and non-cached): every token row goes straight to its
// final place in each destination's receive region. Work split: units of
// (token, row slice), see goep_in_slice_range and goep_in_dispatch_rows
// (intranode.cuh): a warp loads 16-byte vectors of the row (non-coherent,
// no-L1 loads of local HBM) and stores each to every destination of the
// token, so a row is read once whatever its fan-out; the warp of slice 0 also
// writes the token's metadata. Row bytes must be a multiple of 16 and x,
// recv_x 16-byte aligned (the launcher checks).
//
// Completion: after its rows every block releases its arrival share to every
// rank; block 0 then waits for all ranks' shares of this epoch (so the kernel
// ends only when this rank's receive region is complete) and advances the
// epoch. x is BF16 or FP8 bytes (row_bytes = 2H or H); scales is null for
// BF16; topk_weights may be null (recv_weights then untouched). skip_entry:
// see goep_in_dispatch_enter.
//
// Two builds of the same body: goep_intranode_dispatch (up to 1024 threads,
// 64 registers: GOEP_IN_UNROLL vectors a round) and
// goep_intranode_dispatch_wide (up to 512 threads, 128 registers:
// GOEP_IN_WIDE_UNROLL vectors a round and the next round's loads in flight
// during this round's stores). The launcher picks by LaunchConfig.Copy.
extern "C" __global__ void goep_intranode_dispatch(const u64* peers, u64 off_ctrl, u64 off_recv_x,
                                                   u64 off_recv_scales, u64 off_recv_src, u64 off_recv_topk,
                                                   u64 off_recv_weights, const u8* x, const float* scales,
                                                   const i64* topk_idx, const float* topk_weights,
                                                   const i32* send_pos, const i32* recv_base, int num_tokens, int k,
                                                   int num_ranks, int rank, int local_experts, int row_bytes,
                                                   int num_scales, int num_slices, int skip_entry,
                                                   goep_watchdog* wd, u32 wait_id,
                                                   i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape) {
  GOEP_IN_DISPATCH_KERNEL_BODY(GOEP_IN_UNROLL, false, GOEP_IN_DISPATCH_MAX_THREADS)
}

extern "C" __global__ void goep_intranode_dispatch_wide(const u64* peers, u64 off_ctrl, u64 off_recv_x,
                                                        u64 off_recv_scales, u64 off_recv_src, u64 off_recv_topk,
                                                        u64 off_recv_weights, const u8* x, const float* scales,
                                                        const i64* topk_idx, const float* topk_weights,
                                                        const i32* send_pos, const i32* recv_base, int num_tokens,
                                                        int k, int num_ranks, int rank, int local_experts,
                                                        int row_bytes, int num_scales, int num_slices,
                                                        int skip_entry, goep_watchdog* wd, u32 wait_id,
                                                        i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape) {
  GOEP_IN_DISPATCH_KERNEL_BODY(GOEP_IN_WIDE_UNROLL, true, GOEP_IN_DISPATCH_WIDE_MAX_THREADS)
}

// One warp's share of a combine unit: this lane's 16-byte chunks c_lo +
// lane, + 32, ... below c_hi of the output row. Per round: U chunks, each
// loaded from every source row (nd of them, ascending rank; addresses in
// shared memory) and from the biases (when not null), all before the first
// add; then per chunk the fp32 sum in ascending source order, + bias0,
// + bias1, RNE to bf16.
template <int U>
__device__ __forceinline__ void goep_in_combine_slice(const u64* srow, int nd,
                                                      const u8* b0, const u8* b1, u8* orow, int c_lo, int c_hi,
                                                      int lane) {
  constexpr int NV = GOEP_IN_MAX_RANKS + 2;
#pragma unroll 1
  for (int c0 = c_lo + lane; c0 < c_hi; c0 += 32 * U) {
    uint4 v[U][NV];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int c = c0 + 32 * q;
      if (c < c_hi) {
#pragma unroll
        for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
          if (i < nd) {
            v[q][i] = goep_in_ld_peer_v4((const u8*)srow[i] + (u64)c * 16);
          }
        }
        if (b0 != nullptr) {
          v[q][NV - 2] = goep_in_ld_nc_v4(b0 + (u64)c * 16);
        }
        if (b1 != nullptr) {
          v[q][NV - 1] = goep_in_ld_nc_v4(b1 + (u64)c * 16);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const int c = c0 + 32 * q;
      if (c < c_hi) {
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[j] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const bool use = i < GOEP_IN_MAX_RANKS ? i < nd : (i == NV - 2 ? b0 != nullptr : b1 != nullptr);
          if (use) {
            const u32 w4[4] = {v[q][i].x, v[q][i].y, v[q][i].z, v[q][i].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              acc[2 * j] += goep_u32_as_f32(w4[j] << 16);
              acc[2 * j + 1] += goep_u32_as_f32(w4[j] & 0xffff0000u);
            }
          }
        }
        u32 o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          o[j] = (u32)goep_f32_to_bf16_bits(acc[2 * j]) | ((u32)goep_f32_to_bf16_bits(acc[2 * j + 1]) << 16);
        }
        *(uint4*)(orow + (u64)c * 16) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Combine (pull): entry, reads, completion, in one kernel.
//
// Entry: block 0 publishes this rank's input descriptor {off_y, off_w} to
// every peer's cinput[rank] and then releases entered[combine][rank] = e (the
// same thread, so the release covers the descriptor): "my combine input is
// ready" (this rank's stream finished whatever produced it). Every block
// waits for every rank's flag; thread d, having acquired peer d's flag, reads
// d's descriptor and turns it into d's input address as mapped here.
//
// Reads: units of (own token, row slice) over all warps of the grid (the
// launcher picks num_slices so that few tokens still occupy every warp). For
// token t the ranks d with send_pos[t][d] >= 0 hold its rows at
// y_d[recv_base[d] + send_pos[t][d]]; each lane loads its chunk of every such
// row (GOEP_IN_COMBINE_UNROLL chunks at once: up to 8 * unroll 16-byte NVLink
// loads in flight, plus the biases), then adds in ascending d, then bias0,
// then bias1, in fp32, and rounds to bf16. The warp of slice 0 also sums the
// weights (lanes < k).
//
// Completion: nobody may overwrite a rank's input while a peer still reads
// it, and the rank's own stream may do so as soon as this kernel ends there
// (the next layer's experts writing y, the staging copy of the next combine,
// ...). So every block, after its reads, releases its arrival share to every
// rank (arrive[combine][rank], "done reading your input"), and block 0 waits
// until every rank's shares of this epoch are here before it advances the
// epoch and the kernel ends. The next dispatch and combine entry flags then
// protect nothing more: they are kept for the receive regions (dispatch) and
// for the "input ready" meaning (combine).
extern "C" __global__ void goep_intranode_combine(const u64* peers, u64 off_ctrl, u64 off_y, u64 off_w,
                                                  const i32* recv_base, const i32* send_pos, const u8* bias0,
                                                  const u8* bias1, u8* out, float* out_weights, int num_tokens,
                                                  int k, int num_ranks, int rank, int hidden, int num_slices,
                                                  goep_watchdog* wd, u32 wait_id, u64 fp_shape) {
  __shared__ u64 s_epoch;
  __shared__ u64 s_fp;
  __shared__ u64 s_step;
  __shared__ u64 s_y[GOEP_IN_MAX_RANKS];  // peer d's combine input as mapped here
  __shared__ u64 s_w[GOEP_IN_MAX_RANKS];  // peer d's combine weights, 0 if none
  __shared__ i32 s_base[GOEP_IN_MAX_RANKS];
  __shared__ u64 s_src[GOEP_IN_COMBINE_MAX_THREADS / 32][GOEP_IN_MAX_RANKS];   // per warp: source rows
  __shared__ u64 s_wsrc[GOEP_IN_COMBINE_MAX_THREADS / 32][GOEP_IN_MAX_RANKS];  // per warp: weight rows
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u64* const my_src = s_src[warp];
  u64* const my_wsrc = s_wsrc[warp];
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  if (tid == 0) {
    GOEP_IN_BEGIN(ctrl, GOEP_IN_KIND_COMBINE, rank, fp_shape, s_epoch, s_fp, s_step);
  }
  if (tid < num_ranks) {
    s_base[tid] = recv_base[tid];
  }
  __syncthreads();
  const u64 e = s_epoch, fp = GOEP_IN_FPVAL(s_fp);
  if (fp == 0) {  // an earlier launch of this rank failed
    return;
  }
  if (blockIdx.x == 0 && tid < num_ranks) {
    u64* const peer_ctrl = goep_in_ctrl(peers[tid], off_ctrl);
    volatile u64* const desc = goep_in_cinput(peer_ctrl, rank);
    desc[0] = off_y;
    desc[1] = off_w;
    // The entry flag carries the call's tag (its release covers the
    // descriptor); the fingerprint word is published only by a wait that
    // is behind.
#if GOEP_NO_FINGERPRINT
    goep_st_release_sys_u64(goep_in_entered(peer_ctrl, GOEP_IN_KIND_COMBINE, rank), e);
#else
    goep_st_release_sys_u64(goep_in_entered(peer_ctrl, GOEP_IN_KIND_COMBINE, rank),
                            e + (goep_in_fp_tag(fp) << GOEP_IN_SIG_SHIFT));
#endif
  }
  bool ok = true;
  if (tid < num_ranks) {
#if GOEP_NO_FINGERPRINT
    ok = goep_in_wait_peer(goep_in_entered(ctrl, GOEP_IN_KIND_COMBINE, tid), e, peers, off_ctrl, fp, num_ranks, rank,
                           wd, wait_id, GOEP_IN_STAGE_COMBINE_ENTRY);
#else
    ok = goep_in_wait_sig(goep_in_entered(ctrl, GOEP_IN_KIND_COMBINE, tid), e, goep_in_fp_tag(fp), peers, off_ctrl,
                          fp, wd, wait_id, goep_in_who(tid, rank, num_ranks, GOEP_IN_STAGE_COMBINE_ENTRY));
#endif
    if (ok) {
      // Program-ordered after this thread's acquire of peer tid's flag.
      const volatile u64* const desc = goep_in_cinput(ctrl, tid);
      const u64 base = peers[tid];
      const u64 oy = desc[0], ow = desc[1];
      s_y[tid] = base + oy;
      s_w[tid] = ow == GOEP_IN_NO_OFFSET ? 0ull : base + ow;
    }
  }
  if (goep_block_any_failed(!ok)) {
    return;
  }

  const u32 rank_mask = (1u << num_ranks) - 1u;
  const u64 row_bytes = (u64)hidden * 2;
  const int cpr = (int)(row_bytes >> 4);  // 16-byte chunks per row
  // Unit counts fit in int32 (the launcher checks T * S).
  const int nunits = num_tokens * num_slices;
  const int nw_total = gridDim.x * nwarps;
  for (int u = blockIdx.x * nwarps + warp; u < nunits; u += nw_total) {
    const int q_t = u / num_slices;
    const i64 t = q_t;
    const int slice = u - q_t * num_slices;
    int pos = -1, row_there = 0;
    if (lane < num_ranks) {
      pos = send_pos[t * num_ranks + lane];
      row_there = s_base[lane] + pos;
    }
    // Source rows (and weight rows), compacted in ascending rank order, in
    // shared memory: registers go to the loads in flight.
    const u32 mask = __ballot_sync(0xffffffffu, pos >= 0) & rank_mask;
    const int nd = __popc(mask);
    __syncwarp();  // the previous unit's readers of my_src / my_wsrc are done
    if (pos >= 0 && lane < num_ranks) {
      const int i = __popc(mask & ((1u << lane) - 1u));
      my_src[i] = s_y[lane] + (u64)row_there * row_bytes;
      my_wsrc[i] = s_w[lane] != 0 ? s_w[lane] + (u64)row_there * (u64)k * 4 : 0ull;
    }
    __syncwarp();
    // Weights first (issued now, summed after the rows): lanes < k of the
    // warp of slice 0.
    const bool do_w = slice == 0 && out_weights != nullptr && lane < k;
    float wv[GOEP_IN_MAX_RANKS];
#pragma unroll
    for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
      wv[i] = 0.0f;
      if (do_w && i < nd) {
        const u64 wb = my_wsrc[i];
        if (wb != 0) {
          wv[i] = goep_in_ld_peer_f32((const float*)wb + lane);
        }
      }
    }
    int c_lo, c_hi;
    goep_in_slice_range(cpr, slice, num_slices, &c_lo, &c_hi);
    u8* const orow = out + t * row_bytes;
    const u8* b0 = bias0 != nullptr ? bias0 + t * row_bytes : nullptr;
    const u8* b1 = bias1 != nullptr ? bias1 + t * row_bytes : nullptr;
    goep_in_combine_slice<GOEP_IN_COMBINE_UNROLL>(my_src, nd, b0, b1, orow, c_lo, c_hi, lane);
    if (do_w) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
        if (i < nd) {
          acc += wv[i];
        }
      }
      out_weights[t * k + lane] = acc;
    }
  }

  // Done reading every peer's input: tell them; block 0 waits until every
  // rank is done with this rank's input.
  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_COMBINE, num_ranks, rank, GOEP_IN_STEPVAL(s_step));
  if (blockIdx.x == 0) {
    if (!goep_in_wait_arrived(peers, off_ctrl, ctrl, GOEP_IN_KIND_COMBINE, num_ranks, rank, e, fp, wd, wait_id,
                              GOEP_IN_STAGE_COMBINE_ARRIVAL)) {
      return;
    }
    if (tid == 0) {
      // Every block of this launch read the epoch before it arrived.
      *goep_in_epoch(ctrl, GOEP_IN_KIND_COMBINE) = e;
    }
  }
}

// ---------------------------------------------------------------------------
// Staging copy for a combine input that lies outside the workspace:
// min(num_rows[0], max_rows) * row_bytes bytes from src to dst (this rank's
// combine input region), sized on the device from the handle's received
// count so that the host needs no count and graphs replay it. 16-byte
// vectors when both pointers and the size allow, else 4-byte words
// (row_bytes % 4 == 0).
extern "C" __global__ void goep_intranode_copy_rows(const u8* src, u8* dst, const i32* num_rows, int max_rows,
                                                    u64 row_bytes) {
  const i32 rows = min(num_rows[0], max_rows);
  const u64 n = (u64)(rows > 0 ? rows : 0) * row_bytes;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if ((((u64)src | (u64)dst | n) & 15ull) == 0) {
    const u64 nv = n >> 4;
    u64 i = first;
    for (; i + 3 * stride < nv; i += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        v[q] = goep_in_ld_nc_v4(src + (i + q * stride) * 16);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        *(uint4*)(dst + (i + q * stride) * 16) = v[q];
      }
    }
    for (; i < nv; i += stride) {
      *(uint4*)(dst + i * 16) = goep_in_ld_nc_v4(src + i * 16);
    }
    return;
  }
  for (u64 i = first; i < (n >> 2); i += stride) {
    ((u32*)dst)[i] = ((const u32*)src)[i];
  }
}
