// layout.cu: the dispatch layout of an MoE routing, in one kernel.
//
// From topk_idx[T, K] (int64 or int32, -1 = no expert; rank of expert e is
// e / (E/R)) it writes
//   tokens_per_rank[R]      int32: tokens with at least one expert on rank r
//   tokens_per_expert[E]    int32: entries equal to e
//   is_token_in_rank[T, R]  uint8: 1 when token t has an expert on rank r
//   *invalid                int32: entries outside [-1, E), which are ignored
// The Go reference is routing.CountLayout (routing/layout.go).
//
// Design (one launch, no memset, graph-safe):
//   - Each thread takes one token per tile; blocks stride over tiles. A thread
//     loads its K ids (8 at a time, all loads issued before any use, so a
//     token costs one memory latency), counts experts in shared memory, and
//     builds the token's rank mask in a u64 (R <= 64). Its is_token_in_rank
//     row is written straight from the mask with 8- or 4-byte stores, so a
//     warp writes one contiguous span.
//   - Rank counts come from warp ballots (one per rank per 32 tokens) into
//     registers: lane r holds ranks r and r+32. This avoids 32-way shared
//     atomic conflicts on the few rank counters.
//   - A single-block grid writes its shared counters straight to the outputs.
//   - With more blocks, each block adds its non-zero counters into the
//     workspace accumulators (fire-and-forget reductions), then takes a ticket.
//     The block that takes the last ticket swaps every accumulator with zero
//     into the outputs and resets the ticket. The workspace is therefore zero
//     before and after every launch: nothing for the host to clear between
//     launches, which keeps the launch graph-capturable. The release/acquire
//     around the ticket is the same pattern cooperative groups use for grid
//     barriers: bar.sync, then one thread fences and does the atomic.
//
// The host picks blocks = min(ceil(T/threads), SMs) and dynamic shared memory
// of 4*(E+R+1) bytes; blockDim.x must be a multiple of 32 (full-warp
// ballots). Limits: R <= 64, E + R + 1 <= workspace accumulators (the host
// sizes the workspace for E <= 4096, R <= 64).
#include "common.cuh"

// Bit i of the low 8 bits of m becomes byte i (value 0 or 1) of the result:
// eight consecutive is_token_in_rank bytes in one little-endian store.
__device__ __forceinline__ u64 goep_layout_spread8(u64 m) {
  u64 x = m & 0xffull;
  x = (x | (x << 28)) & 0x0000000f0000000full;
  x = (x | (x << 14)) & 0x0003000300030003ull;
  x = (x | (x << 7)) & 0x0101010101010101ull;
  return x;
}

// The same for 4 bits into a u32.
__device__ __forceinline__ u32 goep_layout_spread4(u32 m) {
  u32 x = m & 0xfu;
  x = (x | (x << 14)) & 0x00030003u;
  x = (x | (x << 7)) & 0x01010101u;
  return x;
}

template <typename Idx>
__device__ __forceinline__ void goep_layout(const Idx* __restrict__ topk, int num_tokens, int k, int num_experts,
                                            int num_ranks, i32* __restrict__ per_rank, i32* __restrict__ per_expert,
                                            u8* __restrict__ in_rank, i32* invalid, u32* workspace) {
  extern __shared__ i32 s_counts[];  // [num_experts] experts, [num_ranks] ranks, [1] invalid entries
  __shared__ int s_last;
  const int num_counts = num_experts + num_ranks + 1;
  i32* const s_ranks = s_counts + num_experts;
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    s_counts[i] = 0;
  }
  __syncthreads();

  const u32 lane = threadIdx.x & 31u;
  // rank = e / (E/R) as a multiply-high: with d = E/R and m = 2^32/d + 1,
  // (e*m) >> 32 == e/d exactly whenever e*d < 2^32 (here e, d <= 4096), and
  // it costs two instructions instead of a division per entry.
  const u64 rank_magic = (1ull << 32) / (u64)(num_experts / num_ranks) + 1ull;
  // Widest store a row allows: its length and the base alignment decide, and
  // both are the same for every row.
  const int width = (num_ranks % 8 == 0 && ((u64)in_rank & 7ull) == 0)   ? 8
                    : (num_ranks % 4 == 0 && ((u64)in_rank & 3ull) == 0) ? 4
                                                                          : 1;
  i32 rank_lo = 0, rank_hi = 0;  // this lane's share of ranks lane and lane+32
  i32 bad = 0;

  // Every thread of a block runs the same iterations, so warps are converged
  // at the ballots.
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 base = (i64)blockIdx.x * blockDim.x; base < num_tokens; base += stride) {
    const i64 t = base + threadIdx.x;
    u64 mask = 0;
    if (t < num_tokens) {
      const Idx* row = topk + t * k;
      for (int j0 = 0; j0 < k; j0 += 8) {
        i64 e[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          e[c] = (j0 + c < k) ? (i64)__ldg(row + j0 + c) : (i64)-1;
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          if (e[c] >= 0 && e[c] < num_experts) {
            atomicAdd(&s_counts[e[c]], 1);
            mask |= 1ull << (u32)(((u64)e[c] * rank_magic) >> 32);
          } else if (e[c] != -1) {
            ++bad;
          }
        }
      }
      u8* out = in_rank + t * num_ranks;
      if (width == 8) {
        for (int w = 0; w < num_ranks / 8; ++w) {
          reinterpret_cast<u64*>(out)[w] = goep_layout_spread8(mask >> (8 * w));
        }
      } else if (width == 4) {
        for (int w = 0; w < num_ranks / 4; ++w) {
          reinterpret_cast<u32*>(out)[w] = goep_layout_spread4((u32)(mask >> (4 * w)));
        }
      } else {
        for (int r = 0; r < num_ranks; ++r) {
          out[r] = (u8)((mask >> r) & 1ull);
        }
      }
    }
    for (int r = 0; r < num_ranks; ++r) {
      const i32 c = __popc(__ballot_sync(0xffffffffu, (u32)(mask >> r) & 1u));
      if (lane == (u32)(r & 31)) {
        if (r < 32) {
          rank_lo += c;
        } else {
          rank_hi += c;
        }
      }
    }
  }
  if ((int)lane < num_ranks && rank_lo != 0) {
    atomicAdd(&s_ranks[lane], rank_lo);
  }
  if ((int)lane + 32 < num_ranks && rank_hi != 0) {
    atomicAdd(&s_ranks[lane + 32], rank_hi);
  }
  if (bad != 0) {
    atomicAdd(&s_counts[num_counts - 1], bad);
  }
  __syncthreads();

  if (gridDim.x == 1) {
    for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
      const i32 v = s_counts[i];
      if (i < num_experts) {
        per_expert[i] = v;
      } else if (i < num_experts + num_ranks) {
        per_rank[i - num_experts] = v;
      } else if (invalid != nullptr) {
        *invalid = v;
      }
    }
    return;
  }

  u32* const ticket = workspace;
  i32* const acc = reinterpret_cast<i32*>(workspace + 1);
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    const i32 v = s_counts[i];
    if (v != 0) {
      atomicAdd(&acc[i], v);  // result unused: compiles to a reduction
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // release this block's reductions (ordered before by bar.sync)
    const u32 arrived = atomicAdd(ticket, 1u);
    __threadfence();  // acquire the other blocks' reductions before reading totals
    s_last = (arrived == gridDim.x - 1);
  }
  __syncthreads();
  if (!s_last) {
    return;
  }
  for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
    const i32 v = atomicExch(&acc[i], 0);  // read the total and leave zero behind
    if (i < num_experts) {
      per_expert[i] = v;
    } else if (i < num_experts + num_ranks) {
      per_rank[i - num_experts] = v;
    } else if (invalid != nullptr) {
      *invalid = v;
    }
  }
  if (threadIdx.x == 0) {
    atomicExch(ticket, 0u);  // every block has arrived: the next launch starts from zero
  }
}

extern "C" __global__ void goep_layout_i64(const i64* topk, int num_tokens, int k, int num_experts, int num_ranks,
                                           i32* per_rank, i32* per_expert, u8* is_token_in_rank, i32* invalid,
                                           u32* workspace) {
  goep_layout<i64>(topk, num_tokens, k, num_experts, num_ranks, per_rank, per_expert, is_token_in_rank, invalid,
                   workspace);
}

extern "C" __global__ void goep_layout_i32(const i32* topk, int num_tokens, int k, int num_experts, int num_ranks,
                                           i32* per_rank, i32* per_expert, u8* is_token_in_rank, i32* invalid,
                                           u32* workspace) {
  goep_layout<i32>(topk, num_tokens, k, num_experts, num_ranks, per_rank, per_expert, is_token_in_rank, invalid,
                   workspace);
}
