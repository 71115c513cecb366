// coll_util.cu: generated test data and its check, for the collectives'
// tests and `ep-bench collectives`. Element i of rank r's data is a function
// of (seed, r, i) only (collectives/ref.FillElem, bit for bit), so a kernel
// can check any element of a collective's output without the inputs: 1 GiB
// results are verified where they are, and the host compares samples with
// the plain-Go reference.
#include "coll_common.cuh"

extern "C" {
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_fill(void* buf, u64 count, u32 dtype, u32 fill, u32 seed, u32 rank, u64 first);
__global__ void __launch_bounds__(GOEP_COLL_MAX_THREADS, 1)
    goep_coll_check(const void* buf, u64 count, u32 dtype, u32 op, u32 fill, u32 seed, u32 kind, u32 world, u32 rank,
                    u64 n, u64* out);
}

// Element i of rank's generated data (collectives/ref.FillElem).
__device__ __forceinline__ u32 goep_coll_fill_value(u32 dt, u32 fill, u32 seed, u32 rank, u64 i) {
  const u32 h = goep_pattern_value(i, seed ^ ((rank + 1u) * 0x9e3779b9u));
  if (fill == GOEP_COLL_FILL_SMALLINT) {
    return goep_coll_from_f32(dt, (float)((i32)(h % 17u) - 8));
  }
  if (dt == GOEP_COLL_FP8E4M3) {
    u32 b = h & 0xffu;
    if ((b & 0x7fu) == 0x7fu) {
      b ^= 1u;
    }
    return b;
  }
  return goep_coll_from_f32(dt, (float)((i32)(h >> 8) - (1 << 23)) * 4.76837158203125e-07f);  // * 2^-21
}

// The reduction over ranks of element i (rank order, collectives/ref).
__device__ __forceinline__ u32 goep_coll_expected_reduce(u32 dt, u32 op, u32 fill, u32 seed, u32 world, u64 i) {
  float acc = goep_coll_to_f32(dt, goep_coll_fill_value(dt, fill, seed, 0, i));
  for (u32 r = 1; r < world; ++r) {
    acc = goep_coll_combine_rt(op, acc, goep_coll_to_f32(dt, goep_coll_fill_value(dt, fill, seed, r, i)));
  }
  return goep_coll_from_f32(dt, acc);
}

// buf[i] = element first+i of rank's data, for i < count.
extern "C" __global__ void goep_coll_fill(void* buf, u64 count, u32 dtype, u32 fill, u32 seed, u32 rank, u64 first) {
  const u32 sz = goep_coll_dt_size(dtype);
  for (u64 i = goep_coll_gtid(); i < count; i += goep_coll_gthreads()) {
    goep_coll_st_elem((char*)buf, i, sz, goep_coll_fill_value(dtype, fill, seed, rank, first + i));
  }
}

// Checks count elements of a collective's output on rank `rank` of `world`
// against the generated inputs: kind GOEP_COLL_KIND_*; n is the per-rank
// count of allgather and reduce-scatter. out[0] += wrong elements;
// out[1] = min(out[1], first wrong index) (the host sets it to ~0 first).
extern "C" __global__ void goep_coll_check(const void* buf, u64 count, u32 dtype, u32 op, u32 fill, u32 seed, u32 kind,
                                           u32 world, u32 rank, u64 n, u64* out) {
  const u32 sz = goep_coll_dt_size(dtype);
  u64 bad = 0, first = ~0ull;
  for (u64 i = goep_coll_gtid(); i < count; i += goep_coll_gthreads()) {
    u32 want;
    if (kind == GOEP_COLL_KIND_ALLGATHER) {
      want = goep_coll_fill_value(dtype, fill, seed, (u32)(i / n), i % n);
    } else if (kind == GOEP_COLL_KIND_REDUCESCATTER) {
      want = goep_coll_expected_reduce(dtype, op, fill, seed, world, (u64)rank * n + i);
    } else {
      want = goep_coll_expected_reduce(dtype, op, fill, seed, world, i);
    }
    if (goep_coll_ld_elem((const char*)buf, i, sz) != want) {
      ++bad;
      first = min(first, i);
    }
  }
  if (bad != 0) {
    atomicAdd((unsigned long long*)&out[0], (unsigned long long)bad);
    atomicMin((unsigned long long*)&out[1], (unsigned long long)first);
  }
}
