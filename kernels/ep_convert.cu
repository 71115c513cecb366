// ep_convert.cu: small conversions for the ep API.
//
// goep_ep_widen_i32 widens n int32 top-k ids to int64 (sign-extended, so -1
// stays -1 and out-of-range ids stay out of range for the kernels that count
// them), for Dispatch with int32 ids: the notify and dispatch kernels read
// int64. Grid-stride, any grid; no host work, graph-capturable. The Go twin
// is in routing/widen.go; launched through routing.LaunchWidenIDs.
#include "common.cuh"

extern "C" __global__ void goep_ep_widen_i32(const i32* __restrict__ src, i64* __restrict__ dst, u64 n) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = (i64)__ldg(src + i);
  }
}
