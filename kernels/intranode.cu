// intranode.cu: v1 intranode (NVLink) notify, dispatch and combine.
//
// The plain-Go semantics are intranode.ReferenceDispatch / ReferenceCombine;
// the Go twins are in kernels/twins/intranode.go; the launchers (which
// validate every argument before a launch) are in package intranode. The
// workspace ABI (control block, arrival shares, epochs) is described in
// intranode.cuh.
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
// Combine slots of owner s: slot[d][j][H] bf16 and wslot[d][j][K] f32, where
// j = send_pos_s[t][d]: rank d pushes its received rows of source s (one
// contiguous run of recv order) to slot[d][0..n) of s, then s reduces
//   out[t] = bf16_rne(((0 + slot[d0][j0]) + slot[d1][j1] + ...) + bias0 + bias1)
// over d ascending with send_pos[t][d] >= 0, in fp32: the summation order of
// intranode.ReferenceCombine, so results match it bit for bit.
#include "intranode.cuh"

// 16-byte vectors each lane keeps in flight per copy round.
#ifndef GOEP_IN_UNROLL
#define GOEP_IN_UNROLL 4
#endif

// Block-size bounds (GOEP_IN_*_MAX_THREADS, intranode.cuh), given on
// declarations because the definitions keep the plain
// `extern "C" __global__ void name(` form the registry test looks for (a
// definition inherits the bounds of its declaration). They cap registers so
// that the launchers' block sizes always fit, whatever NVRTC version compiles
// this: notify and dispatch up to 1024 threads (64 registers, no spills on
// sm_90 with NVRTC 11.8), combine up to 512.

extern "C" {
__global__ void __launch_bounds__(GOEP_IN_NOTIFY_MAX_THREADS)
    goep_intranode_notify(const u64* peers, u64 off_ctrl, u64 off_counts, u64 off_expert_counts, const i64* topk_idx,
                          int num_tokens, int k, int num_experts, int num_ranks, int rank, int expert_alignment,
                          i32* send_pos, i32* rank_prefix, i32* recv_base, i32* num_recv, i32* mapped_num_recv,
                          i32* expert_counts, i32* invalid, goep_watchdog* wd, u32 wait_id);
__global__ void __launch_bounds__(GOEP_IN_DISPATCH_MAX_THREADS)
    goep_intranode_dispatch(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales, u64 off_recv_src,
                            u64 off_recv_topk, u64 off_recv_weights, const u8* x, const float* scales,
                            const i64* topk_idx, const float* topk_weights, const i32* send_pos, const i32* recv_base,
                            int num_tokens, int k, int num_ranks, int rank, int local_experts, int row_bytes,
                            int num_scales, goep_watchdog* wd, u32 wait_id);
__global__ void __launch_bounds__(GOEP_IN_COMBINE_MAX_THREADS)
    goep_intranode_combine(const u64* peers, u64 off_ctrl, u64 off_slots, u64 off_wslots, u64 slot_rows, const u8* y,
                           const float* weights, const i32* rank_prefix, const i32* send_pos, const u8* bias0,
                           const u8* bias1, u8* out, float* out_weights, int num_tokens, int k, int num_ranks,
                           int rank, int hidden, goep_watchdog* wd, u32 wait_id);
}

__device__ __forceinline__ float goep_in_ld_cg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
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
                                                 goep_watchdog* wd, u32 wait_id) {
  extern __shared__ i32 s_expert[];  // [num_experts]
  __shared__ i32 s_warp[32][GOEP_IN_MAX_RANKS];
  __shared__ i32 s_total[GOEP_IN_MAX_RANKS];
  __shared__ i32 s_matrix[GOEP_IN_MAX_RANKS][GOEP_IN_MAX_RANKS];
  __shared__ i32 s_bad;
  __shared__ u64 s_epoch;

  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  for (int i = tid; i < num_experts; i += nthreads) {
    s_expert[i] = 0;
  }
  if (tid == 0) {
    s_bad = 0;
    s_epoch = goep_in_ld_volatile_u64(goep_in_epoch(ctrl, GOEP_IN_KIND_NOTIFY)) + 1;
  }
  __syncthreads();
  const u64 e = s_epoch;
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
  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_NOTIFY, num_ranks, rank);
  if (!goep_in_wait_arrived(ctrl, GOEP_IN_KIND_NOTIFY, num_ranks, e, wd, wait_id, GOEP_IN_STAGE_NOTIFY_BARRIER)) {
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
// final place in each destination's receive region. Block b takes tokens
// [T*b/G, T*(b+1)/G); warp w of it takes every nwarps-th token from w. A warp
// loads a 16-byte vector per lane GOEP_IN_UNROLL times (non-coherent,
// no-L1 loads of local HBM), then stores those vectors to each destination of
// the token, so a row is read once whatever its fan-out. Row bytes must be a
// multiple of 16 and x, recv_x 16-byte aligned (the launcher checks).
//
// Completion: after its rows every block releases its arrival share to every
// rank; block 0 then waits for all ranks' shares of this epoch (so the kernel
// ends only when this rank's receive region is complete) and advances the
// epoch. x is BF16 or FP8 bytes (row_bytes = 2H or H); scales is null for
// BF16; topk_weights may be null (recv_weights then untouched).
extern "C" __global__ void goep_intranode_dispatch(const u64* peers, u64 off_ctrl, u64 off_recv_x,
                                                   u64 off_recv_scales, u64 off_recv_src, u64 off_recv_topk,
                                                   u64 off_recv_weights, const u8* x, const float* scales,
                                                   const i64* topk_idx, const float* topk_weights,
                                                   const i32* send_pos, const i32* recv_base, int num_tokens, int k,
                                                   int num_ranks, int rank, int local_experts, int row_bytes,
                                                   int num_scales, goep_watchdog* wd, u32 wait_id) {
  __shared__ u64 s_epoch;
  __shared__ u64 s_peers[GOEP_IN_MAX_RANKS];
  __shared__ i32 s_base[GOEP_IN_MAX_RANKS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  if (tid == 0) {
    s_epoch = goep_in_ld_volatile_u64(goep_in_epoch(ctrl, GOEP_IN_KIND_DISPATCH)) + 1;
  }
  if (tid < num_ranks) {
    s_peers[tid] = peers[tid];
    s_base[tid] = recv_base[tid];
  }
  __syncthreads();
  const u64 e = s_epoch;
  goep_in_announce(peers, off_ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank, e);
  if (!goep_in_wait_entered(ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, e, wd, wait_id, GOEP_IN_STAGE_DISPATCH_ENTRY)) {
    return;
  }

  const u32 rank_mask = (1u << num_ranks) - 1u;
  const int nchunks = row_bytes >> 4;
  const i64 t_lo = (i64)num_tokens * blockIdx.x / gridDim.x;
  const i64 t_hi = (i64)num_tokens * (blockIdx.x + 1) / gridDim.x;
  for (i64 t = t_lo + warp; t < t_hi; t += nwarps) {
    int pos = -1, row_here = 0;
    if (lane < num_ranks) {
      pos = send_pos[t * num_ranks + lane];
      row_here = s_base[lane] + pos;
    }
    int dst[GOEP_IN_MAX_RANKS], row[GOEP_IN_MAX_RANKS];
    const int nd = goep_in_gather_dests(pos, row_here, rank_mask, dst, row);
    if (nd == 0) {
      continue;
    }

    // Per-row metadata: source token, local expert ids, weights.
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
      const float v = scales[t * num_scales + c];
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
        if (i < nd) {
          ((float*)(s_peers[dst[i]] + off_recv_scales))[(i64)row[i] * num_scales + c] = v;
        }
      }
    }

    // The row: load once, store to every destination.
    const u8* src = x + t * row_bytes;
    u8* drow[GOEP_IN_MAX_RANKS];
#pragma unroll
    for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
      drow[i] = (u8*)(s_peers[dst[i]] + off_recv_x + (u64)row[i] * (u64)row_bytes);
    }
    for (int c0 = lane; c0 < nchunks; c0 += 32 * GOEP_IN_UNROLL) {
      uint4 v[GOEP_IN_UNROLL];
#pragma unroll
      for (int u = 0; u < GOEP_IN_UNROLL; ++u) {
        const int c = c0 + 32 * u;
        if (c < nchunks) {
          v[u] = goep_in_ld_nc_v4(src + (u64)c * 16);
        }
      }
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
        if (i < nd) {
#pragma unroll
          for (int u = 0; u < GOEP_IN_UNROLL; ++u) {
            const int c = c0 + 32 * u;
            if (c < nchunks) {
              goep_in_st_v4(drow[i] + (u64)c * 16, v[u]);
            }
          }
        }
      }
    }
  }

  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, rank);
  if (blockIdx.x == 0) {
    if (!goep_in_wait_arrived(ctrl, GOEP_IN_KIND_DISPATCH, num_ranks, e, wd, wait_id,
                              GOEP_IN_STAGE_DISPATCH_ARRIVAL)) {
      return;
    }
    if (tid == 0) {
      *goep_in_epoch(ctrl, GOEP_IN_KIND_DISPATCH) = e;
    }
  }
}

// ---------------------------------------------------------------------------
// Combine: push, arrive, wait, reduce, in one kernel.
//
// Push: y's rows are in receive order, so the rows of owner s are the
// contiguous run [rank_prefix[s-1], rank_prefix[s]) and go, as one run, to
// slot[rank][0..n) of s. The whole of y is one flat array of 16-byte chunks
// split evenly over the blocks (each block a contiguous range, threads
// strided in it, GOEP_IN_UNROLL loads in flight); each chunk finds its owner
// from the run boundaries. Weights [N][K] likewise, 4 bytes at a time.
//
// Every block then releases its share to every owner and waits (itself, no
// grid barrier needed) until all ranks' shares of this epoch are here: all
// blocks of one launch must be resident at once, so the grid must not exceed
// what the GPU runs concurrently (the launcher caps it at the SM count).
//
// Reduce: warp per own token (grid-strided), lanes over 16-byte chunks;
// sources in ascending rank order, then bias0, then bias1, fp32, RNE to bf16.
extern "C" __global__ void goep_intranode_combine(const u64* peers, u64 off_ctrl, u64 off_slots, u64 off_wslots,
                                                  u64 slot_rows, const u8* y, const float* weights,
                                                  const i32* rank_prefix, const i32* send_pos, const u8* bias0,
                                                  const u8* bias1, u8* out, float* out_weights, int num_tokens, int k,
                                                  int num_ranks, int rank, int hidden, goep_watchdog* wd,
                                                  u32 wait_id) {
  __shared__ u64 s_epoch;
  __shared__ u64 s_peers[GOEP_IN_MAX_RANKS];
  __shared__ i64 s_lo[GOEP_IN_MAX_RANKS + 1];  // first received row of each source
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  if (tid == 0) {
    s_epoch = goep_in_ld_volatile_u64(goep_in_epoch(ctrl, GOEP_IN_KIND_COMBINE)) + 1;
    s_lo[0] = 0;
  }
  if (tid < num_ranks) {
    s_peers[tid] = peers[tid];
    s_lo[tid + 1] = rank_prefix[tid];
  }
  __syncthreads();
  const u64 e = s_epoch;
  goep_in_announce(peers, off_ctrl, GOEP_IN_KIND_COMBINE, num_ranks, rank, e);
  if (!goep_in_wait_entered(ctrl, GOEP_IN_KIND_COMBINE, num_ranks, e, wd, wait_id, GOEP_IN_STAGE_COMBINE_ENTRY)) {
    return;
  }

  const u64 row_bytes = (u64)hidden * 2;
  const i64 cpr = (i64)(row_bytes >> 4);  // chunks per row
  const i64 n_rows = s_lo[num_ranks];
  {
    const i64 total = n_rows * cpr;
    const i64 g_lo = total * blockIdx.x / gridDim.x, g_hi = total * (blockIdx.x + 1) / gridDim.x;
    const u64 my_slots = (u64)rank * slot_rows * row_bytes;
    for (i64 g0 = g_lo + tid; g0 < g_hi; g0 += (i64)blockDim.x * GOEP_IN_UNROLL) {
      uint4 v[GOEP_IN_UNROLL];
#pragma unroll
      for (int u = 0; u < GOEP_IN_UNROLL; ++u) {
        const i64 g = g0 + (i64)u * blockDim.x;
        if (g < g_hi) {
          v[u] = goep_in_ld_nc_v4(y + g * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < GOEP_IN_UNROLL; ++u) {
        const i64 g = g0 + (i64)u * blockDim.x;
        if (g < g_hi) {
          int s = 0;
          for (int q = 1; q < num_ranks; ++q) {
            if (g >= s_lo[q] * cpr) {
              s = q;
            }
          }
          goep_in_st_v4((u8*)(s_peers[s] + off_slots + my_slots) + (g - s_lo[s] * cpr) * 16, v[u]);
        }
      }
    }
    if (weights != nullptr) {
      const i64 nw = n_rows * k;
      const i64 w_lo = nw * blockIdx.x / gridDim.x, w_hi = nw * (blockIdx.x + 1) / gridDim.x;
      const u64 my_wslots = (u64)rank * slot_rows * (u64)k * 4;
      for (i64 f = w_lo + tid; f < w_hi; f += blockDim.x) {
        int s = 0;
        for (int q = 1; q < num_ranks; ++q) {
          if (f >= s_lo[q] * k) {
            s = q;
          }
        }
        ((float*)(s_peers[s] + off_wslots + my_wslots))[f - s_lo[s] * k] = weights[f];
      }
    }
  }

  goep_in_arrive_all(peers, off_ctrl, GOEP_IN_KIND_COMBINE, num_ranks, rank);
  if (!goep_in_wait_arrived(ctrl, GOEP_IN_KIND_COMBINE, num_ranks, e, wd, wait_id, GOEP_IN_STAGE_COMBINE_ARRIVAL)) {
    return;
  }
  if (blockIdx.x == 0 && tid == 0) {
    // Every block of this launch read the epoch before it arrived.
    *goep_in_epoch(ctrl, GOEP_IN_KIND_COMBINE) = e;
  }

  const u32 rank_mask = (1u << num_ranks) - 1u;
  const u64 own = s_peers[rank];
  const i64 nw_total = (i64)gridDim.x * nwarps;
  for (i64 t = (i64)blockIdx.x * nwarps + warp; t < num_tokens; t += nw_total) {
    int pos = -1;
    if (lane < num_ranks) {
      pos = send_pos[t * num_ranks + lane];
    }
    int dst[GOEP_IN_MAX_RANKS], slot[GOEP_IN_MAX_RANKS];
    const int nd = goep_in_gather_dests(pos, pos, rank_mask, dst, slot);
    const u8* srow[GOEP_IN_MAX_RANKS];
#pragma unroll
    for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
      srow[i] = (const u8*)(own + off_slots) + ((u64)dst[i] * slot_rows + (u64)slot[i]) * row_bytes;
    }
    const u8* b0 = bias0 != nullptr ? bias0 + t * row_bytes : nullptr;
    const u8* b1 = bias1 != nullptr ? bias1 + t * row_bytes : nullptr;
    u8* orow = out + t * row_bytes;
    // One 16-byte chunk per lane per round: every source's chunk (and the
    // biases') is loaded before the first add, so up to 10 loads are in
    // flight per lane; the adds then run in the reference's order.
    for (i64 c = lane; c < cpr; c += 32) {
      uint4 v[GOEP_IN_MAX_RANKS + 2];
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
        if (i < nd) {
          v[i] = goep_in_ld_cg_v4(srow[i] + c * 16);
        }
      }
      if (b0 != nullptr) {
        v[GOEP_IN_MAX_RANKS] = goep_in_ld_nc_v4(b0 + c * 16);
      }
      if (b1 != nullptr) {
        v[GOEP_IN_MAX_RANKS + 1] = goep_in_ld_nc_v4(b1 + c * 16);
      }
      float acc[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        acc[q] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS + 2; ++i) {
        const bool use = i < GOEP_IN_MAX_RANKS ? i < nd : (i == GOEP_IN_MAX_RANKS ? b0 != nullptr : b1 != nullptr);
        if (use) {
          const u32 wv[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            acc[2 * q] += goep_u32_as_f32(wv[q] << 16);
            acc[2 * q + 1] += goep_u32_as_f32(wv[q] & 0xffff0000u);
          }
        }
      }
      u32 wv[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        wv[q] = (u32)goep_f32_to_bf16_bits(acc[2 * q]) | ((u32)goep_f32_to_bf16_bits(acc[2 * q + 1]) << 16);
      }
      *(uint4*)(orow + c * 16) = make_uint4(wv[0], wv[1], wv[2], wv[3]);
    }
    if (out_weights != nullptr && lane < k) {
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < GOEP_IN_MAX_RANKS; ++i) {
        if (i < nd) {
          const float* ws = (const float*)(own + off_wslots);
          a += goep_in_ld_cg_f32(ws + ((u64)dst[i] * slot_rows + (u64)slot[i]) * (u64)k + lane);
        }
      }
      out_weights[t * k + lane] = a;
    }
  }
}
