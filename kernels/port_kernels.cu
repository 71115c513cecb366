// port_kernels.cu: kernels that exercise and measure the port channel
// device API (port_device.cuh) for the channels tests and `ep-bench
// channels`; channels/twins_port.go does exactly what these do on the host
// backend. Handle arrays are goep_port_channel arrays indexed by rank (this
// rank's own slot zero).
#include "channel_device.cuh"

extern "C" {
__global__ void __launch_bounds__(1024, 1)
    goep_port_stream(const goep_port_channel* chans, u32 to, u32 from, u32 me, u8* local, const u32* plan, u32 iters,
                     u32 seed, u64 src_base, u64 dst_base, u32 stage, u64* out);
}

__device__ __forceinline__ u64 goep_port_gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 goep_port_gthreads() { return (u64)gridDim.x * blockDim.x; }

// Pattern seed of rank's data in round i (channels/twins_port.go: portSeed).
__device__ __forceinline__ u32 goep_port_seed(u32 seed, u32 rank, u32 i) {
  return seed ^ (rank * 0x9e3779b9u) ^ (i * 0x85ebca6bu) ^ 0x27d4eb2fu;
}

// Byte j of the pattern with seed s.
__device__ __forceinline__ u8 goep_port_byte(u32 s, u64 j) { return (u8)(goep_pattern_value(j >> 2, s) >> (8 * (j & 3))); }

// The 64-bit value of atomic add i from a sender whose seed is s.
__device__ __forceinline__ u64 goep_port_add_value(u32 s, u64 i) {
  return (u64)goep_pattern_value(2 * i, s) | ((u64)goep_pattern_value(2 * i + 1, s) << 32);
}

// Ordered, byte-exact transfers over a ring, one block. Round i: the block
// writes its pattern for the round into local[src_base + src_off, +size);
// thread 0 sends it to rank `to` at dst_base + dst_off with the round's
// flavour (0 put_with_signal, 1 put then signal, 2
// put_with_signal_and_flush, 3 two puts then signal) and waits for the
// signal of rank `from`'s round i; the block then checks the bytes `from`
// sent (volatile loads: nothing stale from an earlier round in L1), thread
// 0 acknowledges to `from` and waits for `to`'s acknowledgement, after
// which both buffers may be reused. A signal that overtook its data shows
// as wrong bytes. plan holds {size, src_off, dst_off, flavour} per round,
// the same on every rank. out[0] += wrong bytes, out[1] = rounds done,
// out[2] = 1 if a wait gave up, out[3] = elapsed ns.
extern "C" __global__ void goep_port_stream(const goep_port_channel* chans, u32 to, u32 from, u32 me, u8* local,
                                            const u32* plan, u32 iters, u32 seed, u64 src_base, u64 dst_base,
                                            u32 stage, u64* out) {
  const goep_port_channel& tx = chans[to];
  const goep_port_channel& rx = chans[from];
  u64 bad = 0, rounds = 0;
  bool gave_up = false;
  const u64 t0 = goep_globaltimer();
  for (u32 i = 0; i < iters; ++i) {
    const u64 size = plan[4 * i], soff = src_base + plan[4 * i + 1], doff = dst_base + plan[4 * i + 2];
    const u32 flavour = plan[4 * i + 3] & 3;
    const u32 mine = goep_port_seed(seed, me, i), theirs = goep_port_seed(seed, from, i);
    for (u64 j = threadIdx.x; j < size; j += blockDim.x) {
      local[soff + j] = goep_port_byte(mine, j);
    }
    __syncthreads();
    bool ok = true;
    if (threadIdx.x == 0) {
      switch (flavour) {
        case 0:
          ok = goep_pc_put_with_signal(tx, doff, soff, size, stage);
          break;
        case 1:
          ok = goep_pc_put(tx, doff, soff, size, stage) && goep_pc_signal(tx, stage);
          break;
        case 2:
          ok = goep_pc_put_with_signal_and_flush(tx, doff, soff, size, stage);
          break;
        default: {
          const u64 h = size / 2;
          ok = goep_pc_put(tx, doff, soff, h, stage) && goep_pc_put(tx, doff + h, soff + h, size - h, stage) &&
               goep_pc_signal(tx, stage);
        }
      }
      ok = ok && goep_pc_wait(rx, stage);
    }
    if (goep_block_any_failed(!ok)) {
      gave_up = true;
      break;
    }
    const volatile u8* got = local + doff;
    for (u64 j = threadIdx.x; j < size; j += blockDim.x) {
      bad += (got[j] != goep_port_byte(theirs, j)) ? 1 : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      ok = goep_pc_signal(rx, stage) && goep_pc_wait(tx, stage);
    }
    if (goep_block_any_failed(!ok)) {
      gave_up = true;
      break;
    }
    ++rounds;
  }
  if (bad != 0) {
    atomicAdd((unsigned long long*)&out[0], (unsigned long long)bad);
  }
  if (threadIdx.x == 0) {
    out[1] = rounds;
    out[2] = gave_up ? 1 : 0;
    out[3] = goep_globaltimer() - t0;
  }
}

// adds concurrent atomic adds from every thread of the grid: add i goes to
// rank (me + 1 + i % (n-1)) % n, counter (i / (n-1)) % ncounters at
// counter_off (8-byte words), with value goep_port_add_value(seed of me,
// i). out[0] += threads whose push gave up.
extern "C" __global__ void goep_port_atomic_storm(const goep_port_channel* chans, u32 n, u32 me, u64 adds,
                                                  u64 counter_off, u32 ncounters, u32 seed, u32 stage, u64* out) {
  const u32 s = goep_port_seed(seed, me, 0);
  for (u64 i = goep_port_gtid(); i < adds; i += goep_port_gthreads()) {
    const u32 peer = (me + 1 + (u32)(i % (n - 1))) % n;
    const u64 off = counter_off + 8 * ((i / (n - 1)) % ncounters);
    if (!goep_pc_atomic_add(chans[peer], off, goep_port_add_value(s, i), stage)) {
      atomicAdd((unsigned long long*)out, 1ull);
      return;
    }
  }
}

// Thread t flushes channel t (t < n, channels that exist). out[0] += flushes
// that gave up.
extern "C" __global__ void goep_port_flush_all(const goep_port_channel* chans, u32 n, u32 stage, u64* out) {
  const u64 t = goep_port_gtid();
  if (t < n && chans[t].fifo.triggers != nullptr && !goep_pc_flush(chans[t], stage)) {
    atomicAdd((unsigned long long*)out, 1ull);
  }
}

// Signal/wait ping-pong through the proxies on channel idx, one thread:
// the initiator signals then waits, the responder waits then signals.
// out[0] = rounds done, out[1] = elapsed ns.
extern "C" __global__ void goep_port_pingpong(const goep_port_channel* chans, u32 idx, u64 iters, u32 initiator,
                                              u32 stage, u64* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const goep_port_channel& ch = chans[idx];
  u64 done = 0;
  const u64 t0 = goep_globaltimer();
  for (u64 i = 0; i < iters; ++i) {
    const bool ok = initiator != 0 ? (goep_pc_signal(ch, stage) && goep_pc_wait(ch, stage))
                                   : (goep_pc_wait(ch, stage) && goep_pc_signal(ch, stage));
    if (!ok) {
      break;
    }
    ++done;
  }
  out[0] = done;
  out[1] = goep_globaltimer() - t0;
}

// iters puts of bytes on channel idx, then one flush, one thread. out[0] =
// 1 when the flush completed, out[1] = elapsed ns (first push to flush).
extern "C" __global__ void goep_port_put_bench(const goep_port_channel* chans, u32 idx, u64 dst_off, u64 src_off,
                                               u64 bytes, u32 iters, u32 stage, u64* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const goep_port_channel& ch = chans[idx];
  const u64 t0 = goep_globaltimer();
  bool ok = true;
  for (u32 i = 0; i < iters && ok; ++i) {
    ok = goep_pc_put(ch, dst_off, src_off, bytes, stage);
  }
  ok = ok && goep_pc_flush(ch, stage);
  out[0] = ok ? 1 : 0;
  out[1] = goep_globaltimer() - t0;
}

// One block: every thread pushes its share of adds atomic adds of 1 on
// channel idx, to counter k % ncounters at counter_off; then thread 0
// flushes. out[0] += pushes that gave up, out[1] = elapsed ns (first push
// to flush).
extern "C" __global__ void goep_port_atomic_rate(const goep_port_channel* chans, u32 idx, u64 adds, u64 counter_off,
                                                 u32 ncounters, u32 stage, u64* out) {
  const goep_port_channel& ch = chans[idx];
  __syncthreads();
  const u64 t0 = goep_globaltimer();
  bool ok = true;
  for (u64 k = threadIdx.x; k < adds && ok; k += blockDim.x) {
    ok = goep_pc_atomic_add(ch, counter_off + 8 * (k % ncounters), 1, stage);
  }
  if (goep_block_any_failed(!ok)) {
    if (threadIdx.x == 0) {
      atomicAdd((unsigned long long*)out, 1ull);
    }
    return;
  }
  if (threadIdx.x == 0) {
    if (!goep_pc_flush(ch, stage)) {
      atomicAdd((unsigned long long*)out, 1ull);
    }
    out[1] = goep_globaltimer() - t0;
  }
}

// Thread 0 pushes count signals on channel idx, then a flush when flush is
// set. out[0] = signals pushed, out[1] = 1 when everything (flush included)
// completed. For back-pressure and timeout checks.
extern "C" __global__ void goep_port_signal_burst(const goep_port_channel* chans, u32 idx, u32 count, u32 flush,
                                                  u32 stage, u64* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const goep_port_channel& ch = chans[idx];
  u64 pushed = 0;
  bool ok = true;
  for (u32 i = 0; i < count && ok; ++i) {
    ok = goep_pc_signal(ch, stage);
    pushed += ok ? 1 : 0;
  }
  if (ok && flush != 0) {
    ok = goep_pc_flush(ch, stage);
  }
  out[0] = pushed;
  out[1] = ok ? 1 : 0;
}
