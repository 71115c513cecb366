// coll_bulk.cu: the bandwidth collectives (large messages), through the
// scratch buffers or zero-copy on registered user buffers.
//
// Block b of every rank pairs with block b of every other rank: it uses the
// semaphores [b][peer] and the scratch slots of index b only, and every
// rank runs the same grid for the same call, so signals and waits balance
// per semaphore in every call. Every kernel starts with a barrier of each
// block with its peers: a peer that has passed it has finished its previous
// launch, so its scratch (which the previous collective may still have been
// reading) and its user buffers are free to write.
//
// Call fingerprints (coll_common.cuh): each block's entry barrier (or
// descriptor exchange) signals every peer with this launch's tag in the
// semaphore value and checks each peer's tag as its signal arrives, so no
// block moves data, reads a peer's descriptor or writes a peer's buffer
// before it knows every peer makes the same call (kind, dtype, op, count,
// algorithm and grid: what the rounds, the slots and the semaphore counts
// depend on). Every wait that is behind watches the fingerprint words.
//
// Scratch kernels walk their data in rounds of parts * cell elements
// (collectives/abi.PlanRounds): block b owns cell b of every part in every
// round. Zero-copy kernels deal 16-byte vectors over the whole grid.
#include "coll_common.cuh"

extern "C" {
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1) goep_coll_ar_rsag(const goep_coll_ctx* ctx, const void* in,
                                                                            void* out, u64 count, u32 dtype, u32 op,
                                                                            u64 cell, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ag_scratch(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes, u64 cell, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1) goep_coll_rs_scratch(const goep_coll_ctx* ctx,
                                                                               const void* in, void* out, u64 count,
                                                                               u32 dtype, u32 op, u64 cell, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ar_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype, u32 op, u32 in_reg,
                    u64 in_off, u32 out_reg, u64 out_off, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_ag_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes, u32 out_reg, u64 out_off, u64 shape);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_rs_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype, u32 op, u32 in_reg,
                    u64 in_off, u64 shape);
}

// The data movers of the scratch kernels, kept out of line so that each
// gets its own registers (inlined into the round loop next to the
// reduction they spill).
__device__ __noinline__ void goep_coll_push(char* dst, const char* src, u64 bytes, u32 tid, u32 n) {
  goep_copy(dst, src, bytes, tid, n);
}
__device__ __noinline__ void goep_coll_pull(char* dst, const char* src, u64 bytes, u32 tid, u32 n) {
  goep_coll_copy_fresh(dst, src, bytes, tid, n);
}

// Rounds of a scratch kernel (collectives/abi.Rounds): full rounds of
// `cell` elements per part, then one of `last` (the remainder spread evenly,
// whole vectors).
struct goep_coll_rounds {
  u64 cell, last, full, total;
};

__device__ __forceinline__ goep_coll_rounds goep_coll_plan(u64 total, u64 parts, u64 cell, u64 vec) {
  goep_coll_rounds r;
  r.cell = cell;
  const u64 per = parts * cell;
  r.full = total / per;
  const u64 rem = total - r.full * per;
  r.total = r.full;
  r.last = 0;
  if (rem > 0) {
    const u64 cl = (rem + parts - 1) / parts;
    r.last = (cl + vec - 1) / vec * vec;
    r.total += 1;
  }
  return r;
}

// Where round k starts (element index) and its cell size.
__device__ __forceinline__ void goep_coll_round(const goep_coll_rounds& r, u64 parts, u64 k, u64& base, u64& cs) {
  if (k < r.full) {
    cs = r.cell;
    base = k * parts * r.cell;
  } else {
    cs = r.last;
    base = r.full * parts * r.cell;
  }
}

// Elements of [start, start+cs) inside [0, total).
__device__ __forceinline__ u64 goep_coll_len(u64 start, u64 cs, u64 total) {
  return start < total ? min(cs, total - start) : 0;
}

// ---------------------------------------------------------------------------
// Allreduce through the scratch (reduce-scatter then allgather). Per round,
// block b of rank i:
//   1. puts cell (p, b) of its input into rank p's RS slot [i][b], for every
//      peer p; barrier;
//   2. reduces cell (i, b): its own input and the W-1 RS slots, in rank
//      order; stores the result to its output and into every peer's AG slot
//      [i][b]; barrier;
//   3. copies every peer's reduced cell from its AG slot [p][b] to the
//      output.
// One buffer per slot suffices: a rank writes RS slot [i][b] of round k+1
// after the owner's step-2 barrier of round k, which follows the owner's
// reduction of round k; and the owner writes AG slot [p][b] of round k+1
// after this rank's step-1 barrier of round k+1, which follows this rank's
// step 3 of round k. Scratch: 2 * W * blocks * cell elements.
template <int DT>
__device__ __forceinline__ bool goep_coll_ar_rsag_run(const goep_coll_ctx& c, const char* in, char* out, u64 count,
                                                      u64 cell, u32 op, u64 fp) {
  typedef goep_coll_type<DT> T;
  const u64 E = T::size, V = 16 / E;
  const u32 me = c.rank, W = c.world, nb = gridDim.x, b = blockIdx.x;
  const u64 parts = (u64)W * nb;
  const goep_coll_rounds r = goep_coll_plan(count, parts, cell, V);
  const bool vec = (((u64)in | (u64)out) & 15) == 0;
  const u32 tid = threadIdx.x, nt = blockDim.x;
  const u64 slot = cell * E;
  char* const mine = c.scratch[me];
  if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_ENTRY, true)) {
    return false;
  }
  for (u64 k = 0; k < r.total; ++k) {
    u64 rb, cs;
    goep_coll_round(r, parts, k, rb, cs);
    for (u32 j = 1; j < W; ++j) {
      const u32 p = goep_coll_peer(c, j);
      const u64 st = rb + ((u64)p * nb + b) * cs;
      goep_coll_push(c.scratch[p] + ((u64)me * nb + b) * slot, in + st * E, goep_coll_len(st, cs, count) * E, tid, nt);
    }
    if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_RS_DATA)) {
      return false;
    }
    {
      const u64 st = rb + ((u64)me * nb + b) * cs;
      const char* srcs[GOEP_COLL_MAX_RANKS];
      char* dsts[GOEP_COLL_MAX_RANKS];
#pragma unroll
      for (u32 q = 0; q < GOEP_COLL_MAX_RANKS; ++q) {
        srcs[q] = (q == me) ? in + st * E : mine + ((u64)q * nb + b) * slot;
        dsts[q] = (q == 0) ? out + st * E : c.scratch[goep_coll_peer(c, q % W)] + ((u64)(W + me) * nb + b) * slot;
      }
      goep_coll_reduce_range<DT>(srcs, W, dsts, W, goep_coll_len(st, cs, count), vec, tid, nt, op);
    }
    if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_AG_DATA)) {
      return false;
    }
    for (u32 j = 1; j < W; ++j) {
      const u32 p = goep_coll_peer(c, W - j);
      const u64 st = rb + ((u64)p * nb + b) * cs;
      goep_coll_pull(out + st * E, mine + ((u64)(W + p) * nb + b) * slot, goep_coll_len(st, cs, count) * E, tid, nt);
    }
  }
  return true;
}

extern "C" __global__ void goep_coll_ar_rsag(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                             u32 op, u64 cell, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_ar_rsag_run, c, (const char*)in, (char*)out, count, cell, op, fp);
  if (ok) {
    goep_coll_end(c);
  }
}

// ---------------------------------------------------------------------------
// Allgather through the scratch. Per round, block b puts its cell of the
// input into every peer's slot [half][rank][b], barrier, then copies every
// peer's cell out of its own slots. Slots alternate between two halves by
// round: a rank writes a half again two rounds later, after the peer's
// barrier of the round in between, which follows the peer's copy-out of the
// first. Scratch: 2 halves * W * blocks * cell bytes.
__device__ __forceinline__ bool goep_coll_ag_scratch_run(const goep_coll_ctx& c, const char* in, char* out, u64 bytes,
                                                         u64 cell, u64 fp) {
  const u32 me = c.rank, W = c.world, nb = gridDim.x, b = blockIdx.x;
  const goep_coll_rounds r = goep_coll_plan(bytes, nb, cell, 16);
  const u32 tid = threadIdx.x, nt = blockDim.x;
  char* const mine = c.scratch[me];
  char* const own = out + (u64)me * bytes;
  if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_ENTRY, true)) {
    return false;
  }
  for (u64 k = 0; k < r.total; ++k) {
    const u64 h = k & 1;
    u64 rb, cs;
    goep_coll_round(r, nb, k, rb, cs);
    const u64 st = rb + (u64)b * cs, len = goep_coll_len(st, cs, bytes);
    for (u32 j = 1; j < W; ++j) {
      const u32 p = goep_coll_peer(c, j);
      goep_coll_push(c.scratch[p] + ((h * W + me) * nb + b) * cell, in + st, len, tid, nt);
    }
    if (own != in) {
      goep_coll_push(own + st, in + st, len, tid, nt);
    }
    if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_AG_DATA)) {
      return false;
    }
    for (u32 j = 1; j < W; ++j) {
      const u32 p = goep_coll_peer(c, W - j);
      goep_coll_pull(out + (u64)p * bytes + st, mine + ((h * W + p) * nb + b) * cell, len, tid, nt);
    }
  }
  return true;
}

extern "C" __global__ void goep_coll_ag_scratch(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes,
                                                u64 cell, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  if (goep_coll_ag_scratch_run(c, (const char*)in, (char*)out, bytes, cell, fp)) {
    goep_coll_end(c);
  }
}

// ---------------------------------------------------------------------------
// Reduce-scatter through the scratch. Per round, block b puts its cell of
// part p of the input into rank p's slot [half][rank][b], barrier, then
// reduces its own part's cell (own input and the W-1 slots, rank order)
// into the output. Halves alternate by round as in the allgather.
template <int DT>
__device__ __forceinline__ bool goep_coll_rs_scratch_run(const goep_coll_ctx& c, const char* in, char* out, u64 count,
                                                         u64 cell, u32 op, u64 fp) {
  typedef goep_coll_type<DT> T;
  const u64 E = T::size, V = 16 / E;
  const u32 me = c.rank, W = c.world, nb = gridDim.x, b = blockIdx.x;
  const goep_coll_rounds r = goep_coll_plan(count, nb, cell, V);
  const u32 tid = threadIdx.x, nt = blockDim.x;
  const u64 slot = cell * E;
  char* const mine = c.scratch[me];
  const char* const own = in + (u64)me * count * E;
  const bool vec = (((u64)own | (u64)out) & 15) == 0;
  if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_ENTRY, true)) {
    return false;
  }
  for (u64 k = 0; k < r.total; ++k) {
    const u64 h = k & 1;
    u64 rb, cs;
    goep_coll_round(r, nb, k, rb, cs);
    const u64 st = rb + (u64)b * cs, len = goep_coll_len(st, cs, count);
    for (u32 j = 1; j < W; ++j) {
      const u32 p = goep_coll_peer(c, j);
      goep_coll_push(c.scratch[p] + ((h * W + me) * nb + b) * slot, in + ((u64)p * count + st) * E, len * E, tid, nt);
    }
    if (!goep_coll_barrier(c, fp, GOEP_COLL_STAGE_RS_DATA)) {
      return false;
    }
    const char* srcs[GOEP_COLL_MAX_RANKS];
    char* dsts[GOEP_COLL_MAX_RANKS];
#pragma unroll
    for (u32 q = 0; q < GOEP_COLL_MAX_RANKS; ++q) {
      srcs[q] = (q == me) ? own + st * E : mine + ((h * W + q) * nb + b) * slot;
      dsts[q] = out + st * E;
    }
    goep_coll_reduce_range<DT>(srcs, W, dsts, 1, len, vec, tid, nt, op);
  }
  return true;
}

extern "C" __global__ void goep_coll_rs_scratch(const goep_coll_ctx* ctx, const void* in, void* out, u64 count,
                                                u32 dtype, u32 op, u64 cell, u64 shape) {
  __shared__ goep_coll_ctx c;
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  bool ok;
  GOEP_COLL_DISPATCH_R(ok, dtype, goep_coll_rs_scratch_run, c, (const char*)in, (char*)out, count, cell, op, fp);
  if (ok) {
    goep_coll_end(c);
  }
}

// ---------------------------------------------------------------------------
// Zero-copy kernels on registered buffers: the entry barrier exchanges
// descriptors (goep_coll_exchange), so each rank knows every peer's send
// and recv pointers as mapped on its GPU; the exit barrier keeps a rank in
// the kernel until every peer has finished reading its input and writing
// its output.

__device__ __forceinline__ bool goep_coll_all_aligned(const char* const* p, u32 W) {
  u64 bits = 0;
  for (u32 q = 0; q < W; ++q) {
    bits |= (u64)p[q];
  }
  return (bits & 15) == 0;
}

// Allreduce: rank i reduces piece i (P elements, whole vectors) reading
// every rank's input directly, and writes the result into every rank's
// output.
template <int DT>
__device__ __forceinline__ void goep_coll_ar_zc_run(const goep_coll_ctx& c, const char* const* s_in,
                                                    char* const* s_out, u64 count, u32 op) {
  typedef goep_coll_type<DT> T;
  const u64 E = T::size, V = 16 / E;
  const u32 me = c.rank, W = c.world;
  const u64 P = ((count + W - 1) / W + V - 1) / V * V;
  const u64 lo = (u64)me * P, len = goep_coll_len(lo, P, count);
  const bool vec = goep_coll_all_aligned(s_in, W) && goep_coll_all_aligned((const char* const*)s_out, W);
  const char* srcs[GOEP_COLL_MAX_RANKS];
  char* dsts[GOEP_COLL_MAX_RANKS];
#pragma unroll
  for (u32 q = 0; q < GOEP_COLL_MAX_RANKS; ++q) {
    srcs[q] = (q < W) ? s_in[q] + lo * E : nullptr;
    dsts[q] = (q < W) ? s_out[goep_coll_peer(c, q)] + lo * E : nullptr;
  }
  goep_coll_reduce_range<DT>(srcs, W, dsts, W, len, vec, goep_coll_gtid(), goep_coll_gthreads(), op);
}

extern "C" __global__ void goep_coll_ar_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                           u32 op, u32 in_reg, u64 in_off, u32 out_reg, u64 out_off, u64 shape) {
  __shared__ goep_coll_ctx c;
  __shared__ const char* s_in[GOEP_COLL_MAX_RANKS];
  __shared__ char* s_out[GOEP_COLL_MAX_RANKS];
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  if (!goep_coll_exchange(c, fp, in_reg, in_off, out_reg, out_off, (const char*)in, (char*)out, s_in, s_out)) {
    return;
  }
  GOEP_COLL_DISPATCH(dtype, goep_coll_ar_zc_run, c, s_in, s_out, count, op);
  if (goep_coll_barrier(c, fp, GOEP_COLL_STAGE_EXIT)) {
    goep_coll_end(c);
  }
}

// Allgather: every rank writes its input into every rank's output at its
// own position.
extern "C" __global__ void goep_coll_ag_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 bytes, u32 out_reg,
                                           u64 out_off, u64 shape) {
  __shared__ goep_coll_ctx c;
  __shared__ const char* s_in[GOEP_COLL_MAX_RANKS];
  __shared__ char* s_out[GOEP_COLL_MAX_RANKS];
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  if (!goep_coll_exchange(c, fp, GOEP_COLL_NO_REG, 0, out_reg, out_off, (const char*)in, (char*)out, s_in, s_out)) {
    return;
  }
  const u32 tid = (u32)goep_coll_gtid(), n = (u32)goep_coll_gthreads();
  const u64 at = (u64)c.rank * bytes;
  for (u32 j = 1; j < c.world; ++j) {
    goep_copy(s_out[goep_coll_peer(c, j)] + at, in, bytes, tid, n);
  }
  if ((const void*)((char*)out + at) != in) {
    goep_copy((char*)out + at, in, bytes, tid, n);
  }
  if (goep_coll_barrier(c, fp, GOEP_COLL_STAGE_EXIT)) {
    goep_coll_end(c);
  }
}

// Reduce-scatter: rank i reduces part i reading every rank's input
// directly.
template <int DT>
__device__ __forceinline__ void goep_coll_rs_zc_run(const goep_coll_ctx& c, const char* const* s_in, char* out,
                                                    u64 count, u32 op) {
  typedef goep_coll_type<DT> T;
  const u64 E = T::size;
  const u32 me = c.rank, W = c.world;
  const char* srcs[GOEP_COLL_MAX_RANKS];
  char* dsts[GOEP_COLL_MAX_RANKS];
#pragma unroll
  for (u32 q = 0; q < GOEP_COLL_MAX_RANKS; ++q) {
    srcs[q] = (q < W) ? s_in[q] + (u64)me * count * E : nullptr;
    dsts[q] = out;
  }
  const bool vec = goep_coll_all_aligned(srcs, W) && (((u64)out & 15) == 0);
  goep_coll_reduce_range<DT>(srcs, W, dsts, 1, count, vec, goep_coll_gtid(), goep_coll_gthreads(), op);
}

extern "C" __global__ void goep_coll_rs_zc(const goep_coll_ctx* ctx, const void* in, void* out, u64 count, u32 dtype,
                                           u32 op, u32 in_reg, u64 in_off, u64 shape) {
  __shared__ goep_coll_ctx c;
  __shared__ const char* s_in[GOEP_COLL_MAX_RANKS];
  __shared__ char* s_out[GOEP_COLL_MAX_RANKS];
  const u64 fp = goep_coll_begin(c, ctx, shape);
  if (fp == 0) {
    return;
  }
  if (!goep_coll_exchange(c, fp, in_reg, in_off, GOEP_COLL_NO_REG, 0, (const char*)in, (char*)out, s_in, s_out)) {
    return;
  }
  GOEP_COLL_DISPATCH(dtype, goep_coll_rs_zc_run, c, s_in, (char*)out, count, op);
  if (goep_coll_barrier(c, fp, GOEP_COLL_STAGE_EXIT)) {
    goep_coll_end(c);
  }
}
