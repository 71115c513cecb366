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
//                        once arrive[kind][src] >= e * GOEP_IN_ARRIVAL_UNIT
//                        for every src.
//   entered[kind][src]   u64, written by rank src (st.release.sys): the epoch
//                        of src's latest launch of that kind. A rank writes
//                        into peer d's receive regions only after d has
//                        entered the same launch, which orders the write after
//                        d's earlier work on its stream (consumers of the
//                        previous recv_x, the previous combine's reduction).
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

#define GOEP_IN_MAX_RANKS 8
#define GOEP_IN_MAX_TOPK 32
#define GOEP_IN_MAX_EXPERTS 4096

// Largest block of each kernel (its __launch_bounds__).
#define GOEP_IN_NOTIFY_MAX_THREADS 1024
#define GOEP_IN_DISPATCH_MAX_THREADS 1024
#define GOEP_IN_COMBINE_MAX_THREADS 512

// Kernel kinds (index of epoch / arrive / entered).
#define GOEP_IN_KIND_NOTIFY 0
#define GOEP_IN_KIND_DISPATCH 1
#define GOEP_IN_KIND_COMBINE 2

// Control block byte offsets. Each kind's arrive and entered arrays have a
// 128-byte line of their own (peers update them over NVLink).
#define GOEP_IN_CTRL_EPOCH 0
#define GOEP_IN_CTRL_ARRIVE 128
#define GOEP_IN_CTRL_ENTERED 512
#define GOEP_IN_CTRL_KIND_STRIDE 128
#define GOEP_IN_CTRL_BYTES 1024

#define GOEP_IN_ARRIVAL_UNIT (1ull << 20)

// Stages named in timeout records.
#define GOEP_IN_STAGE_NOTIFY_BARRIER 1
#define GOEP_IN_STAGE_DISPATCH_ENTRY 2
#define GOEP_IN_STAGE_DISPATCH_ARRIVAL 3
#define GOEP_IN_STAGE_COMBINE_ENTRY 4
#define GOEP_IN_STAGE_COMBINE_ARRIVAL 5

static_assert(GOEP_IN_CTRL_ARRIVE + 3 * GOEP_IN_CTRL_KIND_STRIDE <= GOEP_IN_CTRL_ENTERED, "goep: intranode ctrl");
static_assert(GOEP_IN_CTRL_ENTERED + 3 * GOEP_IN_CTRL_KIND_STRIDE <= GOEP_IN_CTRL_BYTES, "goep: intranode ctrl");
static_assert(GOEP_IN_MAX_RANKS * 8 <= GOEP_IN_CTRL_KIND_STRIDE, "goep: intranode ctrl line");

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

// This block's share of GOEP_IN_ARRIVAL_UNIT.
__device__ __forceinline__ u64 goep_in_block_share() {
  const u64 g = gridDim.x, b = blockIdx.x;
  return ((b + 1ull) * GOEP_IN_ARRIVAL_UNIT) / g - (b * GOEP_IN_ARRIVAL_UNIT) / g;
}

// ---------------------------------------------------------------------------
// Memory operations.

// Reduction (no return value) with release semantics at system scope: the
// peer that acquires the counter sees every write this thread made or
// observed before it.
__device__ __forceinline__ void goep_in_red_add_release_sys_u64(u64* p, u64 v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
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

// 16-byte load cached in L2 only: for data other GPUs wrote during this
// kernel (read after an acquire), which L1 must not serve stale.
__device__ __forceinline__ uint4 goep_in_ld_cg_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
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

// Block 0 announces to every peer that this rank entered epoch e of kind.
__device__ __forceinline__ void goep_in_announce(const u64* peers, u64 off_ctrl, int kind, int num_ranks, int rank,
                                                 u64 e) {
  if (blockIdx.x == 0 && (int)threadIdx.x < num_ranks) {
    u64* peer_ctrl = goep_in_ctrl(peers[threadIdx.x], off_ctrl);
    goep_st_release_sys_u64(goep_in_entered(peer_ctrl, kind, rank), e);
  }
}

// Waits until every peer announced epoch e of kind. Returns false (for the
// whole block) when a wait gave up.
__device__ __forceinline__ bool goep_in_wait_entered(u64* ctrl, int kind, int num_ranks, u64 e, goep_watchdog* wd,
                                                     u32 wait_id, u32 stage) {
  bool ok = true;
  if ((int)threadIdx.x < num_ranks) {
    ok = goep_wait_ge_u64(goep_in_entered(ctrl, kind, threadIdx.x), e, wd, wait_id, threadIdx.x, stage);
  }
  return !goep_block_any_failed(!ok);
}

// After this block's writes into the peers' workspaces: barrier, then one
// thread makes them visible system-wide and adds the block's share to every
// peer's arrive[kind][rank] (release, system scope).
__device__ __forceinline__ void goep_in_arrive_all(const u64* peers, u64 off_ctrl, int kind, int num_ranks, int rank) {
  __syncthreads();
  if (threadIdx.x == 0) {
    goep_fence_acq_rel_sys();
    const u64 share = goep_in_block_share();
    for (int d = 0; d < num_ranks; ++d) {
      goep_in_red_add_release_sys_u64(goep_in_arrive(goep_in_ctrl(peers[d], off_ctrl), kind, rank), share);
    }
  }
}

// Waits until every source's launch of epoch e has fully arrived here.
// Returns false (for the whole block) when a wait gave up.
__device__ __forceinline__ bool goep_in_wait_arrived(u64* ctrl, int kind, int num_ranks, u64 e, goep_watchdog* wd,
                                                     u32 wait_id, u32 stage) {
  bool ok = true;
  if ((int)threadIdx.x < num_ranks) {
    ok = goep_wait_ge_u64(goep_in_arrive(ctrl, kind, threadIdx.x), e * GOEP_IN_ARRIVAL_UNIT, wd, wait_id, threadIdx.x,
                          stage);
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

#endif  // GOEP_INTRANODE_CUH
