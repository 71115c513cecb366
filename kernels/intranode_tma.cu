// intranode_tma.cu: dispatch through Hopper's bulk-copy engine (TMA).
//
// Same semantics, protocol, work split and parameters as
// goep_intranode_dispatch (intranode.cu), plus piece_bytes and stages. Its
// own module, so that a toolchain that rejects the bulk-copy PTX costs only
// this variant (the launcher reports the compile error for it alone).
//
// With GOEP_ENABLE_TMA (NVRTC >= 12, sm_90+): each warp owns `stages`
// shared-memory buffers of piece_bytes (dynamic shared memory: warps *
// stages * piece_bytes) and an mbarrier per buffer. Lane 0 streams the
// warp's row slices through them in pieces: a bulk load global -> shared
// (cp.async.bulk ... mbarrier::complete_tx) runs stages - 1 pieces ahead;
// once a piece has landed, one bulk store shared -> global per destination
// rank (cp.async.bulk.global.shared::cta.bulk_group, to peer memory over
// NVLink) and a commit; a buffer is refilled only after the stores that read
// it have read it (cp.async.bulk.wait_group.read 1). The other lanes write
// the per-row metadata with plain stores, as in the plain kernel. At the
// end lane 0 waits for its bulk stores to complete (wait_group 0) and
// fences the async proxy against the generic one before the block's arrival
// release, so the peers see the rows once they see the arrival.
//
// Without it (NVRTC 11.x, the CI build) the kernel runs the plain body.
#include "intranode.cuh"

extern "C" {
__global__ void __launch_bounds__(GOEP_IN_DISPATCH_TMA_MAX_THREADS)
    goep_intranode_dispatch_tma(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales,
                                u64 off_recv_src, u64 off_recv_topk, u64 off_recv_weights, const u8* x,
                                const float* scales, const i64* topk_idx, const float* topk_weights,
                                const i32* send_pos, const i32* recv_base, int num_tokens, int k, int num_ranks,
                                int rank, int local_experts, int row_bytes, int num_scales, int num_slices,
                                int skip_entry, int piece_bytes, int stages, goep_watchdog* wd, u32 wait_id,
                                i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape);
}

#if GOEP_ENABLE_TMA

__device__ __forceinline__ u32 goep_tma_smem(const void* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void goep_tma_mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(bar), "r"(count) : "memory");
}
// Makes the initialised mbarriers visible to the async proxy.
__device__ __forceinline__ void goep_tma_fence_init() {
  asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}
__device__ __forceinline__ void goep_tma_mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool goep_tma_mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Bulk load of bytes (multiple of 16, 16-byte aligned) global -> shared,
// completing on bar.
__device__ __forceinline__ void goep_tma_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :
               : "r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Bulk store of bytes shared -> global (a peer's memory), in the current
// bulk group.
__device__ __forceinline__ void goep_tma_store(void* dst, u32 src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :
               : "l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void goep_tma_commit() { asm volatile("cp.async.bulk.commit_group;" : : : "memory"); }
// Every bulk group but the newest has finished reading its shared memory.
__device__ __forceinline__ void goep_tma_wait_read_all_but_one() {
  asm volatile("cp.async.bulk.wait_group.read 1;" : : : "memory");
}
// Every bulk group has completed (its writes performed).
__device__ __forceinline__ void goep_tma_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" : : : "memory"); }
// Orders this thread's async-proxy global accesses with its generic-proxy
// ones (both ways).
__device__ __forceinline__ void goep_tma_fence_proxy_global() {
  asm volatile("fence.proxy.async.global;" : : : "memory");
}

// Lane 0's read-ahead cursor over the warp's pieces: unit u (block-local),
// byte range [off, end) of its slice still to load.
struct goep_tma_cursor {
  int u;
  u32 off, end;
};

__device__ __forceinline__ void goep_tma_cursor_seek(goep_tma_cursor& c, int nunits, int num_slices, int nchunks,
                                                     int nwarps) {
  // Skip units whose slice is empty (not produced by the launcher's S, kept
  // for safety); both cursors see the same sequence of pieces.
  while (c.u < nunits) {
    const int slice = c.u % num_slices;
    int lo, hi;
    goep_in_slice_range(nchunks, slice, num_slices, &lo, &hi);
    if (hi > lo) {
      c.off = (u32)lo * 16u;
      c.end = (u32)hi * 16u;
      return;
    }
    c.u += nwarps;
  }
}

#endif  // GOEP_ENABLE_TMA

extern "C" __global__ void goep_intranode_dispatch_tma(const u64* peers, u64 off_ctrl, u64 off_recv_x,
                                                       u64 off_recv_scales, u64 off_recv_src, u64 off_recv_topk,
                                                       u64 off_recv_weights, const u8* x, const float* scales,
                                                       const i64* topk_idx, const float* topk_weights,
                                                       const i32* send_pos, const i32* recv_base, int num_tokens,
                                                       int k, int num_ranks, int rank, int local_experts,
                                                       int row_bytes, int num_scales, int num_slices, int skip_entry,
                                                       int piece_bytes, int stages, goep_watchdog* wd, u32 wait_id,
                                                       i64 scale_token_stride, i64 scale_hidden_stride, u64 fp_shape) {
#if GOEP_ENABLE_TMA
  __shared__ u64 s_epoch;
  __shared__ u64 s_fp;
  __shared__ u64 s_step;
  __shared__ u64 s_peers[GOEP_IN_MAX_RANKS];
  __shared__ i32 s_base[GOEP_IN_MAX_RANKS];
  __shared__ u64 s_drow[GOEP_IN_DISPATCH_TMA_MAX_THREADS / 32][GOEP_IN_MAX_RANKS];
  __shared__ u64 s_mbar[GOEP_IN_DISPATCH_TMA_MAX_THREADS / 32][GOEP_IN_TMA_MAX_STAGES];
  extern __shared__ uint4 goep_in_tma_buf[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  u64* const ctrl = goep_in_ctrl(peers[rank], off_ctrl);
  if (tid == 0) {
    GOEP_IN_BEGIN(ctrl, GOEP_IN_KIND_DISPATCH, rank, fp_shape, s_epoch, s_fp, s_step);
  }
  if (tid < num_ranks) {
    s_peers[tid] = peers[tid];
    s_base[tid] = recv_base[tid];
  }
  const int ns_max = stages;  // 2..GOEP_IN_TMA_MAX_STAGES (the launcher checks)
  const u32 piece = (u32)piece_bytes;
  const u32 buf = goep_tma_smem((const u8*)goep_in_tma_buf + (u64)warp * ns_max * piece);
  const u32 bar = goep_tma_smem(&s_mbar[warp][0]);
  if (lane == 0) {
    for (int s = 0; s < ns_max; ++s) {
      goep_tma_mbar_init(bar + 8u * s, 1);
    }
    goep_tma_fence_init();
    // x was written through the generic proxy (earlier kernels, copies).
    goep_tma_fence_proxy_global();
  }
  __syncthreads();
  const u64 e = s_epoch;
  if (GOEP_IN_FPVAL(s_fp) == 0) {  // an earlier launch of this rank failed
    return;
  }
  if (!goep_in_dispatch_enter(peers, off_ctrl, ctrl, num_ranks, rank, e, GOEP_IN_FPVAL(s_fp), skip_entry, wd,
                              wait_id)) {
    return;
  }

  const u32 rank_mask = (1u << num_ranks) - 1u;
  const int nchunks = row_bytes >> 4;
  const int t_lo = (int)((i64)num_tokens * blockIdx.x / gridDim.x);
  const int t_hi = (int)((i64)num_tokens * (blockIdx.x + 1) / gridDim.x);
  const int nunits = (t_hi - t_lo) * num_slices;
  u64* const my_drow = s_drow[warp];

  // Lane 0: the read-ahead, stages - 1 pieces deep.
  goep_tma_cursor cur;
  u32 loaded = 0, stored = 0;  // pieces issued / consumed by this warp
  auto issue = [&]() {
    if (cur.u >= nunits) {
      return;
    }
    const i64 t = t_lo + cur.u / num_slices;
    const u32 bytes = min(piece, cur.end - cur.off);
    const u32 s = loaded % (u32)ns_max;
    goep_tma_mbar_expect_tx(bar + 8u * s, bytes);
    goep_tma_load(buf + s * piece, x + t * row_bytes + cur.off, bytes, bar + 8u * s);
    ++loaded;
    cur.off += bytes;
    if (cur.off >= cur.end) {
      cur.u += nwarps;
      goep_tma_cursor_seek(cur, nunits, num_slices, nchunks, nwarps);
    }
  };
  if (lane == 0) {
    cur.u = warp;
    cur.off = cur.end = 0;
    goep_tma_cursor_seek(cur, nunits, num_slices, nchunks, nwarps);
    for (int j = 0; j < ns_max - 1; ++j) {
      issue();
    }
  }

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
    __syncwarp();  // lane 0 finished the previous unit's stores (addresses were taken)
    if (pos >= 0 && lane < num_ranks) {
      my_drow[__popc(mask & ((1u << lane) - 1u))] = s_peers[lane] + off_recv_x + (u64)row_here * (u64)row_bytes;
    }
    if (slice == 0 && nd > 0) {
      int dst[GOEP_IN_MAX_RANKS], row[GOEP_IN_MAX_RANKS];
      goep_in_gather_dests(pos, row_here, rank_mask, dst, row);
      goep_in_dispatch_meta(s_peers, off_recv_scales, off_recv_src, off_recv_topk, off_recv_weights, scales,
                            topk_idx, topk_weights, t, k, local_experts, num_scales, scale_token_stride,
                            scale_hidden_stride, nd, dst, row, lane);
    }
    __syncwarp();
    if (lane == 0) {
      int c_lo, c_hi;
      goep_in_slice_range(nchunks, slice, num_slices, &c_lo, &c_hi);
      // Every piece of the slice was loaded (or is loading), whether or not
      // the token goes anywhere: consume it in order.
      for (u32 off = (u32)c_lo * 16u; off < (u32)c_hi * 16u; off += piece) {
        const u32 bytes = min(piece, (u32)c_hi * 16u - off);
        const u32 s = stored % (u32)ns_max;
        while (!goep_tma_mbar_try_wait(bar + 8u * s, (stored / (u32)ns_max) & 1u)) {
        }
        for (int i = 0; i < nd; ++i) {
          goep_tma_store((void*)(my_drow[i] + off), buf + s * piece, bytes);
        }
        goep_tma_commit();
        ++stored;
        // The next read-ahead refills the buffer of the previous piece:
        // every group but this one's must have read its buffer.
        if (cur.u < nunits) {
          goep_tma_wait_read_all_but_one();
          issue();
        }
      }
    }
  }
  if (lane == 0) {
    // This warp's rows are in the peers' memory, visible to this thread;
    // then to every thread and peer that synchronises with the block's
    // arrival (its barrier and thread 0's fence + reductions follow).
    goep_tma_wait_all();
    goep_tma_fence_proxy_global();
    goep_fence_acq_rel_sys();
  }

  goep_in_dispatch_finish(peers, off_ctrl, ctrl, num_ranks, rank, e, GOEP_IN_FPVAL(*(volatile u64*)&s_fp),
                          GOEP_IN_STEPVAL(*(volatile u64*)&s_step), wd, wait_id);
#else
  (void)piece_bytes;
  (void)stages;
  GOEP_IN_DISPATCH_KERNEL_BODY(GOEP_IN_UNROLL, false, GOEP_IN_DISPATCH_TMA_MAX_THREADS)
#endif
}
