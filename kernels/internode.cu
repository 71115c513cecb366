// internode.cu: internode (network between nodes, NVLink inside) kernels.
//
// The plain-Go semantics are internode.ReferenceLayout / ReferenceDispatch;
// the Go twins (the host backend's path and the reference for the
// protocol) are internode/notify.go, dispatch.go and combine.go; the
// launcher, which validates every argument before a launch, is in package
// internode; the protocol is internode/DESIGN.md ("GPU protocol").
//
// Notify's memory (byte offsets, computed here from the shape exactly as
// internode.Shape's rdmaRecv / rdmaSend / nvlRecv do; B = P + 1 + P*LE):
//   RDMA buffer (reached across nodes only by port channels):
//     u64 net counters [N]                 counter a: blocks landed from node a
//     i32 recv [2][N][B]                   parity, source node, count block
//     i32 send [2][N][B]                   parity, destination node, count block
//   NVLink workspace (mapped by the node's ranks):
//     u64 counters [P]                     counter f: blocks from forwarder f
//     i32 recv [2][P][N][1 + LE]           parity, forwarder, source node
//
// Out (int32, this rank's, read by the host after the launch): status (1,
// written last when every wait succeeded; cleared before each launch), invalid,
// tokens per rank [W], per node [N], per expert [E], received per source
// rank [W], relay per source node [N], relay per (source node, local
// target) [N*P], per local expert (aligned) [LE], inclusive rank prefix [W].
#include "channel_device.cuh"

#define GOEP_INN_NOTIFY_MAX_THREADS 1024
// Groups of eight elements a lane per step of combine's final reduce: 3
// and 4 spilled at 128 registers (ptxas -v, session 12).
#define GOEP_INN_FINAL_GROUPS 2
// The same when reducing by units, where the sums run inside the combine
// kernel's other loops (2 spilled there; the sums overlap the network).
#define GOEP_INN_UNIT_GROUPS 1

// The dispatch and combine kernels' largest block (internode's
// maxThreads), declared with one block an SM: 128 registers a thread,
// where a bound of 1024 (or 512 alone: ptxas then aims at two blocks)
// capped them at 64 and both spilled (their row copies and reduces keep
// several loads in flight a lane; session 12, ptxas -v).
#define GOEP_INN_MAX_THREADS 512

// Device epochs (u64 [4] in the launcher's scratch, zero at setup): notify
// rounds, dispatch rounds and combine rounds this rank finished, and its
// dispatch and combine kernels finished (steps). Each launch reads its
// round there (the one finished + 1) instead of taking it as an argument,
// and its last block advances it after every block has read it: a CUDA
// graph replaying the same launches runs new rounds. Stream order makes
// one launch's advance visible to the next.
#define GOEP_INN_EPOCH_NOTIFY 0
#define GOEP_INN_EPOCH_DISPATCH 1
#define GOEP_INN_EPOCH_COMBINE 2
#define GOEP_INN_EPOCH_STEPS 3

// Stages of the waits (internode's stageNotify* constants).
#define GOEP_INN_STAGE_NOTIFY_NET 40
#define GOEP_INN_STAGE_NOTIFY_NVL 41
#define GOEP_INN_STAGE_NOTIFY_PUT 42

// Reduction with relaxed semantics at system scope; after a
// fence.acq_rel.sys of the same thread it is a release pattern.
__device__ __forceinline__ void goep_inn_red_add_relaxed_sys_u64(u64* p, u64 v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

struct goep_inn_notify_shape {
  int nodes, p, le, node, local;
  __device__ __forceinline__ int blk() const { return p + 1 + p * le; }
  __device__ __forceinline__ u64 rdma_recv(int par, int a) const {
    return 8ull * nodes + ((u64)(par * nodes + a) * blk()) * 4ull;
  }
  __device__ __forceinline__ u64 rdma_send(int par, int n) const {
    return 8ull * nodes + ((u64)((2 + par) * nodes + n) * blk()) * 4ull;
  }
  __device__ __forceinline__ u64 nvl_recv(int par, int f, int a) const {
    return 8ull * p + ((u64)((par * p + f) * nodes + a) * (1 + le)) * 4ull;
  }
};

extern "C" {
__global__ void __launch_bounds__(GOEP_INN_NOTIFY_MAX_THREADS)
    goep_internode_notify(const i64* ids, int num_tokens, int k, int num_experts, int nodes, int p, int node,
                          int local, u64* epochs, int alignment, u8* rdma, u8* nvl, const u64* peer_nvl,
                          const goep_port_channel* ports, goep_watchdog* wd, const u32* wait_ids, i32* out,
                          i32* dev_num_recv, i32* dev_prefix, i32* dev_experts, i32* host_invalid,
                          i32* host_experts, i32* host_recv);
}

// Notify round e (see internode/notify.go for the same steps in Go). One
// block; every thread takes part in every step, threads below N or P do
// the per-peer work.
extern "C" __global__ void goep_internode_notify(const i64* ids, int num_tokens, int k, int num_experts, int nodes,
                                                 int p, int node, int local, u64* epochs, int alignment, u8* rdma,
                                                 u8* nvl, const u64* peer_nvl, const goep_port_channel* ports,
                                                 goep_watchdog* wd, const u32* wait_ids, i32* out,
                                                 i32* dev_num_recv, i32* dev_prefix, i32* dev_experts,
                                                 i32* host_invalid, i32* host_experts, i32* host_recv) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int w = nodes * p, le = num_experts / w;
  const goep_inn_notify_shape s{nodes, p, le, node, local};
  // This round's number comes from the device (graph replays are new
  // rounds): every thread reads it here, thread 0 advances it last.
  const u64 round = epochs[GOEP_INN_EPOCH_NOTIFY] + 1;
  const int blk = s.blk(), par = (int)(round & 1);
  i32* status = out;
  i32* invalid = out + 1;
  i32* per_rank = out + 2;
  i32* per_node = per_rank + w;
  i32* per_expert = per_node + nodes;
  i32* from_rank = per_expert + num_experts;
  i32* relay = from_rank + w;
  i32* relay_targets = relay + nodes;
  i32* local_expert = relay_targets + nodes * p;
  i32* rank_prefix = local_expert + le;

  // 1. Layout: zero the counts, then one thread per token counts each rank
  // and node once (an earlier id of the token on the same rank or node
  // already counted it) and every valid expert.
  for (int j = tid; j < 2 + w + nodes + num_experts; j += nt) {
    out[j] = 0;
  }
  __syncthreads();
  for (int t = tid; t < num_tokens; t += nt) {
    const i64* row = ids + (i64)t * k;
    for (int j = 0; j < k; ++j) {
      const i64 x = row[j];
      if (x < 0 || x >= num_experts) {
        if (x != -1) {
          atomicAdd(invalid, 1);
        }
        continue;
      }
      const int r = (int)(x / le), n = r / p;
      bool seen_rank = false, seen_node = false;
      for (int q = 0; q < j; ++q) {
        const i64 y = row[q];
        if (y < 0 || y >= num_experts) {
          continue;
        }
        const int ry = (int)(y / le);
        seen_rank |= ry == r;
        seen_node |= ry / p == n;
      }
      atomicAdd(per_expert + x, 1);
      if (!seen_rank) {
        atomicAdd(per_rank + r, 1);
      }
      if (!seen_node) {
        atomicAdd(per_node + n, 1);
      }
    }
  }
  __syncthreads();

  // 2. Stage one block per node (the own node's straight into the own
  // receive block), then push a put and an atomic add per other node, one
  // thread per channel: the FIFO push fences, so the block's staging
  // (ordered by the barrier) is what the put moves, and the transport
  // applies the add after the put.
  for (int j = tid; j < nodes * blk; j += nt) {
    const int n = j / blk, q = j % blk;
    const i32 v = q < p ? per_rank[n * p + q] : q == p ? per_node[n] : per_expert[n * p * le + (q - p - 1)];
    ((i32*)(rdma + s.rdma_send(par, n)))[q] = v;
    if (n == node) {
      ((i32*)(rdma + s.rdma_recv(par, node)))[q] = v;
    }
  }
  __syncthreads();
  bool ok = true;
  if (tid < nodes) {
    if (tid == node) {
      // Read back by this block only, after the barrier below; a relaxed
      // add keeps the counter's meaning (blocks landed) uniform.
      goep_inn_red_add_relaxed_sys_u64((u64*)rdma + node, 1);
    } else {
      const goep_port_channel& ch = ports[tid];
      ok = goep_pc_put(ch, s.rdma_recv(par, node), s.rdma_send(par, tid), 4ull * blk, GOEP_INN_STAGE_NOTIFY_PUT) &&
           goep_pc_atomic_add(ch, 8ull * node, 1, GOEP_INN_STAGE_NOTIFY_PUT);
    }
  }
  if (goep_block_any_failed(!ok)) {
    return;
  }

  // 3. As forwarder: wait for every source node's block, then hand each
  // local rank l, per source node, the count for l and l's per-expert
  // counts, and release-add l's counter for this forwarder.
  if (tid < nodes) {
    ok = goep_wait_ge_u64((const u64*)rdma + tid, round, wd, wait_ids[tid], (u32)(tid * p + local),
                          GOEP_INN_STAGE_NOTIFY_NET);
  }
  if (goep_block_any_failed(!ok)) {
    return;
  }
  const int fw = 1 + le;
  for (int j = tid; j < p * nodes * fw; j += nt) {
    const int l = j / (nodes * fw), a = j / fw % nodes, q = j % fw;
    const i32* rb = (const i32*)(rdma + s.rdma_recv(par, a));
    i32* dst = (i32*)((u8*)peer_nvl[l] + s.nvl_recv(par, local, a));
    dst[q] = q == 0 ? rb[l] : rb[p + 1 + l * le + (q - 1)];
  }
  for (int j = tid; j < nodes * p; j += nt) {
    const i32* rb = (const i32*)(rdma + s.rdma_recv(par, j / p));
    relay_targets[j] = rb[j % p];
    if (j % p == 0) {
      relay[j / p] = rb[p];
    }
  }
  __syncthreads();
  if (tid == 0) {
    goep_fence_acq_rel_sys();
    for (int l = 0; l < p; ++l) {
      goep_inn_red_add_relaxed_sys_u64((u64*)peer_nvl[l] + local, 1);
    }
  }

  // 4. As receiver: wait for every forwarder of the node, then read.
  if (tid < p) {
    ok = goep_wait_ge_u64((const u64*)nvl + tid, round, wd, wait_ids[nodes + tid], (u32)(node * p + tid),
                          GOEP_INN_STAGE_NOTIFY_NVL);
  }
  if (goep_block_any_failed(!ok)) {
    return;
  }
  for (int j = tid; j < p * nodes; j += nt) {
    const int f = j / nodes, a = j % nodes;
    from_rank[a * p + f] = *(const i32*)(nvl + s.nvl_recv(par, f, a));
  }
  for (int x = tid; x < le; x += nt) {
    i32 sum = 0;
    for (int f = 0; f < p; ++f) {
      for (int a = 0; a < nodes; ++a) {
        sum += ((const i32*)(nvl + s.nvl_recv(par, f, a)))[1 + x];
      }
    }
    if (alignment > 1) {
      sum = (i32)(((i64)sum + alignment - 1) / alignment * alignment);
    }
    local_expert[x] = sum;
  }
  __syncthreads();
  if (tid == 0) {
    // The host refuses a total above int32 from its own int64 sum of
    // from_rank; the prefix here wraps like it would.
    u32 acc = 0;
    for (int r = 0; r < w; ++r) {
      acc += (u32)from_rank[r];
      rank_prefix[r] = (i32)acc;
    }
  }
  __syncthreads();
  // The device-pointer form's copies (each optional): the caller's rank
  // prefix, per-expert counts and received count on the device, and in
  // host-mapped memory the invalid ids, per-expert counts and, last after
  // a system fence, the received count the host polls for.
  for (int r = tid; r < w; r += nt) {
    if (dev_prefix) {
      dev_prefix[r] = rank_prefix[r];
    }
  }
  for (int x = tid; x < le; x += nt) {
    if (dev_experts) {
      dev_experts[x] = local_expert[x];
    }
    if (host_experts) {
      ((volatile i32*)host_experts)[x] = local_expert[x];
    }
  }
  __syncthreads();
  if (tid == 0) {
    if (dev_num_recv) {
      *dev_num_recv = rank_prefix[w - 1];
    }
    if (host_invalid) {
      *(volatile i32*)host_invalid = *invalid;
    }
    __threadfence_system();
    if (host_recv) {
      *(volatile i32*)host_recv = rank_prefix[w - 1];
    }
    epochs[GOEP_INN_EPOCH_NOTIFY] = round;
    *(volatile i32*)status = 1;
  }
}

// ---------------------------------------------------------------------------
// Dispatch (see internode/dispatch.go for the same steps in Go). Every row
// is 4-byte aligned (x is 2H or H + 4H/128 bytes, H a multiple of 8 or
// 128), so rows move as 32-bit words and int64 ids as two words.
//
// Relay row: x [xb], ids i64 [K], weights f32 [K], source token i32,
// target mask u32, slot per target local rank i32 [P]. Receive row: x
// [xb], local ids i64 [K], weights f32 [K], source rank i32, source token
// i32.
// The regions' offsets, written by the host at setup (internode's
// dispatchLayout; xb is the round's x bytes, written before each launch).
struct goep_inn_dispatch_layout {
  u64 net_counters, relay;  // RDMA buffer
  u64 send;                 // send memory (below)
  u64 nvl_counters, ready, bases, recv;  // NVLink workspace
  i32 relay_row, recv_row, max_tokens, xb;
  u64 comb_counters, comb_recv;  // RDMA buffer (combine)
  u64 comb_send;                 // send memory (combine)
  u64 comb_ready;                           // NVLink workspace (combine)
  // put_bytes: each block cuts its run of rows to a node into puts of
  // about this many bytes, pushed as each piece is packed (dispatch) or
  // reduced (combine); <= 0: one put per node and block
  // (goep_inn_piece_len).
  i32 partial_row, put_bytes;
  u64 done_net;  // RDMA buffer: u64 [N], steps finished by forwarder (n, local)
  u64 done_nvl;  // NVLink workspace: u64 [P], steps finished by local rank l
  // The send memory: the rows packed for other nodes (send, comb_send),
  // the source of every network put, memory send_id of the proxy. Device
  // memory, or pinned host memory (NotifyConfig.SendMemory) that the TCP
  // transport sends from without a copy engine: the FIFO push fences
  // system-wide, so the rows a put moves are visible to the host first.
  u8* send_base;
  // flags: GOEP_INN_FLAG_*.
  u32 send_id, flags;
  // RDMA buffer: u64 [N][GOEP_INN_MAX_UNITS], dispatch's landed units
  // (goep_inn_unit_word) when GOEP_INN_FLAG_UNITS is set.
  u64 unit_words;
  // With GOEP_INN_FLAG_UNITS: the fewest relay rows of a source at a node
  // that go by units (goep_inn_by_units).
  u32 unit_min_rows;
  // put_groups: where each block puts once per node (put_bytes <= 0), the
  // dispatch's sender blocks (and the combine's reducer blocks) put their
  // rows at each node in this many puts, consecutive blocks in a group:
  // the last of a group to finish puts the group's run, and in the
  // dispatch a group is one unit (goep_inn_put_groups). <= 0: a put per
  // block.
  i32 put_groups;
  // RDMA buffer: u64 [N][GOEP_INN_MAX_CUNITS], the combine's landed units
  // of partials from each node (goep_inn_unit_word) when
  // GOEP_INN_FLAG_COMB_UNITS is set, then their claim counters u32
  // [N][GOEP_INN_MAX_CUNITS] and done bits u32 [N][GOEP_INN_MAX_CUNITS / 32]
  // (0 between rounds).
  u64 comb_unit_words;
};
static_assert(sizeof(goep_inn_dispatch_layout) == 168, "goep: goep_inn_dispatch_layout layout");

// Dispatch forwards by units (NotifyConfig.Forward = ForwardBlocks): every
// sender block tells each node, right after its last put there, which run
// of relay rows it sent (one word per source node and sender block, stored
// over the port channel that carried the rows), and forwarders forward
// each block's rows as soon as its word lands. Unset, the last sender
// block adds one counter per node after every block's puts, and the
// forwarders start on a source node's rows only once all have landed.
#define GOEP_INN_FLAG_UNITS 1u
// The combine reduces by units (NotifyConfig.ReduceByUnits): every put of
// partials to another node is followed, on the same channel, by a word
// naming its rows (goep_inn_unit_word: the forwarder's unit count, rows
// [lo, hi)), and the source's final reduce sums each token as soon as
// every node's partial of it is in (a pending count per token), while the
// network still carries the rest, instead of after the last partial
// landed. Every rank sets it or none (NewNotify checks).
#define GOEP_INN_FLAG_COMB_UNITS 2u
// With it, a unit is a forwarder block's whole run of rows to a node (one
// word after its last piece there: fewer words, later units) instead of
// each put: the fallback when the puts would overflow a unit table, set
// by tests (internode's combUnitsPerBlock) to run it.
#define GOEP_INN_FLAG_COMB_BLOCKS 4u
// Units a combine unit table holds per node: a forwarder's puts of
// partials to one source node (at most 4095, the word's 12-bit count;
// past that each block's pieces are one unit).
#define GOEP_INN_MAX_CUNITS 4096

// Whether a source's rows at a node (rows of them) go by units: the sender
// decides from its count of rows to the node, the forwarder from its relay
// count of the source, the same number (notify's), so both always agree.
// Below unit_min_rows a call's few rows do not pay for the words
// (ForwardAuto; measured in session 19).
__device__ __forceinline__ bool goep_inn_by_units(const goep_inn_dispatch_layout& dl, i64 rows) {
  return (dl.flags & GOEP_INN_FLAG_UNITS) != 0 && rows >= (i64)dl.unit_min_rows;
}
// Sender blocks a unit table holds per source node (internode's
// maxBlocks: a launch has at most this many blocks).
#define GOEP_INN_MAX_UNITS 1024
// A landed unit's word: the sender's block count (12 bits, so a forwarder
// learns from word 0 how many words to wait for) and the block's run
// [lo, hi) of relay rows at this node (25 bits each: rows are at most
// MaxTokens = 2^24). Never 0, which means "not landed": the grid's last
// block clears the words it read before the step ends (goep_inn_finish),
// so the next round's store lands on 0.
__device__ __forceinline__ u64 goep_inn_unit_word(int blocks, int lo, int hi) {
  return (u64)blocks << 50 | (u64)lo << 25 | (u64)hi;
}
__device__ __forceinline__ int goep_inn_unit_blocks(u64 v) { return (int)(v >> 50 & 0xfffu); }
__device__ __forceinline__ int goep_inn_unit_lo(u64 v) { return (int)(v >> 25 & 0x1ffffffu); }
__device__ __forceinline__ int goep_inn_unit_hi(u64 v) { return (int)(v & 0x1ffffffu); }

// The claim counters of the unit words (GOEP_INN_FLAG_UNITS): u32
// [N][GOEP_INN_MAX_UNITS] right after the words, rows of each unit that this
// rank's forwarder blocks claimed so far (0 between rounds).
__device__ __forceinline__ u32* goep_inn_unit_claims(u8* rdma, const goep_inn_dispatch_layout& dl, int nodes) {
  return (u32*)(rdma + dl.unit_words + 8ull * (u64)nodes * GOEP_INN_MAX_UNITS);
}
// Then u32 [N][GOEP_INN_MAX_UNITS / 32]: a bit per unit whose rows are all
// claimed (0 between rounds).
__device__ __forceinline__ u32* goep_inn_unit_done(u8* rdma, const goep_inn_dispatch_layout& dl, int nodes) {
  return goep_inn_unit_claims(rdma, dl, nodes) + (u64)nodes * GOEP_INN_MAX_UNITS;
}

#define GOEP_INN_STAGE_DISPATCH_NET 50
#define GOEP_INN_STAGE_DISPATCH_READY 51
#define GOEP_INN_STAGE_DISPATCH_NVL 52
#define GOEP_INN_STAGE_DISPATCH_PUT 53
#define GOEP_INN_STAGE_DISPATCH_DONE 54

// Dispatch's and combine's words in out: status (1 when every wait
// succeeded), bad (a relayed row whose place lies outside
// the receive region, or more relayed rows than the region holds: the row
// is skipped and the host reports it), then four arrival counters of the
// grid's blocks (u32: senders, forwarders' first half, all blocks,
// forwarders' second half), then the dispatch's put groups' arrival
// counters (u32 [GOEP_INN_MAX_GROUPS]). The launcher clears these
// GOEP_INN_OUT_WORDS in stream order before each launch, so a kernel that
// gives up leaves the status clear and the next launch starts its counters
// from 0. After them, never cleared (written before they are read in
// every launch): each put group's first row and end row at every node
// (i32 [2][GOEP_INN_MAX_GROUPS][GOEP_INN_MAX_NODES]).
#define GOEP_INN_MAX_GROUPS 64
#define GOEP_INN_OUT_WORDS (6 + GOEP_INN_MAX_GROUPS)

// Multi-block kernels. Every block of a launch takes every role in turn
// (sender, forwarder, receiver) on its share of the rows; no block ever
// waits for another block of its own grid, only for other ranks (their
// blocks must be co-resident with ours: the launcher keeps the grid within
// the spin budget of ranks sharing a GPU). Where a step must follow all of
// the grid's blocks (a counter a peer waits on, the status word), the
// blocks arrive on a counter and the last to arrive does it:
// goep_inn_arrive (expected: how many blocks arrive there) returns true in exactly one block, after a system fence
// pair that makes every block's earlier writes visible before the last
// block's next write (release by each arriving thread 0, acquire by the
// last one).
__device__ __forceinline__ bool goep_inn_arrive(u32* ctr, int* flag, u32 expected) {
  __syncthreads();
  if (threadIdx.x == 0) {
    goep_fence_acq_rel_sys();
    const u32 old = atomicAdd(ctr, 1u);
    *flag = old == expected - 1 ? 1 : 0;
    if (*flag) {
      goep_fence_acq_rel_sys();
    }
  }
  __syncthreads();
  return *flag != 0;
}

// Copies bytes (a multiple of 4) with one warp, 16 bytes a lane where both
// ends and the size allow it (rows are 16-aligned; FP8 rows of H + H/32
// bytes and callers' tensors may not be).
__device__ __forceinline__ void goep_inn_warp_copy(void* dst, const void* src, u64 bytes, int lane) {
  if ((((u64)dst | (u64)src | bytes) & 15) == 0) {
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    const u64 n = bytes / 16;
    u64 q = lane;
    // Eight loads in flight per lane before their stores (then four, then
    // one for the tail): the compiler may not move a load above a store
    // that could alias it, so the plain loop waits out one load's latency
    // per 512 bytes a warp. Eight against four: EP2 dispatch over the port
    // at 4096 tokens 459 -> 438-441 us (2 H200s, session 20).
    for (; q + 224 < n; q += 256) {
      uint4 v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[i] = s[q + 32 * i];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        d[q + 32 * i] = v[i];
      }
    }
    for (; q + 96 < n; q += 128) {
      const uint4 a = s[q], b = s[q + 32], c = s[q + 64], e = s[q + 96];
      d[q] = a;
      d[q + 32] = b;
      d[q + 64] = c;
      d[q + 96] = e;
    }
    for (; q < n; q += 32) {
      d[q] = s[q];
    }
  } else {
    u32* d = (u32*)dst;
    const u32* s = (const u32*)src;
    for (u64 q = lane; q < bytes / 4; q += 32) {
      d[q] = s[q];
    }
  }
}

// Eight BF16 values at p (a multiple of 8 elements into a row) as floats:
// one 16-byte load where p is 16-aligned.
__device__ __forceinline__ void goep_inn_ld8_bf16(const u16* p, float* f) {
  if (((u64)p & 15) == 0) {
    const uint4 v = *(const uint4*)p;
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = goep_bf16_bits_to_f32((u16)(w[e] & 0xffffu));
      f[2 * e + 1] = goep_bf16_bits_to_f32((u16)(w[e] >> 16));
    }
  } else {
    for (int e = 0; e < 8; ++e) {
      f[e] = goep_bf16_bits_to_f32(p[e]);
    }
  }
}

// Rounds eight floats to BF16 (RNE) and stores them at p.
__device__ __forceinline__ void goep_inn_st8_bf16(u16* p, const float* f) {
  if (((u64)p & 15) == 0) {
    u32 w[4];
    for (int e = 0; e < 4; ++e) {
      w[e] = (u32)goep_f32_to_bf16_bits(f[2 * e]) | (u32)goep_f32_to_bf16_bits(f[2 * e + 1]) << 16;
    }
    *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    for (int e = 0; e < 8; ++e) {
      p[e] = goep_f32_to_bf16_bits(f[e]);
    }
  }
}

// Eight BF16 values (16 bytes) at p as they are in memory: one 16-byte
// load where p is 16-aligned, else eight 2-byte loads.
__device__ __forceinline__ uint4 goep_inn_ld16(const u16* p) {
  if (((u64)p & 15) == 0) {
    return *(const uint4*)p;
  }
  u32 w[4];
  for (int e = 0; e < 4; ++e) {
    w[e] = (u32)p[2 * e] | (u32)p[2 * e + 1] << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// acc[e] += the eight BF16 values packed in v (element order).
__device__ __forceinline__ void goep_inn_add8_bf16(float* acc, const uint4& v) {
  const u32 w[4] = {v.x, v.y, v.z, v.w};
  for (int e = 0; e < 4; ++e) {
    acc[2 * e] += goep_bf16_bits_to_f32((u16)(w[e] & 0xffffu));
    acc[2 * e + 1] += goep_bf16_bits_to_f32((u16)(w[e] >> 16));
  }
}

// Stores eight floats at p: as fp32 (two 16-byte stores; p 16-aligned) or
// rounded to BF16.
__device__ __forceinline__ void goep_inn_st8(u8* p, bool fp32, const float* f) {
  if (fp32) {
    uint4* d = (uint4*)p;
    d[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    d[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]), __float_as_uint(f[7]));
  } else {
    goep_inn_st8_bf16((u16*)p, f);
  }
}

// The forwarders' reduce of one relayed token (a warp): the partial row pr
// (fp32 or BF16 x [h]) is the sum of the NT target rows t (BF16 x [h]),
// each element from +0 in the order of t. Every load of a step (NT rows,
// G groups of eight elements a lane, 256 elements apart) is issued before
// its additions and stores: the rows are mostly other GPUs' (NVLink
// latency), and a loop that waited out one load at a time ran at about a
// fifth of a copy's rate (session 12's kernel trace). NT and G are
// constants so the row pointers and loads stay in registers.
template <int NT, int G>
__device__ __forceinline__ void goep_inn_reduce_rows(const u8* const* trow, u8* pr, bool fp32, int h, int lane) {
  const u16* t[NT];
#pragma unroll
  for (int r = 0; r < NT; ++r) {
    t[r] = (const u16*)trow[r];
  }
#pragma unroll 1
  for (int q0 = lane * 8; q0 < h; q0 += G * 256) {
    uint4 raw[NT][G];
#pragma unroll
    for (int r = 0; r < NT; ++r) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (q0 + 256 * g < h) {
          raw[r][g] = goep_inn_ld16(t[r] + q0 + 256 * g);
        }
      }
    }
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[g][e] = 0.f;
      }
    }
#pragma unroll
    for (int r = 0; r < NT; ++r) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (q0 + 256 * g < h) {
          goep_inn_add8_bf16(acc[g], raw[r][g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int q = q0 + 256 * g;
      if (q < h) {
        goep_inn_st8(pr + (u64)q * (fp32 ? 4 : 2), fp32, acc[g]);
      }
    }
  }
}

// The same for any n target rows (1..GOEP_INN_MAX_P): two groups a step,
// the rows four at a time (a batch's loads before its additions).
__device__ __forceinline__ void goep_inn_reduce_batched(int n, const u8* const* trow, u8* pr, bool fp32, int h,
                                                        int lane) {
#pragma unroll 1
  for (int q0 = lane * 8; q0 < h; q0 += 2 * 256) {
    float acc[2][8];
#pragma unroll
    for (int g = 0; g < 2; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[g][e] = 0.f;
      }
    }
    for (int r0 = 0; r0 < n; r0 += 4) {
      uint4 raw[4][2];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          if (r0 + r < n && q0 + 256 * g < h) {
            raw[r][g] = goep_inn_ld16((const u16*)trow[r0 + r] + q0 + 256 * g);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          if (r0 + r < n && q0 + 256 * g < h) {
            goep_inn_add8_bf16(acc[g], raw[r][g]);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int q = q0 + 256 * g;
      if (q < h) {
        goep_inn_st8(pr + (u64)q * (fp32 ? 4 : 2), fp32, acc[g]);
      }
    }
  }
}

// The forwarders' reduce of n target rows: four groups a step for one row
// (its only loads), batches of four rows of two groups beyond. Eight
// constant instances inlined into the kernel spilled (session 12, ptxas
// -v), and so did a third for two rows; these two do not.
__device__ __forceinline__ void goep_inn_reduce_any(int n, const u8* const* trow, u8* pr, bool fp32, int h,
                                                    int lane) {
  if (n == 1) {
    goep_inn_reduce_rows<1, 4>(trow, pr, fp32, h, lane);

  } else {
    goep_inn_reduce_batched(n, trow, pr, fp32, h, lane);
  }
}

// Most pieces a block cuts its run to one node into (dispatch keeps each
// piece's first row per node in shared memory).
#define GOEP_INN_MAX_PIECES 16

// Items (tokens in dispatch, rows in combine) per put when a block's run
// of n items, each at most row_bytes to a node, is cut into puts of about
// put_bytes: all n (one put, the earlier behaviour) when put_bytes <= 0,
// else at least one item and at most GOEP_INN_MAX_PIECES pieces. A piece
// is put as soon as it is written, so the transport copies and sends it
// while the block writes the next one instead of waiting for the whole
// run (the network leg then starts about a run's packing time earlier).
__device__ __forceinline__ int goep_inn_piece_len(int n, int put_bytes, u64 row_bytes) {
  if (n <= 0) {
    return 1;
  }
  if (put_bytes <= 0) {
    return n;
  }
  const u64 want = (u64)put_bytes / (row_bytes > 0 ? row_bytes : 1ull);
  const int least = (n + GOEP_INN_MAX_PIECES - 1) / GOEP_INN_MAX_PIECES;
  const int len = want < (u64)n ? (int)want : n;
  return len > least ? len : least;
}

// A block's run of n items in pieces of len (goep_inn_piece_len), count
// in all (0 for an empty run). A short lead piece (an eighth, so the first
// put would leave sooner) was measured and dropped (session 11: the first
// put did not leave earlier, and the extra put per block cost 170 us on
// the 128-token combine).
struct goep_inn_pieces {
  int len, count;
  // The first item of piece pc (pc == count: at or past the run's end).
  __device__ __forceinline__ int start(int pc) const { return pc * len; }
  // The piece whose first item is i, or -1.
  __device__ __forceinline__ int index_of(int i) const { return i % len == 0 ? i / len : -1; }
};

__device__ __forceinline__ goep_inn_pieces goep_inn_plan_pieces(int n, int put_bytes, u64 row_bytes) {
  goep_inn_pieces pl;
  pl.len = goep_inn_piece_len(n, put_bytes, row_bytes);
  pl.count = n <= 0 ? 0 : (n + pl.len - 1) / pl.len;
  return pl;
}

// A token chunk of block b of g over n items: [lo, hi).
__device__ __forceinline__ void goep_inn_chunk(int n, int b, int g, int& lo, int& hi) {
  const int per = (n + g - 1) / g;
  lo = min(n, b * per);
  hi = min(n, lo + per);
}

// Dispatch put groups (goep_inn_dispatch_layout.put_groups): sender blocks
// [first, first + members) put their rows at each node as one, since their
// runs of rows there are consecutive (rows follow token order and the
// chunks are consecutive). Every put over the port over CUDA IPC costs the
// copy engine about 3 us beside its bytes, whatever stream it is on
// (TestCopyEngineLab, session 21), so fewer, larger puts move the same
// rows sooner. want groups of s_cnt blocks, at most slots (arrival
// counters); only where each block puts once per node (put_bytes <= 0:
// decided from the layout, never from a block's own piece count, which is
// 0 for an empty chunk, so that every block of the grid agrees). Size 1
// is a put per block (count = s_cnt, idx = s_idx). The combine's reducer
// blocks put their partial rows in groups too (their runs are consecutive
// chunks as well).
struct goep_inn_put_groups {
  int size, count, idx, first, members;
  __device__ goep_inn_put_groups(int want, int put_bytes, int s_idx, int s_cnt, int slots) {
    size = 1;
    if (want > 0 && put_bytes <= 0) {
      const int groups = min(want, max(slots, 1));
      size = max((s_cnt + groups - 1) / groups, 1);
    }
    count = (s_cnt + size - 1) / size;
    idx = s_idx / size;
    first = idx * size;
    members = min(s_cnt, first + size) - first;
  }
  __device__ bool grouped() const { return size > 1; }
};

// A block's roles in a dispatch or combine launch. Shared (split_s = 0):
// every block takes every role in turn, on its share (index blk of g).
// Split (split_s, split_f > 0, the rest receivers): blocks [0, S) send,
// [S, S + F) forward, [S + F, G) receive, each role on its own blocks, so
// that the roles overlap (forwarders copy rows as soon as they land while
// senders still pack). Combine: the senders and forwarders reduce and
// send partials (S + F blocks), the receivers sum them.
struct goep_inn_roles {
  bool send, fwd, recv;
  int s_idx, s_cnt, f_idx, f_cnt, r_idx, r_cnt;
  __device__ __forceinline__ goep_inn_roles(int blk, int g, int split_s, int split_f) {
    if (split_s <= 0 || split_f <= 0 || split_s + split_f >= g) {
      send = fwd = recv = true;
      s_idx = f_idx = r_idx = blk;
      s_cnt = f_cnt = r_cnt = g;
    } else {
      send = blk < split_s;
      fwd = blk >= split_s && blk < split_s + split_f;
      recv = blk >= split_s + split_f;
      s_idx = blk;
      s_cnt = split_s;
      f_idx = blk - split_s;
      f_cnt = split_f;
      r_idx = blk - split_s - split_f;
      r_cnt = g - split_s - split_f;
    }
  }
};

// Tells the ranks this step's regions touch that this rank finished one
// more dispatch or combine kernel: every local rank over NVLink (after a
// system fence: a release) and forwarder (n, local) of every other node
// with a port-channel atomic add. A dispatch with no notify round before
// it (cached) waits on these before it overwrites relay and receive rows
// that a peer's earlier step may still read. The last block calls it.
__device__ __forceinline__ bool goep_inn_step_done(const goep_inn_dispatch_layout& dl, int nodes, int p, int node,
                                                   int local, const u64* peer_nvl, const goep_port_channel* ports,
                                                   u32 stage) {
  bool ok = true;
  if (threadIdx.x == 0) {
    goep_fence_acq_rel_sys();
    for (int l = 0; l < p; ++l) {
      goep_inn_red_add_relaxed_sys_u64((u64*)((u8*)peer_nvl[l] + dl.done_nvl) + local, 1);
    }
  }
  for (int n = threadIdx.x; n < nodes; n += blockDim.x) {
    if (n != node) {
      ok &= goep_pc_atomic_add(ports[n], dl.done_net + 8ull * node, 1, stage);
    }
  }
  return ok;
}

// The last block of a step's senders tells every node that this rank's
// puts of the round are out: its own node's counter directly, the other
// nodes' counterparts by a port-channel atomicAdd on the channel that
// carried the puts (so the count never overtakes the rows). Every thread of
// the block calls it; false when an atomicAdd could not be queued.
__device__ __forceinline__ bool goep_inn_count_to_nodes(u8* rdma, u64 counters, int node, int nodes,
                                                        const goep_port_channel* ports, u32 stage) {
  bool ok = true;
  for (int n = threadIdx.x; n < nodes; n += blockDim.x) {
    if (n == node) {
      goep_inn_red_add_relaxed_sys_u64((u64*)(rdma + counters) + node, 1);
    } else {
      ok &= goep_pc_atomic_add(ports[n], counters + 8ull * node, 1, stage);
    }
  }
  return ok;
}

// Ends a dispatch or combine launch: the last block to arrive clears the
// unit words the dispatch read (units: the RDMA buffer, nullptr
// otherwise), tells the peers the step is done (goep_inn_step_done),
// advances the device round counters (every block read them at its start
// and has arrived since) and writes status 1. Every thread of every block
// calls it, last.
__device__ __forceinline__ void goep_inn_finish(u32* arrive, int* last, u32 blocks, const goep_inn_dispatch_layout& dl,
                                                int nodes, int p, int node, int local, const u64* peer_nvl,
                                                const goep_port_channel* ports, u32 stage, u64* epochs, int epoch,
                                                u64 round, u64 steps, i32* out, u8* units = nullptr) {
  if (!goep_inn_arrive(arrive, last, blocks)) {
    return;
  }
  if (units != nullptr) {
    // Every block has read its words (each node's word 0 says how many
    // units it sent; 0 where none came), with their claim counters and
    // done bits. The next round's stores come only after this step is
    // done (a notify round, or a cached dispatch's wait for it), so they
    // land on 0. The dispatch's table (forwarding by units) or the
    // combine's (reducing by units).
    const bool comb = epoch == GOEP_INN_EPOCH_COMBINE;
    const int cap = comb ? GOEP_INN_MAX_CUNITS : GOEP_INN_MAX_UNITS;
    u64* words = (u64*)(units + (comb ? dl.comb_unit_words : dl.unit_words));
    u32* claims = (u32*)(words + (u64)nodes * cap);
    u32* dones = claims + (u64)nodes * cap;
    for (int src = 0; src < nodes; ++src) {
      u64* ws = words + (u64)src * cap;
      u32* cs = claims + (u64)src * cap;
      const int sent = goep_inn_unit_blocks(*(volatile const u64*)ws);
      __syncthreads();
      u32* ds = dones + (u64)src * (cap / 32);
      for (int b = threadIdx.x; b < sent; b += blockDim.x) {
        ws[b] = 0;
        cs[b] = 0;
        if ((b & 31) == 0) {
          ds[b >> 5] = 0;
        }
      }
    }
    __syncthreads();
  }
  if (goep_block_any_failed(!goep_inn_step_done(dl, nodes, p, node, local, peer_nvl, ports, stage))) {
    return;
  }
  if (threadIdx.x == 0) {
    epochs[epoch] = round;
    epochs[GOEP_INN_EPOCH_STEPS] = steps + 1;
    __threadfence_system();
    *(volatile i32*)out = 1;
  }
}

// The phase trace, for measurement only (internode.ParseKernelTrace; the
// same scheme as the low-latency kernels'). Kernels compiled with
// -DGOEP_INN_TRACE=1 (internal/kernelflags: $GOEP_INN_TRACE, `ep-bench
// internode --trace-kernels`) stamp %globaltimer at their phase points into
// a region after the row scratch: u64 [kernel: dispatch, combine]
// [GOEP_INN_TRACE_BLOCKS][GOEP_INN_TRACE_SLOTS], slot 0 the tag (round:
// bits 0-47, kernel + 1: 56-59, bit 63 set), slots 1.. the events' stamps
// (0: not reached). Thread 0 stamps, after the barrier that ends the phase
// where there is one; the put events are stamped by the thread that pushed
// the put. The default build compiles none of it (the region stays zero).
#ifndef GOEP_INN_TRACE
#define GOEP_INN_TRACE 0
#endif
#define GOEP_INN_TRACE_BLOCKS 256
#define GOEP_INN_TRACE_SLOTS 16
// Dispatch events (internode.DispatchTraceEvents).
#define GOEP_INN_EV_D_ENTRY 0
#define GOEP_INN_EV_D_SEND_GATE 1
#define GOEP_INN_EV_D_PREFIX 2
#define GOEP_INN_EV_D_PACKED 3
#define GOEP_INN_EV_D_FIRST_PUT 4
#define GOEP_INN_EV_D_LAST_PUT 5
#define GOEP_INN_EV_D_SENT 6
#define GOEP_INN_EV_D_FWD_READY 7
#define GOEP_INN_EV_D_FWD_OWN 8
#define GOEP_INN_EV_D_NET_LANDED 9
#define GOEP_INN_EV_D_FWD_DONE 10
#define GOEP_INN_EV_D_RECV_GATE 11
#define GOEP_INN_EV_D_EXIT 12
// Combine events (internode.CombineTraceEvents).
#define GOEP_INN_EV_C_ENTRY 0
#define GOEP_INN_EV_C_COPIED 1
#define GOEP_INN_EV_C_READY 2
#define GOEP_INN_EV_C_FIRST_PUT 3
#define GOEP_INN_EV_C_LAST_PUT 4
#define GOEP_INN_EV_C_REDUCED 5
#define GOEP_INN_EV_C_NET_LANDED 6
#define GOEP_INN_EV_C_EXIT 7

// The trace region: after the row scratch (i32 [max_tokens][nodes]),
// 16-aligned (internode's traceOffset).
__device__ __forceinline__ u64* goep_inn_trace_region(const i32* scratch, int max_tokens, int nodes) {
  return (u64*)((u8*)scratch + ((4ull * (u64)max_tokens * (u64)nodes + 15ull) & ~15ull));
}

// The combine's token map (GOEP_INN_FLAG_COMB_UNITS), after the trace
// region (internode's tokenMapOffset): i32 [N][max_tokens], the source
// token of this rank's row j at node n (the inverse of the row scratch,
// written by the dispatch beside it), then u32 [max_tokens], each token's
// partials in so far (goep_inn_contribute; 0 between rounds).
#define GOEP_INN_TRACE_BYTES (2ull * GOEP_INN_TRACE_BLOCKS * GOEP_INN_TRACE_SLOTS * 8ull)
__device__ __forceinline__ i32* goep_inn_token_of(const i32* scratch, int max_tokens, int nodes) {
  return (i32*)((u8*)goep_inn_trace_region(scratch, max_tokens, nodes) + GOEP_INN_TRACE_BYTES);
}
__device__ __forceinline__ u32* goep_inn_pending(const i32* scratch, int max_tokens, int nodes) {
  return (u32*)(goep_inn_token_of(scratch, max_tokens, nodes) + (u64)nodes * max_tokens);
}

#if GOEP_INN_TRACE
// This block's record of kernel (0 dispatch, 1 combine), cleared and
// stamped with entry (taken at the kernel's start); nullptr for blocks at or
// above GOEP_INN_TRACE_BLOCKS.
__device__ __forceinline__ u64* goep_inn_tr_open(const i32* scratch, int max_tokens, int nodes, int kernel, u64 round,
                                                 u64 t0) {
  if (blockIdx.x >= GOEP_INN_TRACE_BLOCKS) {
    return nullptr;
  }
  u64* tr = goep_inn_trace_region(scratch, max_tokens, nodes) +
            ((u64)kernel * GOEP_INN_TRACE_BLOCKS + blockIdx.x) * GOEP_INN_TRACE_SLOTS;
  if (threadIdx.x == 0) {
    for (int i = 2; i < GOEP_INN_TRACE_SLOTS; ++i) {
      tr[i] = 0;
    }
    tr[0] = (round & 0xffffffffffffull) | ((u64)(kernel + 1) << 56) | (1ull << 63);
    tr[1] = t0;
  }
  return tr;
}
#define GOEP_INN_TR_INIT(kernel, round)                                                                     \
  u64 tr_t0 = 0;                                                                                              \
  if (threadIdx.x == 0) {                                                                                     \
    tr_t0 = goep_globaltimer();                                                                               \
  }                                                                                                           \
  u64* const tr = goep_inn_tr_open(scratch, dl.max_tokens, nodes, (kernel), (round), tr_t0)
// Thread 0 stamps ev.
#define GOEP_INN_TR(ev)                         \
  if (tr != nullptr && threadIdx.x == 0) {      \
    tr[1 + (ev)] = goep_globaltimer();          \
  }
// The calling thread stamps ev (a put's pusher); _FIRST only where ev is
// not stamped yet.
#define GOEP_INN_TR_THIS(ev)           \
  if (tr != nullptr) {                 \
    tr[1 + (ev)] = goep_globaltimer(); \
  }
#define GOEP_INN_TR_FIRST(ev)                         \
  if (tr != nullptr && tr[1 + (ev)] == 0) {           \
    tr[1 + (ev)] = goep_globaltimer();                \
  }
#else
#define GOEP_INN_TR_INIT(kernel, round)
#define GOEP_INN_TR(ev)
#define GOEP_INN_TR_THIS(ev)
#define GOEP_INN_TR_FIRST(ev)
#endif

// Largest ranks per node the dispatch kernel's shared tables hold (the
// target masks are 8 bits).
#define GOEP_INN_MAX_P 8
// The receive rows of source rank s: [rank_prefix[s - 1], rank_prefix[s])
// (an inclusive prefix over source ranks), clamped to [0, n).
__device__ __forceinline__ void goep_inn_source_rows(const i32* rank_prefix, int s, i64 n, i64& lo, i64& hi) {
  lo = s > 0 ? rank_prefix[s - 1] : 0;
  hi = rank_prefix[s];
  lo = lo < 0 ? 0 : (lo > n ? n : lo);
  hi = hi < lo ? lo : (hi > n ? n : hi);
}

// Token t's targets at node n: bit l where one of its k experts lives on
// local rank l there (an id out of range names no rank). Unrolled so that
// the token's loads are in flight together.
__device__ __forceinline__ u32 goep_inn_node_mask(const i64* ids, int t, int k, int num_experts, int le, int p,
                                                  int n) {
  u32 mask = 0;
#pragma unroll 8
  for (int j = 0; j < k; ++j) {
    const i64 e = ids[(i64)t * k + j];
    if (e >= 0 && e < num_experts) {
      const int r = (int)(e / le);
      if (r / p == n) {
        mask |= 1u << (r % p);
      }
    }
  }
  return mask;
}

// Writes the x part of a relay or receive row (BF16 x, or FP8 x then fp32
// scales as words) to row r of the caller's dispatch outputs (a warp).
__device__ __forceinline__ void goep_inn_out_x(const u32* row, i64 r, int h, int fp8, u8* out_x, float* out_scales,
                                               int lane) {
  if (fp8) {
    goep_inn_warp_copy(out_x + (u64)r * h, row, (u64)h, lane);
    for (int q = lane; q < h / 128; q += 32) {
      out_scales[r * (h / 128) + q] = __uint_as_float(row[h / 4 + q]);
    }
  } else {
    goep_inn_warp_copy(out_x + (u64)r * 2 * h, row, 2ull * h, lane);
  }
}
// The same from the caller's tensors, token t's row (BF16 x, or FP8 x and
// its scales at element strides): the own node's relay rows carry no
// payload (the dispatch's pack), so its forwarders copy it from here.
__device__ __forceinline__ void goep_inn_out_x_from(const u8* x, const float* scales, i64 st0, i64 st1, int t, i64 r,
                                                    int h, int fp8, u8* out_x, float* out_scales, int lane) {
  if (fp8) {
    goep_inn_warp_copy(out_x + (u64)r * h, x + (u64)t * h, (u64)h, lane);
    for (int q = lane; q < h / 128; q += 32) {
      out_scales[r * (h / 128) + q] = scales[(i64)t * st0 + (i64)q * st1];
    }
  } else {
    goep_inn_warp_copy(out_x + (u64)r * 2 * h, x + (u64)t * 2 * h, 2ull * h, lane);
  }
}

// Token t's payload from the caller's tensors into a row of the relay
// layout (x, then FP8 scales as words after it).
__device__ __forceinline__ void goep_inn_row_from(u32* row, const u8* x, const float* scales, i64 st0, i64 st1, int t,
                                                  int h, int fp8, int lane) {
  if (fp8) {
    goep_inn_warp_copy(row, x + (u64)t * h, (u64)h, lane);
    for (int q = lane; q < h / 128; q += 32) {
      row[h / 4 + q] = __float_as_uint(scales[(i64)t * st0 + (i64)q * st1]);
    }
  } else {
    goep_inn_warp_copy(row, x + (u64)t * 2 * h, 2ull * h, lane);
  }
}
#define GOEP_INN_MAX_NODES 64

// Thread 0 of a forwarder block: the source's sender blocks S, from the
// first of its unit words to land. Every word names S and every source has
// a word 0, so polling words [0, guess) (guess: this rank's own sender
// blocks; ranks normally launch the same grid) ends. False when the wait
// gave up.
__device__ __forceinline__ bool goep_inn_unit_senders(const u64* words, int guess, goep_watchdog* wd, u32 id, u32 peer,
                                                      u32 stage, int& senders) {
  const int n = min(max(guess, 1), GOEP_INN_MAX_UNITS);
  goep_spin sp = goep_spin_start();
  for (;;) {
    for (int u = 0; u < n; ++u) {
      const u64 v = goep_chan_ld_relaxed_sys_u64(words + u);
      if (v != 0) {
        senders = goep_inn_unit_blocks(v);
        return true;
      }
    }
    if (!goep_spin_ok(sp, wd, GOEP_OP_VALUE, id, peer, stage, 1, 0)) {
      return false;
    }
  }
}

// A landed unit's row count, 0 for a word that cannot be one of the
// source's senders units within its rows relay rows (the caller flags it).
__device__ __forceinline__ int goep_inn_unit_rows(u64 v, int senders, int rows) {
  const int lo = goep_inn_unit_lo(v), hi = goep_inn_unit_hi(v);
  return lo <= hi && hi <= rows && goep_inn_unit_blocks(v) == senders ? hi - lo : 0;
}

// Warp 0 of a forwarder block (every lane): the next claim on a source's
// landed units. The lanes look at 32 units at once, from unit at on, for
// the first whose rows are not all claimed yet (done: a bit per unit, set
// by the block that claims its last rows) and whose word has landed; lane
// 0 claims the next chunk of its rows with an atomic add on its counter.
// b receives the unit (-1 once every unit's rows are claimed), c the first
// claimed row (from the unit's lo), v its word. Spins under the watchdog
// while none of the units left has landed; false when the wait gave up.
__device__ __forceinline__ bool goep_inn_claim(const u64* words, u32* claims, u32* done, int senders, int rows,
                                               int at, int chunk, goep_watchdog* wd, u32 id, u32 peer, u32 stage,
                                               int lane, int& b, int& c, u64& v) {
  goep_spin sp = goep_spin_start();
  for (;;) {
    bool left = false;
    for (int base = 0; base < senders; base += 32) {
      const int k = base + lane;
      int u = at + k;
      u = u >= senders ? u - senders : u;
      const bool open = k < senders && (goep_ld_relaxed_sys_u32(done + (u >> 5)) >> (u & 31) & 1u) == 0;
      const bool landed = open && goep_chan_ld_relaxed_sys_u64(words + u) != 0;
      left |= __any_sync(0xffffffffu, open);
      const u32 ready = __ballot_sync(0xffffffffu, landed);
      if (ready != 0) {
        b = __shfl_sync(0xffffffffu, u, __ffs(ready) - 1);
        if (lane == 0) {
          v = goep_ld_acquire_sys_u64(words + b);
          c = (int)atomicAdd(claims + b, (u32)chunk);
          if (c + chunk >= goep_inn_unit_rows(v, senders, rows)) {
            atomicOr(done + (b >> 5), 1u << (b & 31));
          }
        }
        c = __shfl_sync(0xffffffffu, c, 0);
        v = __shfl_sync(0xffffffffu, v, 0);
        return true;
      }
    }
    if (!left) {
      b = -1;
      return true;
    }
    int go = 1;
    if (lane == 0) {
      go = goep_spin_ok(sp, wd, GOEP_OP_VALUE, id, peer, stage, 1, 0) ? 1 : 0;
    }
    if (__shfl_sync(0xffffffffu, go, 0) == 0) {
      return false;
    }
  }
}

// A block's next claim on a node's landed units: warp 0 claims
// (goep_inn_claim) and broadcasts through the block's shared slots, which
// alternate with turn (so warp 0 never overwrites one a warp may still
// read). Every thread calls it; false (in every thread) when the wait gave
// up (or ok, the caller's state, is false in some thread). Else ub is the
// unit (-1 once every unit's rows are claimed) and
// [first, end) the claimed rows; a word that is no unit of this source
// flags out[1].
__device__ __forceinline__ bool goep_inn_claim_block(const u64* words, u32* claims, u32* done, int units, int rows,
                                                     int at, int chunk, goep_watchdog* wd, u32 id, u32 peer,
                                                     u32 stage, u64* slot_word, int* slot_idx, int* slot_claim,
                                                     int& turn, bool ok, i32* out, int& ub, int& first, int& end) {
  const int lane = threadIdx.x & 31;
  if ((threadIdx.x >> 5) == 0) {
    int b = -1, c = 0;
    u64 v = 0;
    ok = goep_inn_claim(words, claims, done, units, rows, at, chunk, wd, id, peer, stage, lane, b, c, v) && ok;
    if (lane == 0) {
      slot_word[turn & 1] = v;
      slot_idx[turn & 1] = b;
      slot_claim[turn & 1] = c;
    }
  }
  if (goep_block_any_failed(!ok)) {
    return false;
  }
  const u64 v = slot_word[turn & 1];
  const int c = slot_claim[turn & 1];
  ub = slot_idx[turn & 1];
  ++turn;
  if (ub < 0) {
    return true;
  }
  const int n = goep_inn_unit_rows(v, units, rows), lo = goep_inn_unit_lo(v);
  if (n == 0 && (goep_inn_unit_hi(v) != lo || goep_inn_unit_blocks(v) != units) && threadIdx.x == 0) {
    out[1] = 1;
  }
  first = lo + c;
  end = lo + min(c + chunk, n);
  return true;
}

extern "C" {
__global__ void __launch_bounds__(GOEP_INN_MAX_THREADS, 1)
    goep_internode_dispatch(const u8* x, const float* scales, const i64* ids, const float* weights, int num_tokens,
                            int hidden, int k, int num_experts, int nodes, int p, int node, int local, int fp8,
                            u64* epochs, const goep_inn_dispatch_layout* dlp, const i32* rank_prefix, const i32* relay_count, i32* scratch,
                            u8* rdma, u8* nvl, const u64* peer_nvl, const goep_port_channel* ports, goep_watchdog* wd,
                            const u32* wait_ids, i32* out, i64 scale_st0, i64 scale_st1, u8* out_x,
                            float* out_scales, i64* out_topk, float* out_weights, i32* out_src, int cached,
                            int split_s, int split_f);
}

// Dispatch round d (see internode/dispatch.go for the same steps in Go).
// Sender block b of S packs and sends the tokens of its chunk of the token
// range (a contiguous run of rows at each destination node: one put per
// node and block, large messages for the proxy), forwarder blocks forward
// a share of every source node's relayed rows, receiver blocks unpack a
// share of the received rows (goep_inn_roles: every block takes every
// role when the grid is shared).
extern "C" __global__ void goep_internode_dispatch(const u8* x, const float* scales, const i64* ids,
                                                   const float* weights, int num_tokens, int hidden, int k,
                                                   int num_experts, int nodes, int p, int node, int local, int fp8,
                                                   u64* epochs, const goep_inn_dispatch_layout* dlp,
                                                   const i32* rank_prefix,
                                                   const i32* relay_count, i32* scratch, u8* rdma, u8* nvl,
                                                   const u64* peer_nvl, const goep_port_channel* ports,
                                                   goep_watchdog* wd, const u32* wait_ids, i32* out,
                                                   i64 scale_st0, i64 scale_st1, u8* out_x, float* out_scales,
                                                   i64* out_topk, float* out_weights, i32* out_src,
                                                   int cached, int split_s, int split_f) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, warps = nt >> 5;
  const int blk = blockIdx.x, g = gridDim.x;
  const goep_inn_dispatch_layout dl = *dlp;
  const int w = nodes * p, le = num_experts / w, xb = dl.xb, xw = xb / 4;
  const int h = hidden;
  const i64 capacity = (i64)w * dl.max_tokens;
  u32* arrive = (u32*)(out + 2);
  // The round and the steps finished so far, from the device (every block
  // reads them here; the last block advances them at the end).
  const u64 round = epochs[GOEP_INN_EPOCH_DISPATCH] + 1, steps = epochs[GOEP_INN_EPOCH_STEPS];
  GOEP_INN_TR_INIT(0, round);
  const goep_inn_roles ro(blk, g, split_s, split_f);
  // cached bit 1: a cached route-only dispatch whose relay rows are already
  // in place at every forwarder (the same notify round's rows, BF16 layout,
  // put by an earlier dispatch of this round; nothing since writes them):
  // the rows it would put are the same metadata with stale payload, so it
  // puts nothing and only counts. This is the Buffer's second combine of a
  // handle, which would otherwise move every relay row over the network
  // again for nothing.
  const bool relay_in_place = (cached & 2) != 0;
  // cached bit 2: the round's layout is not the last dispatch's (a kept
  // layout made current again, Notify.Resume), so its receive bases
  // differ from the ones published now, which a local rank's forwarders
  // may still read in their combine of the earlier step.
  const bool bases_change = (cached & 4) != 0;
  cached &= 1;
  const bool units = (dl.flags & GOEP_INN_FLAG_UNITS) != 0;
  // Per destination node: rows of the tokens before this block's chunk
  // ([n][0]) and slots at each target local rank ([n][1 + l]); then this
  // block's first and end row per node.
  __shared__ int base[GOEP_INN_MAX_NODES * (1 + GOEP_INN_MAX_P)];
  // Per destination node, this block's first row there of each piece of
  // its chunk, then its end row ([n][pieces]).
  __shared__ int piece_row[GOEP_INN_MAX_NODES * (GOEP_INN_MAX_PIECES + 1)];
  __shared__ int last;
  // Forwarding by units: a claim's word, unit and first row, in two
  // slots.
  __shared__ u64 unit_word[2];
  __shared__ int unit_idx[2];
  __shared__ int unit_claim[2];

  // 1. Block 0 publishes the receive bases (first row of each source rank
  // here). Where they change without a notify round (bit 2), only once
  // every local rank finished its earlier steps: a combine's forwarders
  // read this rank's bases to find its receive rows, and nothing else
  // keeps this rank's next dispatch from running ahead of them.
  if (blk == 0) {
    if (bases_change) {
      bool done = true;
      for (int l = tid; l < p; l += nt) {
        done &= goep_wait_ge_u64((const u64*)(nvl + dl.done_nvl) + l, steps, wd, wait_ids[2 * nodes + 2 * p + l],
                                 (u32)(node * p + l), GOEP_INN_STAGE_DISPATCH_DONE);
      }
      if (goep_block_any_failed(!done)) {
        return;
      }
    }
    for (int r = tid; r < w; r += nt) {
      ((i32*)(nvl + dl.bases))[r] = r > 0 ? rank_prefix[r - 1] : 0;
    }
    __syncthreads();
    if (tid == 0) {
      goep_fence_acq_rel_sys();
      goep_inn_red_add_relaxed_sys_u64((u64*)(nvl + dl.ready), 1);
    }
  }

  // 2. Pack this block's chunk [t0, t1). Count what the earlier tokens
  // take at each node (rows, and slots per target rank), then thread n
  // walks the chunk in order for destination node n: the token's row there
  // (prefix over the source's tokens to n), target mask and per-target
  // slots (index among its tokens to that rank).
  bool ok = true;
  if (ro.send) {
    if (cached) {
      // No notify round since this rank's last steps: forwarder (n, local)
      // of every other node must have finished its earlier steps (it read
      // its relay rows, and this rank's staged rows have left) before this
      // block overwrites the staging and puts new rows there.
      for (int n = tid; n < nodes; n += nt) {
        if (n != node) {
          ok &= goep_wait_ge_u64((const u64*)(rdma + dl.done_net) + n, steps, wd, wait_ids[nodes + 2 * p + n],
                                 (u32)(n * p + local), GOEP_INN_STAGE_DISPATCH_DONE);
        }
      }
      if (goep_block_any_failed(!ok)) {
        return;
      }
    }
    GOEP_INN_TR(GOEP_INN_EV_D_SEND_GATE);
    int t0, t1;
    goep_inn_chunk(num_tokens, ro.s_idx, ro.s_cnt, t0, t1);
    // The chunk in pieces of tokens (goep_inn_plan_pieces: one piece unless
    // put_bytes asks for more), each put as soon as it is packed.
    const goep_inn_pieces pl = goep_inn_plan_pieces(t1 - t0, dl.put_bytes, (u64)dl.relay_row);
    const int pieces = pl.count;
    const goep_inn_put_groups grp(dl.put_groups, dl.put_bytes, ro.s_idx, ro.s_cnt, GOEP_INN_MAX_GROUPS);
    // The put of rows [lo, hi) at node n (not this one).
    auto put_rows = [&](int n, int lo, int hi) {
      ok &= goep_pc_put_ids(ports[n], ports[n].dst, dl.relay + ((u64)node * dl.max_tokens + lo) * dl.relay_row,
                            dl.send_id, dl.send + ((u64)n * dl.max_tokens + lo) * dl.relay_row,
                            (u64)(hi - lo) * dl.relay_row, GOEP_INN_STAGE_DISPATCH_PUT);
      GOEP_INN_TR_FIRST(GOEP_INN_EV_D_FIRST_PUT);
      GOEP_INN_TR_THIS(GOEP_INN_EV_D_LAST_PUT);
    };
    for (int j = tid; j < nodes * (1 + GOEP_INN_MAX_P); j += nt) {
      base[j] = 0;
    }
    __syncthreads();
    // What the tokens before the chunk take at each node: a row per token
    // with an expert there (column 0) and a slot per target rank (column
    // 1 + l), counted by warp ballots over tiles of nt tokens, node after
    // node, and added once per warp and column. (A shared-memory atomic
    // per token and expert instead serialised on the few counters of a
    // small world: at 4096 tokens the last of 16 blocks spent 100 us here
    // before packing, session 18's kernel trace.) Every thread runs the
    // same number of tiles, so the ballots see whole warps.
    for (int n = 0; n < nodes; ++n) {
      int cnt[1 + GOEP_INN_MAX_P];
#pragma unroll
      for (int c = 0; c <= GOEP_INN_MAX_P; ++c) {
        cnt[c] = 0;
      }
      for (int tt = 0; tt < t0; tt += nt) {
        const int t = tt + tid;
        const u32 mask = t < t0 ? goep_inn_node_mask(ids, t, k, num_experts, le, p, n) : 0u;
#pragma unroll
        for (int c = 0; c <= GOEP_INN_MAX_P; ++c) {
          if (c <= p) {
            const bool bit = c == 0 ? mask != 0 : ((mask >> (c - 1)) & 1u) != 0;
            cnt[c] += __popc(__ballot_sync(0xffffffffu, bit));
          }
        }
      }
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c <= GOEP_INN_MAX_P; ++c) {
          if (c <= p && cnt[c] != 0) {
            atomicAdd(&base[n * (1 + GOEP_INN_MAX_P) + c], cnt[c]);
          }
        }
      }
    }
    __syncthreads();
    GOEP_INN_TR(GOEP_INN_EV_D_PREFIX);
    // The chunk's rows in parallel, node after node, a tile of nt tokens at
    // a time: a token's row at node n is base[n][0] (rows of the tokens
    // before it) plus its rank among the tile's tokens to n, and its slot
    // at local rank l the same over the tokens to that rank; warp ballots
    // rank inside a warp, per-warp totals in shared memory across warps.
    // Rows stay in token order (what the reference and the receivers
    // expect). One thread per node walking the chunk instead took a few
    // hundred microseconds at 256 tokens a block, all before the first put.
    {
      __shared__ int wsum[32 * (1 + GOEP_INN_MAX_P)];
      const u32 lane_lt = (1u << lane) - 1u;
      for (int n = 0; n < nodes; ++n) {
        u8* region = n == node ? rdma + dl.relay + (u64)node * dl.max_tokens * dl.relay_row
                               : dl.send_base + dl.send + (u64)n * dl.max_tokens * dl.relay_row;
        int* bn = base + n * (1 + GOEP_INN_MAX_P);
        int* prow = piece_row + n * (GOEP_INN_MAX_PIECES + 1);
        for (int tt = t0; tt < t1; tt += nt) {
          const int t = tt + tid;
          const u32 mask = t < t1 ? goep_inn_node_mask(ids, t, k, num_experts, le, p, n) : 0u;
          // Column 0 counts rows (mask != 0), column 1 + l slots at l.
          int pre[1 + GOEP_INN_MAX_P];
          for (int c = 0; c <= p; ++c) {
            const bool bit = c == 0 ? mask != 0 : ((mask >> (c - 1)) & 1u) != 0;
            const u32 b = __ballot_sync(0xffffffffu, bit);
            pre[c] = __popc(b & lane_lt);
            if (lane == 0) {
              wsum[warp * (1 + GOEP_INN_MAX_P) + c] = __popc(b);
            }
          }
          __syncthreads();
          for (int c = 0; c <= p; ++c) {
            int off = bn[c];
            for (int q = 0; q < warp; ++q) {
              off += wsum[q * (1 + GOEP_INN_MAX_P) + c];
            }
            pre[c] += off;
          }
          if (t < t1) {
            const int pc = pl.index_of(t - t0);
            if (pc >= 0) {
              prow[pc] = pre[0];
            }
            if (mask == 0) {
              scratch[(i64)t * nodes + n] = -1;
            } else {
              scratch[(i64)t * nodes + n] = pre[0];
              if (pre[0] < dl.max_tokens && (dl.flags & GOEP_INN_FLAG_COMB_UNITS) != 0) {
                // The combine by units finds a landed partial's token here.
                goep_inn_token_of(scratch, dl.max_tokens, nodes)[(i64)n * dl.max_tokens + pre[0]] = t;
              }
              if (pre[0] < dl.max_tokens) {
                i32* meta = (i32*)(region + (u64)pre[0] * dl.relay_row + xb + 12 * k);
                meta[0] = t;
                meta[1] = (i32)mask;
                for (int l = 0; l < p; ++l) {
                  meta[2 + l] = (mask >> l & 1) ? pre[1 + l] : -1;
                }
              }
            }
          }
          // Every thread read bn and wsum; then the tile's totals advance
          // the running counts.
          __syncthreads();
          if (tid <= p) {
            int sum = 0;
            for (int q = 0; q < warps; ++q) {
              sum += wsum[q * (1 + GOEP_INN_MAX_P) + tid];
            }
            bn[tid] += sum;
          }
          __syncthreads();
        }
        if (tid == 0) {
          prow[pieces] = bn[0];
        }
      }
    }
    __syncthreads();
    GOEP_INN_TR(GOEP_INN_EV_D_PACKED);
    for (int pc = 0; pc < pieces; ++pc) {
      const int ta = t0 + pl.start(pc), tb = min(t1, t0 + pl.start(pc + 1)), cnt = tb - ta;
      // A warp a (node, token) item, node-major: item i is token ta + i % cnt
      // at node i / cnt. (Token-major, item t * nodes + n, pinned warp w to
      // node w % nodes whenever the warps were a multiple of the nodes, so
      // the warps of the own node, whose rows carry no payload, idled while
      // the others copied: half the warps at 2 nodes, and half the bytes in
      // flight an SM. EP2 dispatch over the port at 4096 tokens: 507 -> 460
      // us on 2 H200s, session 20.)
      for (int item = warp; item < cnt * nodes; item += warps) {
        const int n = item / cnt, t = ta + item % cnt;
        const int row = scratch[(i64)t * nodes + n];
        if (row < 0 || row >= dl.max_tokens) {
          continue;
        }
        u8* region = n == node ? rdma + dl.relay + (u64)node * dl.max_tokens * dl.relay_row
                               : dl.send_base + dl.send + (u64)n * dl.max_tokens * dl.relay_row;
        u32* dst = (u32*)(region + (u64)row * dl.relay_row);
        if (x == nullptr) {
          // Route only (a replay for combine): the rows' payload is not read.
        } else if (n == node) {
          // The own node's rows are read by this rank's forwarders only,
          // which take the payload from x itself: one write of every such
          // row fewer (ids, weights and the route still go in).
        } else if (fp8) {
          goep_inn_warp_copy(dst, x + (u64)t * h, (u64)h, lane);
          // Scales at element strides (token, column).
          for (int q = lane; q < h / 128; q += 32) {
            dst[h / 4 + q] = __float_as_uint(scales[(i64)t * scale_st0 + (i64)q * scale_st1]);
          }
        } else {
          goep_inn_warp_copy(dst, x + (u64)t * xb, (u64)xb, lane);
        }
        for (int j = lane; j < k; j += 32) {
          const u64 e = (u64)ids[(i64)t * k + j];
          dst[xw + 2 * j] = (u32)e;
          dst[xw + 2 * j + 1] = (u32)(e >> 32);
          dst[xw + 2 * k + j] = weights ? __float_as_uint(weights[(i64)t * k + j]) : 0u;
        }
      }
      // One put per other node of this piece's run of rows there (the FIFO
      // push fences system-wide, after the barrier: the piece's rows are what
      // it moves). The last block to finish its puts adds every node's
      // counter: its add is pushed after every block's put, and the transport
      // applies a channel's operations in push order.
      if (goep_block_any_failed(!ok)) {
        return;
      }
      for (int n = tid; n < nodes && !grp.grouped(); n += nt) {
        const int* prow = piece_row + n * (GOEP_INN_MAX_PIECES + 1);
        const int lo = min(prow[pc], dl.max_tokens), hi = min(prow[pc + 1], dl.max_tokens);
        if (n != node && hi > lo && !relay_in_place) {
          put_rows(n, lo, hi);
        }
      }
    }
    if (goep_block_any_failed(!ok)) {
      return;
    }
    // A put group's first block records where the group's rows start at
    // each node and its last block where they end; the last of its blocks
    // to arrive (after every member's rows are written: goep_inn_arrive's
    // fences) puts the group's rows and, below, stores its unit words.
    // run(n) is the rows [lo, hi) this block puts or names at node n: its
    // own, or its group's.
    int* glo = out + GOEP_INN_OUT_WORDS + grp.idx * GOEP_INN_MAX_NODES;
    int* ghi = glo + GOEP_INN_MAX_GROUPS * GOEP_INN_MAX_NODES;
    auto run = [&](int n, int& lo, int& hi) {
      const int* prow = piece_row + n * (GOEP_INN_MAX_PIECES + 1);
      lo = min(grp.grouped() ? ((volatile int*)glo)[n] : prow[0], dl.max_tokens);
      hi = min(grp.grouped() ? ((volatile int*)ghi)[n] : prow[pieces], dl.max_tokens);
    };
    bool group_last = true;
    if (grp.grouped()) {
      for (int n = tid; n < nodes; n += nt) {
        const int* prow = piece_row + n * (GOEP_INN_MAX_PIECES + 1);
        if (ro.s_idx == grp.first) {
          glo[n] = prow[0];
        }
        if (ro.s_idx == grp.first + grp.members - 1) {
          ghi[n] = prow[pieces];
        }
      }
      group_last = goep_inn_arrive((u32*)(out + 6) + grp.idx, &last, grp.members);
      if (group_last) {
        for (int n = tid; n < nodes; n += nt) {
          int lo, hi;
          run(n, lo, hi);
          if (n != node && hi > lo && !relay_in_place) {
            put_rows(n, lo, hi);
          }
        }
        if (goep_block_any_failed(!ok)) {
          return;
        }
      }
    }
    // The nodes this rank's rows go to by units: this rank's row count to
    // each (notify's per-node counts, which precede the relay counts in
    // its output: status, invalid, per rank, per node, per expert, from
    // rank, relay) decides, as the forwarder's relay count does there.
    const i32* sent_rows = relay_count - (nodes + num_experts + w);
    u64 by_units = 0;
    for (int n = 0; n < nodes; ++n) {
      by_units |= goep_inn_by_units(dl, sent_rows[n]) ? 1ull << n : 0ull;
    }
    if (by_units != 0 && group_last) {
      // This block's (or put group's) unit at every such node: its run of
      // rows there, stored on the channel that carried them (so it lands
      // after them; a store, not an atomic add, which over CUDA IPC is a
      // kernel launch between the copies), or directly at this node with a
      // release (the relay rows were written before the barrier above, or
      // before the group's arrival).
      for (int n = tid; n < nodes; n += nt) {
        if ((by_units >> n & 1ull) == 0) {
          continue;
        }
        int lo, hi;
        run(n, lo, hi);
        const u64 v = goep_inn_unit_word(grp.count, lo, hi);
        const u64 off = dl.unit_words + 8ull * ((u64)node * GOEP_INN_MAX_UNITS + grp.idx);
        if (n == node) {
          goep_st_release_sys_u64((u64*)(rdma + off), v);
        } else {
          ok &= goep_pc_store(ports[n], off, v, GOEP_INN_STAGE_DISPATCH_PUT);
        }
      }
      if (goep_block_any_failed(!ok)) {
        return;
      }
    }
    // Every node's counter advances each round, whichever way its rows
    // went: a later round that forwards by node waits for it to reach the
    // round (the add is pushed after every block's puts and words, so it
    // is off the path of a round that goes by units).
    if (goep_inn_arrive(arrive, &last, ro.s_cnt) &&
        goep_block_any_failed(!goep_inn_count_to_nodes(rdma, dl.net_counters, node, nodes, ports,
                                                       GOEP_INN_STAGE_DISPATCH_PUT))) {
      return;
    }
    GOEP_INN_TR(GOEP_INN_EV_D_SENT);

  }
  if (ro.fwd) {
    // 3. Forward: every local rank's bases published (every block waits
    // for itself), then each source node's rows as its counter says they
    // landed, this node's first (packed here by this rank's senders, no
    // network) and then the others from the next node on, so the NVLink
    // leg of the own node's rows runs while the other nodes' rows are
    // still on the network instead of after them; a warp of the grid per
    // relayed row writes it to each target.
    for (int j = tid; j < p + (cached ? p : 0); j += nt) {
      if (j >= p) {
        // Cached: every local rank finished its earlier steps (unpacked its
        // rows, and as forwarder read its peers' rows in a combine) before
        // this rank writes their receive rows.
        const int l = j - p;
        ok &= goep_wait_ge_u64((const u64*)(nvl + dl.done_nvl) + l, steps, wd, wait_ids[2 * nodes + 2 * p + l],
                               (u32)(node * p + l), GOEP_INN_STAGE_DISPATCH_DONE);
      } else {
        const int l = j;
        ok &= goep_wait_ge_u64((const u64*)((const u8*)peer_nvl[l] + dl.ready), round, wd, wait_ids[nodes + l],
                               (u32)(node * p + l), GOEP_INN_STAGE_DISPATCH_READY);
      }
    }
    if (goep_block_any_failed(!ok)) {
      return;
    }
    GOEP_INN_TR(GOEP_INN_EV_D_FWD_READY);
  }
  // Forward and receive in two halves: (0) the rows relayed from this
  // node's own sources, which need no network, then (1) the other nodes'.
  // A forwarder adds each local rank's NVLink counter once per half (2 a
  // round: 2d - 1 after half 0, 2d after half 1), so a receiver unpacks
  // the rows of its own node's sources (consecutive ranks: one run of its
  // receive rows) while the other nodes' rows are still on the network,
  // and only the rest after them. A grid whose blocks take every role
  // (Shared) does the same in turn: each block forwards its share of the
  // own node's rows, unpacks its share of them, then waits for the
  // network.
  int turn = 0;  // unit words read so far (their shared slots alternate)
  for (int half = 0; half < 2; ++half) {
    if (ro.fwd) {
      for (int i = half == 0 ? 0 : 1; i < (half == 0 ? 1 : nodes); ++i) {
        const int src = (node + i) % nodes;
        const int rows = relay_count[src], src_rank = src * p + local;
        const bool rows_ok = rows >= 0 && rows <= dl.max_tokens;
        // The own node's relay rows are this rank's own tokens, packed
        // without their payload when the caller gave one (x).
        const bool own_x = src == node && x != nullptr;
        // Relay row j of src to each of its targets, by one warp.
        auto forward_row = [&](int j) {
          const u32* row = (const u32*)(rdma + dl.relay + ((u64)src * dl.max_tokens + j) * dl.relay_row);
          const i32* meta = (const i32*)(row + xw + 3 * k);
          const u32 mask = (u32)meta[1];
          for (int l = 0; l < p; ++l) {
            if ((mask >> l & 1) == 0) {
              continue;
            }
            const int dst_rank = node * p + l;
            const i32 slot = meta[2 + l];
            const i32 b0 = ((const i32*)((const u8*)peer_nvl[l] + dl.bases))[src_rank];
            const i64 pos = (i64)b0 + slot;
            if (slot < 0 || b0 < 0 || pos >= capacity) {
              if (lane == 0) {
                out[1] = 1;
              }
              continue;
            }
            if (l == local && out_x != nullptr) {
              // This rank is the target and the caller gave outputs: the
              // row goes straight to them (its receive row would only be
              // unpacked there: one copy instead of two); the unpack skips
              // the rows of the sources this rank forwards.
              if (own_x) {
                goep_inn_out_x_from(x, scales, scale_st0, scale_st1, meta[0], pos, h, fp8, out_x, out_scales, lane);
              } else {
                goep_inn_out_x(row, pos, h, fp8, out_x, out_scales, lane);
              }
              for (int jj = lane; jj < k; jj += 32) {
                const i64 e = (i64)((u64)row[xw + 2 * jj] | (u64)row[xw + 2 * jj + 1] << 32);
                const bool mine = e >= 0 && e < num_experts && (int)(e / le) == dst_rank;
                out_topk[pos * k + jj] = mine ? e - (i64)dst_rank * le : -1;
                if (out_weights != nullptr) {
                  out_weights[pos * k + jj] = mine ? __uint_as_float(row[xw + 2 * k + jj]) : 0.f;
                }
              }
              if (lane == 0) {
                out_src[pos] = meta[0];
              }
              continue;
            }
            u32* rr = (u32*)((u8*)peer_nvl[l] + dl.recv + (u64)pos * dl.recv_row);
            if (own_x) {
              goep_inn_row_from(rr, x, scales, scale_st0, scale_st1, meta[0], h, fp8, lane);
            } else {
              goep_inn_warp_copy(rr, row, (u64)xb, lane);
            }
            for (int jj = lane; jj < k; jj += 32) {
              const i64 e = (i64)((u64)row[xw + 2 * jj] | (u64)row[xw + 2 * jj + 1] << 32);
              const bool mine = e >= 0 && e < num_experts && (int)(e / le) == dst_rank;
              const u64 v = mine ? (u64)(e - (i64)dst_rank * le) : ~0ull;
              rr[xw + 2 * jj] = (u32)v;
              rr[xw + 2 * jj + 1] = (u32)(v >> 32);
              rr[xw + 2 * k + jj] = mine ? row[xw + 2 * k + jj] : 0u;
            }
            if (lane == 0) {
              rr[xw + 3 * k] = (u32)src_rank;
              rr[xw + 3 * k + 1] = (u32)meta[0];
            }
          }
        };
        if (!goep_inn_by_units(dl, rows)) {
          if (tid == 0) {
            ok &= goep_wait_ge_u64((const u64*)(rdma + dl.net_counters) + src, round, wd, wait_ids[src],
                                   (u32)(src * p + local), GOEP_INN_STAGE_DISPATCH_NET);
          }
          if (goep_block_any_failed(!ok)) {
            return;
          }
          if (half == 1) {
            GOEP_INN_TR(GOEP_INN_EV_D_NET_LANDED);
          }
          if (!rows_ok) {
            if (tid == 0) {
              out[1] = 1;
            }
            continue;
          }
          for (int j = ro.f_idx * warps + warp; j < rows; j += ro.f_cnt * warps) {
            forward_row(j);
          }
          continue;
        }
        // By units, shared out as they land: the forwarder blocks claim
        // runs of rows (chunk: four a warp) of any landed unit with an
        // atomic add on the unit's claim counter, so that the rows of the
        // last unit to land are spread over every forwarder block. Each
        // block looks from a unit of its own (f mod S) on and stays on a
        // unit while it has rows left.
        const u64* words = (const u64*)(rdma + dl.unit_words) + (u64)src * GOEP_INN_MAX_UNITS;
        u32* claims = goep_inn_unit_claims(rdma, dl, nodes) + (u64)src * GOEP_INN_MAX_UNITS;
        u32* done = goep_inn_unit_done(rdma, dl, nodes) + (u64)src * (GOEP_INN_MAX_UNITS / 32);
        const int chunk = 4 * warps;
        if (tid == 0) {
          int senders = 0;
          ok &= goep_inn_unit_senders(words, ro.s_cnt, wd, wait_ids[src], (u32)(src * p + local),
                                      GOEP_INN_STAGE_DISPATCH_NET, senders);
          unit_idx[turn & 1] = senders;
        }
        // A barrier; the slots alternate from use to use (across sources
        // too), so warp 0 never overwrites one a warp may still read.
        if (goep_block_any_failed(!ok)) {
          return;
        }
        const int senders = unit_idx[turn & 1];
        ++turn;
        if (senders <= 0 || senders > GOEP_INN_MAX_UNITS || !rows_ok) {
          if (tid == 0) {
            out[1] = 1;
          }
          continue;
        }
        for (int at = ro.f_idx % senders;;) {
          int ub, first, end;
          if (!goep_inn_claim_block(words, claims, done, senders, rows, at, chunk, wd, wait_ids[src],
                                    (u32)(src * p + local), GOEP_INN_STAGE_DISPATCH_NET, unit_word, unit_idx,
                                    unit_claim, turn, ok, out, ub, first, end)) {
            return;
          }
          if (ub < 0) {
            break;  // every unit's rows are claimed
          }
          at = ub;
          for (int j = first + warp; j < end; j += warps) {
            forward_row(j);
          }
        }
        if (half == 1) {
          GOEP_INN_TR(GOEP_INN_EV_D_NET_LANDED);
        }
      }
      GOEP_INN_TR(half == 0 ? GOEP_INN_EV_D_FWD_OWN : GOEP_INN_EV_D_FWD_DONE);
      if (goep_inn_arrive(half == 0 ? arrive + 1 : arrive + 3, &last, ro.f_cnt) && tid == 0) {
        for (int l = 0; l < p; ++l) {
          goep_inn_red_add_relaxed_sys_u64((u64*)((u8*)peer_nvl[l] + dl.nvl_counters) + local, 1);
        }
      }
    }
    if (ro.recv) {
      // 4. Receive: every forwarder of the node has placed this half's
      // rows.
      for (int j = tid; j < p; j += nt) {
        ok &= goep_wait_ge_u64_after((const u64*)(nvl + dl.nvl_counters) + j, 2 * round - 1 + half, wd,
                                     wait_ids[nodes + p + j], (u32)(node * p + j), GOEP_INN_STAGE_DISPATCH_NVL);
      }
      if (goep_block_any_failed(!ok)) {
        return;
      }
      if (half == 1) {
        GOEP_INN_TR(GOEP_INN_EV_D_RECV_GATE);
      }
      // 5. The device-pointer form: unpack the received rows into the
      // caller's separate regions (x, FP8 scales, local ids, weights,
      // source token), a warp of the grid per row; the counts are
      // notify's, on the device. Half 0: the rows of this node's sources;
      // half 1: the rest. The rows of sources with this rank's local index
      // are not here: this rank forwarded them straight to the outputs.
      if (out_x != nullptr) {
        const i64 n = rank_prefix[w - 1] < capacity ? rank_prefix[w - 1] : capacity;
        const i64 gw = (i64)ro.r_idx * warps + warp, gws = (i64)ro.r_cnt * warps;
        i64 seen = 0;  // rows walked so far: the next run starts at the next warp
        for (int s = 0; s < w; ++s) {
          if ((s / p == node) != (half == 0) || s % p == local) {
            continue;
          }
          i64 lo, hi;
          goep_inn_source_rows(rank_prefix, s, n, lo, hi);
          for (i64 r = lo + ((gw - seen) % gws + gws) % gws; r < hi; r += gws) {
            const u32* rr = (const u32*)(nvl + dl.recv + (u64)r * dl.recv_row);
            goep_inn_out_x(rr, r, h, fp8, out_x, out_scales, lane);
            u32* ot = (u32*)(out_topk + r * k);
            for (int q = lane; q < 2 * k; q += 32) {
              ot[q] = rr[xw + q];
            }
            if (out_weights != nullptr) {
              for (int q = lane; q < k; q += 32) {
                out_weights[r * k + q] = __uint_as_float(rr[xw + 2 * k + q]);
              }
            }
            if (lane == 0) {
              out_src[r] = (i32)rr[xw + 3 * k + 1];
            }
          }
          seen += hi - lo;
        }
      }
    }
  }
  GOEP_INN_TR(GOEP_INN_EV_D_EXIT);
  goep_inn_finish(arrive + 2, &last, g, dl, nodes, p, node, local, peer_nvl, ports, GOEP_INN_STAGE_DISPATCH_DONE,
                  epochs, GOEP_INN_EPOCH_DISPATCH, round, steps, out, units ? rdma : nullptr);
}

// ---------------------------------------------------------------------------
// Combine (see internode/combine.go for the same steps in Go). The expert
// outputs (y BF16 [H], weights fp32 [K]) are in this rank's receive rows
// (the slice form's host copy put them there in stream order before the
// launch; the device-pointer form's step 1 copies them). Partial rows: x
// fp32 [H] for the own node and under fp32 partials, BF16 [H] otherwise,
// then weights fp32 [K]; stride rounded up to 16 bytes. scratch[t][n] is
// dispatch's row of token t at node n (its partial slot), -1 where t has no
// expert there.
#define GOEP_INN_STAGE_COMBINE_READY 60
#define GOEP_INN_STAGE_COMBINE_NET 61
#define GOEP_INN_STAGE_COMBINE_PUT 62

__device__ __forceinline__ int goep_inn_partial_xb(int n, int node, int fp32, int h) {
  return (n == node || fp32) ? 4 * h : 2 * h;
}
__device__ __forceinline__ u64 goep_inn_partial_stride(int n, int node, int fp32, int h, int k) {
  return ((u64)goep_inn_partial_xb(n, node, fp32, h) + 4ull * k + 15ull) & ~15ull;
}

// 3. The source's final reduce of token t (a warp): sums its partials in
// ascending node from +0, adds bias0 then bias1, rounds once, eight
// elements a lane. Every node's partial of t is in (the combine kernel's
// receivers waited for every node's, or, by units, for t's). The warp
// takes the slices slice, slice + slices, ... of GROUPS * 256 elements
// (0 and 1: all of x) and, with do_w, the weights: several warps can
// share a token.
template <int GROUPS>
__device__ __forceinline__ void goep_inn_final_token(i64 t, int h, int k, int nodes, int node, int weights, int fp32,
                                                     const goep_inn_dispatch_layout& dl, const i32* scratch,
                                                     const u16* bias0, const u16* bias1, u16* out_x, float* out_w,
                                                     const u8* rdma, i32* out, int lane, int slice = 0,
                                                     int slices = 1, bool do_w = true) {
  {
    // Lane n holds node n's partial row of t (node n + 32 in the second
    // word), 0 where t has no expert there: read once per token, then
    // shuffled to the warp per node (a scratch load per node and step
    // put two dependent loads in front of every step's data).
    u64 row_at[2] = {0, 0};
    for (int c = 0; c < 2; ++c) {
      const int n = lane + 32 * c;
      if (n < nodes) {
        const i32 j = scratch[(i64)t * nodes + n];
        if (j >= dl.max_tokens) {
          out[1] = 1;
        } else if (j >= 0) {
          row_at[c] = (u64)(rdma + dl.comb_recv + (u64)n * dl.max_tokens * dl.partial_row +
                            (u64)j * goep_inn_partial_stride(n, node, fp32, h, k));
        }
      }
    }
    // Two groups of eight elements a lane per step (q0 and q0 + 256),
    // nodes two at a time: a step's loads (both nodes, both groups, the
    // biases) are issued before its additions; each element still adds
    // its nodes in ascending order from +0, then bias0, then bias1. The
    // loop's bound is the warp's (base), not the lane's: every lane takes
    // part in the shuffles; a lane's groups past h do nothing. Loops over
    // groups and nodes of a pair have constant bounds (unrolled: the
    // loads stay in registers).
#pragma unroll 1
    for (int base = slice * GROUPS * 256; base < h; base += slices * GROUPS * 256) {
      const int q0 = base + lane * 8;
      const int groups = q0 < h ? min(GROUPS, (h - q0 + 255) / 256) : 0;
      uint4 braw[2][GROUPS];
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        const i64 q = (i64)t * h + q0 + 256 * g;
        if (g < groups && bias0) {
          braw[0][g] = goep_inn_ld16(bias0 + q);
        }
        if (g < groups && bias1) {
          braw[1][g] = goep_inn_ld16(bias1 + q);
        }
      }
      float acc[GROUPS][8];
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc[g][e] = 0.f;
        }
      }
      for (int n0 = 0; n0 < nodes; n0 += 2) {
        const u8* pn[2];
        bool f32[2];
        uint4 raw[2][GROUPS][2];  // [node of the pair][group][half of an fp32 group]
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int n = n0 + b;
          pn[b] = n < nodes ? (const u8*)__shfl_sync(0xffffffffu, row_at[n >= 32 ? 1 : 0], n & 31) : nullptr;
          f32[b] = goep_inn_partial_xb(n, node, fp32, h) == 4 * h;
#pragma unroll
          for (int g = 0; g < GROUPS; ++g) {
            const int q = q0 + 256 * g;
            if (g < groups && pn[b] != nullptr) {
              if (f32[b]) {
                raw[b][g][0] = ((const uint4*)((const float*)pn[b] + q))[0];
                raw[b][g][1] = ((const uint4*)((const float*)pn[b] + q))[1];
              } else {
                raw[b][g][0] = goep_inn_ld16((const u16*)pn[b] + q);
              }
            }
          }
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#pragma unroll
          for (int g = 0; g < GROUPS; ++g) {
            if (g >= groups || pn[b] == nullptr) {
              continue;
            }
            if (f32[b]) {
              const uint4 x0 = raw[b][g][0], x1 = raw[b][g][1];
              const u32 bits[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                acc[g][e] += __uint_as_float(bits[e]);
              }
            } else {
              goep_inn_add8_bf16(acc[g], raw[b][g][0]);
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        if (g >= groups) {
          continue;
        }
        if (bias0) {
          goep_inn_add8_bf16(acc[g], braw[0][g]);
        }
        if (bias1) {
          goep_inn_add8_bf16(acc[g], braw[1][g]);
        }
        goep_inn_st8_bf16(out_x + (i64)t * h + q0 + 256 * g, acc[g]);
      }
    }
    if (weights && do_w) {
      for (int q0 = 0; q0 < k; q0 += 32) {
        const int q = q0 + lane;
        float acc = 0.0f;
        for (int n = 0; n < nodes; ++n) {
          const u8* pr = (const u8*)__shfl_sync(0xffffffffu, row_at[n >= 32 ? 1 : 0], n & 31);
          if (pr != nullptr && q < k) {
            acc += ((const float*)(pr + goep_inn_partial_xb(n, node, fp32, h)))[q];
          }
        }
        if (q < k) {
          out_w[(i64)t * k + q] = acc;
        }
      }
    }
  }
}

// The final reduce of every token after every node's partials landed:
// warp t_first, t_first + t_step, ... of the grid.
__device__ __forceinline__ void goep_inn_final_reduce(i64 t_first, i64 t_step, int num_tokens, int h, int k, int nodes,
                                                      int node, int weights, int fp32,
                                                      const goep_inn_dispatch_layout& dl, const i32* scratch,
                                                      const u16* bias0, const u16* bias1, u16* out_x, float* out_w,
                                                      const u8* rdma, i32* out, int lane) {
  for (i64 t = t_first; t < num_tokens; t += t_step) {
    goep_inn_final_token<GOEP_INN_FINAL_GROUPS>(t, h, k, nodes, node, weights, fp32, dl, scratch, bias0, bias1, out_x,
                                                out_w, rdma, out, lane);
  }
}

// Reducing by units (GOEP_INN_FLAG_COMB_UNITS). need: the nodes whose
// partial of token t this rank waits for, its valid slots there (every
// lane returns the count; a slot past its region, or past the rows this
// rank sent to the node, flags out[1] and is not counted, so such a token
// is never waited for).
__device__ __forceinline__ u32 goep_inn_token_need(i64 t, int nodes, const i32* scratch, const i32* sent_rows,
                                                   int max_tokens, i32* out, int lane) {
  u32 need = 0;
  for (int n0 = 0; n0 < nodes; n0 += 32) {
    const int n = n0 + lane;
    bool valid = false;
    if (n < nodes) {
      const i32 j = scratch[t * nodes + n];
      if (j >= 0) {
        valid = j < max_tokens && j < sent_rows[n];
        if (!valid) {
          out[1] = 1;
        }
      }
    }
    need += __popc(__ballot_sync(0xffffffffu, valid));
  }
  return need;
}

// A node's partial of token t is in (written by the calling warp, or named
// by a unit word its block acquired): the warp adds it to t's pending
// count, and the warp that brings it to need gets true (every lane) and
// sums the token then (goep_inn_final_token); it also clears the count for
// the next round, which nothing else touches in this one. The atomic add
// releases what the warp wrote or acquired and the last one acquires every
// earlier add's.
__device__ __forceinline__ bool goep_inn_contribute(u32* pending, i64 t, u32 need, int lane) {
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    __threadfence();
    const u32 old = atomicAdd(pending + t, 1u);
    if (old + 1u >= need) {
      __threadfence();
      pending[t] = 0;
      last = 1;
    }
  }
  last = __shfl_sync(0xffffffffu, last, 0);
  __syncwarp();
  return last != 0;
}

// Tokens a combine block completes in one step, reducing by units (rows
// of a claim, or of the own node's pass): at most two a warp.
#define GOEP_INN_DONE_TOKENS (2 * GOEP_INN_MAX_THREADS / 32)

// Reducing by units: the tokens the block's warps completed in one step
// (list[0, cnt), shared), summed by the whole block: the work is (token,
// slice of GOEP_INN_UNIT_GROUPS * 256 elements) items over every warp, and
// each token's weights go with its slice 0, so that the last unit's tokens
// take a few steps of every warp rather than a whole row of one warp each
// (which left the last claims' blocks 60 us behind the last partial,
// session 24's trace). Every thread calls it after a barrier that follows
// the list's writes; it ends with a barrier.
__device__ __forceinline__ void goep_inn_final_tokens_block(const int* list, int cnt, int h, int k, int nodes,
                                                            int node, int weights, int fp32,
                                                            const goep_inn_dispatch_layout& dl, const i32* scratch,
                                                            const u16* bias0, const u16* bias1, u16* out_x,
                                                            float* out_w, const u8* rdma, i32* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int slices = (h + GOEP_INN_UNIT_GROUPS * 256 - 1) / (GOEP_INN_UNIT_GROUPS * 256);
  for (int it = warp; it < cnt * slices; it += warps) {
    const int i = it / slices, sl = it - i * slices;
    goep_inn_final_token<GOEP_INN_UNIT_GROUPS>(list[i], h, k, nodes, node, weights, fp32, dl, scratch, bias0, bias1,
                                               out_x, out_w, rdma, out, lane, sl, slices, sl == 0);
  }
  __syncthreads();
}

// The combine's units to source node src from this forwarder (reducing by
// units): count of them, this block's first, and whether a unit is a
// block's whole run (per_block: asked for with by_block, or the pieces of
// every block would be more than a table holds) rather than one put (a
// put group's, or one piece).
// Rows: the forwarder's relay rows of src, red_cnt its reducer blocks,
// chunked as goep_inn_chunk does: blocks [0, full) have per rows each,
// block full the rem left, the rest none. Units are numbered densely in
// row order, so word 0 exists whenever rows do.
struct goep_inn_comb_units {
  int count, first;
  bool per_block;
};
__device__ __forceinline__ goep_inn_comb_units goep_inn_comb_plan(int rows, int blk, int red_cnt,
                                                                   const goep_inn_put_groups& grp, int put_bytes,
                                                                   u64 stride, bool by_block) {
  goep_inn_comb_units u;
  u.count = 0;
  u.first = 0;
  u.per_block = false;
  if (rows <= 0 || red_cnt <= 0) {
    return u;
  }
  const int per = (rows + red_cnt - 1) / red_cnt, full = rows / per, rem = rows - full * per;
  const int busy = full + (rem > 0 ? 1 : 0);
  if (grp.grouped()) {
    u.count = (busy + grp.size - 1) / grp.size;
    u.first = grp.idx;
    return u;
  }
  const int cf = goep_inn_plan_pieces(per, put_bytes, stride).count;
  const int cr = rem > 0 ? goep_inn_plan_pieces(rem, put_bytes, stride).count : 0;
  u.count = full * cf + cr;
  u.first = min(blk, full) * cf + (blk > full ? cr : 0);
  if (by_block || u.count >= GOEP_INN_MAX_CUNITS) {
    u.per_block = true;
    u.count = busy;
    u.first = blk;
  }
  return u;
}

extern "C" {
__global__ void __launch_bounds__(GOEP_INN_MAX_THREADS, 1)
    goep_internode_combine(int num_tokens, int hidden, int k, int nodes, int p, int node, int local, int weights,
                           int fp32, u64* epochs, const goep_inn_dispatch_layout* dlp, const i32* relay_count,
                           const i32* scratch, const u16* bias0, const u16* bias1, u16* out_x, float* out_w,
                           u8* rdma, u8* nvl, const u64* peer_nvl, const goep_port_channel* ports, goep_watchdog* wd,
                           const u32* wait_ids, i32* out, const u16* y_in, const float* w_in,
                           const i32* rank_prefix, int split_s, int split_f, int reduce_apart,
                           const i32* sent_rows);
__global__ void __launch_bounds__(GOEP_INN_MAX_THREADS, 1)
    goep_internode_combine_reduce(int num_tokens, int hidden, int k, int nodes, int node, int weights, int fp32,
                                  const goep_inn_dispatch_layout* dlp, const i32* scratch, const u16* bias0,
                                  const u16* bias1, u16* out_x, float* out_w, const u8* rdma, i32* out);
}

// Combine round c. Every block copies a share of the expert outputs in;
// reducer block b (senders and forwarders of the split) reduces its chunk
// of every source node's relayed tokens (a contiguous run of partial rows:
// one put per node and block); receiver blocks sum a share of this rank's
// tokens (goep_inn_roles). Every element's additions keep the reference's
// order, so the result is bit for bit the one-block kernel's.
extern "C" __global__ void goep_internode_combine(int num_tokens, int hidden, int k, int nodes, int p, int node,
                                                  int local, int weights, int fp32, u64* epochs,
                                                  const goep_inn_dispatch_layout* dlp, const i32* relay_count,
                                                  const i32* scratch, const u16* bias0, const u16* bias1, u16* out_x,
                                                  float* out_w, u8* rdma, u8* nvl, const u64* peer_nvl,
                                                  const goep_port_channel* ports, goep_watchdog* wd,
                                                  const u32* wait_ids, i32* out, const u16* y_in,
                                                  const float* w_in, const i32* rank_prefix, int split_s,
                                                  int split_f, int reduce_apart, const i32* sent_rows) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, warps = nt >> 5;
  const int blk = blockIdx.x, g = gridDim.x, gwarp = blk * warps + warp, gwarps = g * warps;
  const goep_inn_dispatch_layout dl = *dlp;
  const int w = nodes * p, h = hidden;
  const i64 capacity = (i64)w * dl.max_tokens;
  u32* arrive = (u32*)(out + 2);
  __shared__ int last;
  // The round and the steps finished so far, from the device (every block
  // reads them here; the last block advances them at the end).
  const u64 round = epochs[GOEP_INN_EPOCH_COMBINE] + 1, steps = epochs[GOEP_INN_EPOCH_STEPS];
  GOEP_INN_TR_INIT(1, round);
  // Reducers (senders and forwarders of the split: blocks [0, red_cnt))
  // and receivers.
  const goep_inn_roles ro(blk, g, split_s, split_f);
  const bool reducer = ro.send || ro.fwd;
  const int red_cnt = ro.recv && reducer ? g : ro.s_cnt + ro.f_cnt;
  // Reducing by units (GOEP_INN_FLAG_COMB_UNITS): sent_rows[n] is this
  // rank's row count at node n (notify's per-node counts, the relay count
  // of its forwarder there), token_of and pending the token map.
  const bool by_units = (dl.flags & GOEP_INN_FLAG_COMB_UNITS) != 0;
  // A claim's word, unit and first row, in two slots (as the dispatch's
  // forwarders claim).
  __shared__ u64 unit_word[2];
  __shared__ int unit_idx[2];
  __shared__ int unit_claim[2];
  // The tokens completed in a step (goep_inn_final_tokens_block).
  __shared__ int done_tok[GOEP_INN_DONE_TOKENS];
  __shared__ int done_cnt;

  // 1. The device-pointer form copies this rank's expert outputs (y BF16
  // [n][H], weights fp32 [n][K], n = notify's received count, on the
  // device) into its receive rows, for the node's forwarders: the x of
  // rows of sources with this rank's local index is read by this rank
  // only (it forwarded them), straight from y, so only their weights are
  // copied (with one rank a node, no x at all). Every
  // forwarder of the node finished writing these rows in dispatch (this
  // rank waited for them), so nobody else touches them now. Then the last
  // block tells the node's forwarders.
  if (y_in != nullptr) {
    const i64 n = rank_prefix[w - 1] < capacity ? rank_prefix[w - 1] : capacity;
    i64 seen = 0;  // rows walked so far: the next run starts at the next warp
    for (int s = 0; s < w; ++s) {
      const bool own = s % p == local;
      i64 lo, hi;
      goep_inn_source_rows(rank_prefix, s, n, lo, hi);
      for (i64 r = lo + ((gwarp - seen) % gwarps + gwarps) % gwarps; r < hi; r += gwarps) {
        u32* rr = (u32*)(nvl + dl.recv + (u64)r * dl.recv_row);
        if (!own) {
          goep_inn_warp_copy(rr, y_in + r * h, 2ull * h, lane);
        }
        if (w_in != nullptr) {
          for (int q = lane; q < k; q += 32) {
            rr[h / 2 + q] = __float_as_uint(w_in[r * k + q]);
          }
        }
      }
      seen += hi - lo;
    }
  }
  if (goep_inn_arrive(arrive, &last, g) && tid == 0) {
    goep_inn_red_add_relaxed_sys_u64((u64*)(nvl + dl.comb_ready), 1);
  }
  GOEP_INN_TR(GOEP_INN_EV_C_COPIED);

  // 2. As forwarder: every local rank's outputs are in place; block b
  // takes its chunk of each source node's relayed tokens, a warp per token
  // summing its targets' rows from +0 in ascending local rank, eight
  // elements a lane.
  bool ok = true;
  if (reducer) {
    for (int j = tid; j < p; j += nt) {
      ok &= goep_wait_ge_u64((const u64*)((const u8*)peer_nvl[j] + dl.comb_ready), round, wd, wait_ids[j],
                             (u32)(node * p + j), GOEP_INN_STAGE_COMBINE_READY);
    }
    if (goep_block_any_failed(!ok)) {
      return;
    }
    GOEP_INN_TR(GOEP_INN_EV_C_READY);
    // Other nodes first, the own node last: the partials that cross the
    // network are put while this block reduces the ones that stay here
    // (each source node's partials go to their own region, and the source
    // sums them in ascending node whatever order they were made in).
    // Put groups (goep_inn_put_groups): the last of a group's blocks to
    // finish a source's partials puts the group's run, on an arrival
    // counter per other node and group (the dispatch's, cleared again
    // before this launch).
    const goep_inn_put_groups grp(dl.put_groups, dl.put_bytes, blk, red_cnt, GOEP_INN_MAX_GROUPS / max(nodes - 1, 1));
    // Partial rows [a, b) of source node src to that node (thread 0; the
    // FIFO push fences after the barrier or the group's arrival).
    auto put_partials = [&](int src, u64 stride, int a, int b) {
      ok &= goep_pc_put_ids(ports[src], ports[src].dst,
                            dl.comb_recv + (u64)node * dl.max_tokens * dl.partial_row + (u64)a * stride, dl.send_id,
                            dl.comb_send + (u64)src * dl.max_tokens * dl.partial_row + (u64)a * stride,
                            (u64)(b - a) * stride, GOEP_INN_STAGE_COMBINE_PUT);
      GOEP_INN_TR_FIRST(GOEP_INN_EV_C_FIRST_PUT);
      GOEP_INN_TR_THIS(GOEP_INN_EV_C_LAST_PUT);
    };
    // Reducing by units: unit u of count, rows [a, b), named to source node
    // src right after their put, on the same channel (so it lands after
    // them; a store, which over CUDA IPC is a stream write, where an atomic
    // add would be a kernel launch between the copies).
    auto store_unit = [&](int src, int u, int count, int a, int b) {
      ok &= goep_pc_store(ports[src], dl.comb_unit_words + 8ull * ((u64)node * GOEP_INN_MAX_CUNITS + u),
                          goep_inn_unit_word(count, a, b), GOEP_INN_STAGE_COMBINE_PUT);
    };
    for (int i = 0; i < nodes; ++i) {
      const int src = (node + 1 + i) % nodes;
      const int rows = relay_count[src], src_rank = src * p + local;
      if (rows < 0 || rows > dl.max_tokens) {
        if (tid == 0) {
          out[1] = 1;
        }
        continue;
      }
      int lo, hi;
      goep_inn_chunk(rows, blk, red_cnt, lo, hi);
      const u64 stride = goep_inn_partial_stride(src, node, fp32, h, k);
      const int pxb = goep_inn_partial_xb(src, node, fp32, h);
      u8* region = src == node ? rdma + dl.comb_recv + (u64)node * dl.max_tokens * dl.partial_row
                               : dl.send_base + dl.comb_send + (u64)src * dl.max_tokens * dl.partial_row;
      // The run in pieces (goep_inn_plan_pieces; one piece unless put_bytes
      // asks for more), each put once reduced.
      const goep_inn_pieces pl = goep_inn_plan_pieces(hi - lo, src == node ? 0 : dl.put_bytes, stride);
      for (int pc = 0; pc < pl.count; ++pc) {
        const int a = lo + pl.start(pc), b = min(hi, lo + pl.start(pc + 1));
        for (int j = a + warp; j < b; j += warps) {
          const u32* row = (const u32*)(rdma + dl.relay + ((u64)src * dl.max_tokens + j) * dl.relay_row);
          const i32* meta = (const i32*)(row + dl.xb / 4 + 3 * k);
          const u32 mask = (u32)meta[1];
          // Target rows: the local ranks' receive rows.
          const u8* trow[GOEP_INN_MAX_P];
          int nt_rows = 0;
          bool in_range = true;
          for (int l = 0; l < p; ++l) {
            if (mask >> l & 1) {
              const i32 b0 = ((const i32*)((const u8*)peer_nvl[l] + dl.bases))[src_rank];
              const i64 pos = (i64)b0 + meta[2 + l];
              in_range &= meta[2 + l] >= 0 && b0 >= 0 && pos < capacity;
              trow[nt_rows++] = (const u8*)peer_nvl[l] + dl.recv + (u64)pos * dl.recv_row;
            }
          }
          if (!in_range) {
            if (lane == 0) {
              out[1] = 1;
            }
            continue;
          }
          u8* pr = region + (u64)j * stride;
          // Weights first (after x in each receive row; step 1 copied this
          // rank's own there too), then x, with this rank's own row read
          // straight from the caller's y (step 1 left its x out): swapped
          // in only now, so that no second pointer per row stays live
          // across the reduce (128 registers; the other order spilled).
          for (int q = lane; q < k; q += 32) {
            float acc = 0.0f;
            if (weights) {
              for (int r = 0; r < nt_rows; ++r) {
                acc += ((const float*)(trow[r] + 2 * h))[q];
              }
            }
            ((float*)(pr + pxb))[q] = acc;
          }
          if (y_in != nullptr && (mask >> local & 1)) {
            const i64 pos = (i64)((const i32*)(nvl + dl.bases))[src_rank] + meta[2 + local];
            trow[__popc(mask & ((1u << local) - 1u))] = (const u8*)(y_in + pos * h);
          }
          if (nt_rows == 0) {
            // A row with no target here (a malformed mask): zeros, as the
            // sum of nothing.
            for (int q0 = lane * 8; q0 < h; q0 += 256) {
              const float z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
              goep_inn_st8(pr + (u64)q0 * (pxb == 4 * h ? 4 : 2), pxb == 4 * h, z);
            }
          } else {
            goep_inn_reduce_any(nt_rows, trow, pr, pxb == 4 * h, h, lane);
          }
        }
        // This piece of the block's partial rows to the source's node (the
        // FIFO push fences after the barrier), and by units its word (or,
        // a unit a block, the block's after its last piece).
        __syncthreads();
        if (src != node && tid == 0 && !grp.grouped()) {
          put_partials(src, stride, a, b);
          if (by_units) {
            // (Planned here, not held across the reduce: registers.)
            const goep_inn_comb_units cu = goep_inn_comb_plan(rows, blk, red_cnt, grp, dl.put_bytes, stride,
                                                                 (dl.flags & GOEP_INN_FLAG_COMB_BLOCKS) != 0);
            if (!cu.per_block) {
              store_unit(src, cu.first + pc, cu.count, a, b);
            } else if (pc == pl.count - 1) {
              store_unit(src, cu.first, cu.count, lo, hi);
            }
          }
        }
      }
      if (src != node && grp.grouped() &&
          goep_inn_arrive((u32*)(out + 6) + i * grp.count + grp.idx, &last, grp.members) && tid == 0) {
        int ga, gb, unused;
        goep_inn_chunk(rows, grp.first, red_cnt, ga, unused);
        goep_inn_chunk(rows, grp.first + grp.members - 1, red_cnt, unused, gb);
        if (gb > ga) {
          put_partials(src, stride, ga, gb);
          if (by_units) {
            const goep_inn_comb_units cu = goep_inn_comb_plan(rows, blk, red_cnt, grp, dl.put_bytes, stride,
                                                                 (dl.flags & GOEP_INN_FLAG_COMB_BLOCKS) != 0);
            store_unit(src, cu.first, cu.count, ga, gb);
          }
        }
      }
    }
    if (by_units && relay_count[node] >= 0 && relay_count[node] <= dl.max_tokens) {
      // The own node's partials are in (written by this block's warps
      // above, before the barriers): each row's token (this rank's own,
      // meta[0] of its relay row) is summed now if the other nodes'
      // partials of it landed already. A pass of its own after the
      // reduce's loops: inside them the two shared registers, and spilled.
      int lo, hi;
      goep_inn_chunk(relay_count[node], blk, red_cnt, lo, hi);
      for (int j0 = lo; j0 < hi; j0 += warps) {
        if (tid == 0) {
          done_cnt = 0;
        }
        __syncthreads();
        const int j = j0 + warp;
        if (j < hi) {
          const i32* meta =
              (const i32*)(rdma + dl.relay + ((u64)node * dl.max_tokens + j) * dl.relay_row + dl.xb + 12ull * k);
          const i64 t = meta[0];
          if (t < 0 || t >= num_tokens) {
            if (lane == 0) {
              out[1] = 1;
            }
          } else if (goep_inn_contribute(goep_inn_pending(scratch, dl.max_tokens, nodes), t,
                                         goep_inn_token_need(t, nodes, scratch, sent_rows, dl.max_tokens, out, lane),
                                         lane) &&
                     lane == 0) {
            done_tok[atomicAdd(&done_cnt, 1)] = (int)t;
          }
        }
        __syncthreads();
        goep_inn_final_tokens_block(done_tok, done_cnt, h, k, nodes, node, weights, fp32, dl, scratch, bias0, bias1,
                                    out_x, out_w, rdma, out);
      }
    }
    if (goep_block_any_failed(!ok)) {
      return;
    }
    if (goep_inn_arrive(arrive + 1, &last, red_cnt) &&
        goep_block_any_failed(
            !goep_inn_count_to_nodes(rdma, dl.comb_counters, node, nodes, ports, GOEP_INN_STAGE_COMBINE_PUT))) {
      return;
    }
    GOEP_INN_TR(GOEP_INN_EV_C_REDUCED);

  }
  if (ro.recv && by_units) {
    // 3. As source, by units: the tokens with no partial anywhere (zeros
    // and the biases, a warp each), then every other node's units of
    // partials as they land, claimed by the receiver blocks a run of rows
    // at a time (two a warp) as the dispatch's forwarders claim relay
    // rows; the tokens whose last partial a claim brings are summed by the
    // whole block (goep_inn_final_tokens_block; the own node's partials
    // came from this rank's reducers above).
    for (i64 t = (i64)ro.r_idx * warps + warp; t < num_tokens; t += (i64)ro.r_cnt * warps) {
      if (goep_inn_token_need(t, nodes, scratch, sent_rows, dl.max_tokens, out, lane) == 0) {
        goep_inn_final_token<GOEP_INN_UNIT_GROUPS>(t, h, k, nodes, node, weights, fp32, dl, scratch, bias0, bias1,
                                                   out_x, out_w, rdma, out, lane);
      }
    }
    u64* const cwords = (u64*)(rdma + dl.comb_unit_words);
    u32* const cclaims = (u32*)(cwords + (u64)nodes * GOEP_INN_MAX_CUNITS);
    u32* const cdone = cclaims + (u64)nodes * GOEP_INN_MAX_CUNITS;
    const int chunk = 2 * warps;
    int turn = 0;  // unit words read so far (their shared slots alternate)
    for (int i = 1; i < nodes; ++i) {
      const int n = (node + i) % nodes;
      const int rows = sent_rows[n];
      if (rows <= 0) {
        continue;
      }
      if (rows > dl.max_tokens) {
        if (tid == 0) {
          out[1] = 1;
        }
        continue;
      }
      const u64* words = cwords + (u64)n * GOEP_INN_MAX_CUNITS;
      u32* claims = cclaims + (u64)n * GOEP_INN_MAX_CUNITS;
      u32* done = cdone + (u64)n * (GOEP_INN_MAX_CUNITS / 32);
      if (tid == 0) {
        int units = 0;
        ok &= goep_inn_unit_senders(words, 32, wd, wait_ids[p + n], (u32)(n * p + local), GOEP_INN_STAGE_COMBINE_NET,
                                    units);
        unit_idx[turn & 1] = units;
      }
      if (goep_block_any_failed(!ok)) {
        return;
      }
      const int units = unit_idx[turn & 1];
      ++turn;
      if (units <= 0 || units >= GOEP_INN_MAX_CUNITS) {
        if (tid == 0) {
          out[1] = 1;
        }
        continue;
      }
      for (int at = ro.r_idx % units;;) {
        if (tid == 0) {
          done_cnt = 0;  // ordered before its adds by the claim's barrier
        }
        int ub, first, end;
        if (!goep_inn_claim_block(words, claims, done, units, rows, at, chunk, wd, wait_ids[p + n],
                                  (u32)(n * p + local), GOEP_INN_STAGE_COMBINE_NET, unit_word, unit_idx, unit_claim,
                                  turn, ok, out, ub, first, end)) {
          return;
        }
        if (ub < 0) {
          break;  // every unit's rows are claimed
        }
        at = ub;
        for (int j = first + warp; j < end; j += warps) {
          const i64 t = goep_inn_token_of(scratch, dl.max_tokens, nodes)[(i64)n * dl.max_tokens + j];
          if (t < 0 || t >= num_tokens) {
            if (lane == 0) {
              out[1] = 1;
            }
            continue;
          }
          if (goep_inn_contribute(goep_inn_pending(scratch, dl.max_tokens, nodes), t,
                                  goep_inn_token_need(t, nodes, scratch, sent_rows, dl.max_tokens, out, lane), lane) &&
              lane == 0) {
            done_tok[atomicAdd(&done_cnt, 1)] = (int)t;
          }
        }
        __syncthreads();
        goep_inn_final_tokens_block(done_tok, done_cnt, h, k, nodes, node, weights, fp32, dl, scratch, bias0, bias1,
                                    out_x, out_w, rdma, out);
      }
    }
  }
  if (ro.recv) {
    // 3. As source: every node's partials landed; then the final reduce,
    // here by the receiver warps, or (reduce_apart) by
    // goep_internode_combine_reduce right after this kernel, on a grid of
    // its own. By units every token is summed already (above, or by the
    // reducers); the counters still advance every round, and the step
    // ends only after they landed.
    for (int j = tid; j < nodes; j += nt) {
      ok &= goep_wait_ge_u64_after((const u64*)(rdma + dl.comb_counters) + j, round, wd, wait_ids[p + j],
                                   (u32)(j * p + local), GOEP_INN_STAGE_COMBINE_NET);
    }
    if (goep_block_any_failed(!ok)) {
      return;
    }
    GOEP_INN_TR(GOEP_INN_EV_C_NET_LANDED);
    if (!reduce_apart && !by_units) {
      goep_inn_final_reduce((i64)ro.r_idx * warps + warp, (i64)ro.r_cnt * warps, num_tokens, h, k, nodes, node, weights,
                            fp32, dl, scratch, bias0, bias1, out_x, out_w, rdma, out, lane);
    }
  }
  GOEP_INN_TR(GOEP_INN_EV_C_EXIT);
  goep_inn_finish(arrive + 2, &last, g, dl, nodes, p, node, local, peer_nvl, ports, GOEP_INN_STAGE_COMBINE_PUT, epochs,
                  GOEP_INN_EPOCH_COMBINE, round, steps, out, by_units ? rdma : nullptr);
}

// The combine's final reduce as a kernel of its own (reduce_apart), on a
// grid as wide as the launcher asks (by default every SM): it runs after
// the last partial landed, where the combine kernel's few blocks would
// spend a few hundred microseconds at thousands of tokens (session 12's
// trace: 430 us of 16 blocks at 4096 tokens). It waits for nothing (stream
// order puts it after the combine kernel, whose receivers waited for every
// node's partials), so it needs no spin budget; it does nothing when that
// kernel gave up (status word not 1: partials may be missing). Nothing a
// peer writes later touches what it reads: the next partials into this
// rank's region need this rank's next dispatch, which stream order puts
// after it.
extern "C" __global__ void goep_internode_combine_reduce(int num_tokens, int hidden, int k, int nodes, int node,
                                                         int weights, int fp32, const goep_inn_dispatch_layout* dlp,
                                                         const i32* scratch, const u16* bias0, const u16* bias1,
                                                         u16* out_x, float* out_w, const u8* rdma, i32* out) {
  if (*(volatile const i32*)out != 1) {
    return;
  }
  const int warps = blockDim.x >> 5;
  const goep_inn_dispatch_layout dl = *dlp;
  goep_inn_final_reduce((i64)blockIdx.x * warps + (threadIdx.x >> 5), (i64)gridDim.x * warps, num_tokens, hidden, k,
                        nodes, node, weights, fp32, dl, scratch, bias0, bias1, out_x, out_w, rdma, out,
                        threadIdx.x & 31);
}
