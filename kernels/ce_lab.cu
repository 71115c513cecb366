// ce_lab.cu: a measurement aid, not part of the API. The load of
// TestCopyEngineLab (channels): blocks that keep SMs moving HBM (or only
// busy) for a fixed time, so a port put issued beside them shows how much
// of its copy-engine rate the SMs' memory traffic takes. The internode
// network leg runs exactly so: its puts go on a copy stream while the
// dispatch and combine kernels pack and unpack rows on the SMs.
#include "common.cuh"

enum goep_ce_load_mode : u32 {
  GOEP_CE_LOAD_COPY = 0,  // read src, write dst (a pack's traffic)
  GOEP_CE_LOAD_READ = 1,  // read src only
  GOEP_CE_LOAD_SPIN = 2,  // occupy the SMs, touch no memory
};

// Every block runs for ns nanoseconds of its own clock. Each round a
// thread moves 8 16-byte words at a stride of the grid (8 loads in flight,
// as the internode warp copy keeps), walking the n16 words of src and dst
// round after round. out[0] += bytes read, out[1] = the longest block's
// time (ns).
extern "C" __global__ void goep_ce_lab_load(const uint4* src, uint4* dst, u64 n16, u64 ns, u32 mode, u64* out) {
  const u64 t0 = goep_globaltimer();
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 span = 8 * stride;
  const u64 me = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64 base = 0;
  u64 moved = 0;
  u32 sink = 0;
  u64 now = t0;
  while (now - t0 < ns) {
    if (mode != GOEP_CE_LOAD_SPIN && n16 >= span) {
      uint4 v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[k] = src[base + me + k * stride];
      }
      if (mode == GOEP_CE_LOAD_COPY) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          dst[base + me + k * stride] = v[k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          sink ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        }
      }
      moved += 8 * 16;
      base += span;
      if (base + span > n16) {
        base = 0;
      }
    }
    now = goep_globaltimer();
  }
  if (sink == 0x9e3779b9u) {  // keeps the reads; practically never true
    dst[me] = make_uint4(sink, 0, 0, 0);
  }
  atomicAdd((unsigned long long*)&out[0], (unsigned long long)moved);
  if (threadIdx.x == 0) {
    atomicMax((unsigned long long*)&out[1], (unsigned long long)(now - t0));
  }
}
