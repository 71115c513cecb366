// channel_kernels.cu: kernels that exercise and measure the channel device
// API (channel_device.cuh) for the channels tests, `ep-bench channels` and
// the host-backend twins in channels/twins.go, which do exactly what
// these do. Handle arrays come by device pointer; sem handles are addressed
// as (base, stride) so that one kernel serves arrays of goep_semaphore
// (stride 48) and of goep_memory_channel (stride 128, the semaphore first).
#include "channel_device.cuh"

// Declarations that carry launch bounds: these kernels run with up to 1024
// threads per block, so registers are capped at 64 (the compiler would
// otherwise be free to use more and the launch would fail). The
// definitions below keep the one-line `extern "C" __global__ void name(`
// form that the kernel registry test recognises.
extern "C" {
__global__ void __launch_bounds__(1024, 1) goep_chan_put(const goep_memory_channel* chans, u32 idx, u64 dst_off,
                                                         u64 src_off, u64 bytes, u32 signal);
__global__ void __launch_bounds__(1024, 1) goep_chan_get(const goep_memory_channel* chans, u32 idx, u64 remote_off,
                                                         u64 local_off, u64 bytes);
__global__ void __launch_bounds__(1024, 1)
    goep_chan_put_all(const goep_memory_channel* chans, u32 nchans, u64 bytes, u64 src_stride, u64 dst_off);
}

__device__ __forceinline__ u32 goep_chan_gtid() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u32 goep_chan_gthreads() { return gridDim.x * blockDim.x; }

__device__ __forceinline__ const goep_semaphore& goep_chan_sem_at(const char* handles, u32 stride, u32 i) {
  return *(const goep_semaphore*)(handles + (u64)i * stride);
}

// The whole grid puts local[src_off, +bytes) into the peer's
// remote[dst_off]; then, when signal is set, every block signals once after
// its own part (so the receiver waits gridDim.x times).
extern "C" __global__ void goep_chan_put(const goep_memory_channel* chans, u32 idx, u64 dst_off, u64 src_off, u64 bytes,
                                         u32 signal) {
  const goep_memory_channel& ch = chans[idx];
  goep_mc_put(ch, dst_off, src_off, bytes, goep_chan_gtid(), goep_chan_gthreads());
  if (signal != 0) {
    __syncthreads();
    if (threadIdx.x == 0) {
      goep_mc_signal(ch);
    }
  }
}

// The whole grid gets the peer's remote[remote_off, +bytes) into
// local[local_off].
extern "C" __global__ void goep_chan_get(const goep_memory_channel* chans, u32 idx, u64 remote_off, u64 local_off,
                                         u64 bytes) {
  goep_mc_get(chans[idx], remote_off, local_off, bytes, goep_chan_gtid(), goep_chan_gthreads());
}

// Thread 0 of block b signals handle first+b count times (relaxed != 0:
// relaxed signals).
extern "C" __global__ void goep_chan_sem_signal(const char* handles, u32 stride, u32 first, u32 count, u32 relaxed) {
  if (threadIdx.x != 0) {
    return;
  }
  const goep_semaphore& s = goep_chan_sem_at(handles, stride, first + blockIdx.x);
  for (u32 i = 0; i < count; ++i) {
    if (relaxed != 0) {
      goep_sem_relaxed_signal(s);
    } else {
      goep_sem_signal(s);
    }
  }
}

// Thread 0 of block b consumes count signals of handle first+b: mode 0
// wait, 1 relaxed wait, 2 a bounded loop of polls. out[4b..4b+3] = signals
// consumed, inbound token after, expected counter after, polls that found
// nothing.
extern "C" __global__ void goep_chan_sem_wait(const char* handles, u32 stride, u32 first, u32 count, u32 mode,
                                              u32 stage, u64* out) {
  if (threadIdx.x != 0) {
    return;
  }
  const goep_semaphore& s = goep_chan_sem_at(handles, stride, first + blockIdx.x);
  u64 done = 0, empty = 0;
  for (u32 i = 0; i < count; ++i) {
    bool ok;
    if (mode == 0) {
      ok = goep_sem_wait(s, stage);
    } else if (mode == 1) {
      ok = goep_sem_relaxed_wait(s, stage);
    } else {
      goep_spin sp = goep_spin_start();
      ok = true;
      while (!goep_sem_poll(s)) {
        ++empty;
        if (!goep_spin_ok(sp, s.wd, GOEP_OP_SEM_POLL, s.id, s.peer, stage, goep_sem_expected(s) + 1,
                          goep_chan_ld_relaxed_sys_u64(s.inbound))) {
          ok = false;
          break;
        }
      }
    }
    if (!ok) {
      break;
    }
    ++done;
  }
  u64* o = out + 4ull * blockIdx.x;
  o[0] = done;
  o[1] = goep_chan_ld_relaxed_sys_u64(s.inbound);
  o[2] = goep_sem_expected(s);
  o[3] = empty;
}

// Ping-pong on channel idx, one thread: the initiator signals then waits,
// the responder waits then signals, iters times. With data, each round
// also carries its number: the sender stores it into word 0 of the peer's
// buffer before signalling and the receiver checks word 0 of its own after
// waiting, which fails if the signal overtook the data. relaxed uses the
// relaxed signal and wait, with explicit system-scope fences around them
// when there is data to order (without data: the bare relaxed round trip).
// out = rounds done, data mismatches, elapsed ns.
extern "C" __global__ void goep_chan_pingpong(const goep_memory_channel* chans, u32 idx, u64 iters, u32 initiator,
                                              u32 with_data, u32 relaxed, u32 stage, u64* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const goep_memory_channel& ch = chans[idx];
  volatile u64* mine = (volatile u64*)ch.local;
  volatile u64* theirs = (volatile u64*)ch.remote;
  u64 done = 0, bad = 0;
  const u64 t0 = goep_globaltimer();
  for (u64 i = 1; i <= iters; ++i) {
    bool ok;
    if (initiator != 0) {
      if (with_data != 0) {
        *theirs = i;
      }
      if (relaxed != 0) {
        if (with_data != 0) {
          goep_fence_acq_rel_sys();
        }
        goep_sem_relaxed_signal(ch.sem);
        ok = goep_sem_relaxed_wait(ch.sem, stage);
        if (with_data != 0) {
          goep_fence_acq_rel_sys();
        }
      } else {
        goep_sem_signal(ch.sem);
        ok = goep_sem_wait(ch.sem, stage);
      }
      if (!ok) {
        break;
      }
      if (with_data != 0 && *mine != i) {
        ++bad;
      }
    } else {
      if (relaxed != 0) {
        ok = goep_sem_relaxed_wait(ch.sem, stage);
        if (with_data != 0) {
          goep_fence_acq_rel_sys();
        }
      } else {
        ok = goep_sem_wait(ch.sem, stage);
      }
      if (!ok) {
        break;
      }
      if (with_data != 0) {
        if (*mine != i) {
          ++bad;
        }
        *theirs = i;
      }
      if (relaxed != 0) {
        if (with_data != 0) {
          goep_fence_acq_rel_sys();
        }
        goep_sem_relaxed_signal(ch.sem);
      } else {
        goep_sem_signal(ch.sem);
      }
    }
    ++done;
  }
  out[0] = done;
  out[1] = bad;
  out[2] = goep_globaltimer() - t0;
}

// LL exchange of a byte range: this rank packs local[src_off, +bytes) into
// the send channel's peer packet buffer and unpacks the packets its recv
// channel's peer sent into local[dst_off]. Both use the half of the packet
// buffers that the flag's parity picks (pkt_half bytes apart). proto is 16
// or 8. out[0] += threads whose wait gave up.
extern "C" __global__ void goep_chan_ll_exchange(const goep_memory_channel* chans, u32 send_idx, u32 recv_idx,
                                                 u32 proto, u64 src_off, u64 dst_off, u64 bytes, u64 pkt_half,
                                                 u32 stage, u64* out) {
  const goep_memory_channel& snd = chans[send_idx];
  const goep_memory_channel& rcv = chans[recv_idx];
  const u32 flag = goep_ll_flag_begin(rcv.flag);
  const u64 pkt_off = goep_ll_half(flag) * pkt_half;
  const u32 tid = goep_chan_gtid(), n = goep_chan_gthreads();
  bool ok;
  if (proto == 16) {
    goep_mc_put_ll16(snd, pkt_off, src_off, bytes, flag, tid, n);
    ok = goep_mc_unpack_ll16(rcv, dst_off, pkt_off, bytes, flag, tid, n, stage);
  } else {
    goep_mc_put_ll8(snd, pkt_off, src_off, bytes, flag, tid, n);
    ok = goep_mc_unpack_ll8(rcv, dst_off, pkt_off, bytes, flag, tid, n, stage);
  }
  if (!ok) {
    atomicAdd((unsigned long long*)out, 1ull);
  }
  goep_ll_flag_end(rcv.flag, flag);
}

// Seeds of the generated LL payload: a function of the sender's rank and the
// flag, so a packet left over from another round or sender fails the check.
__device__ __forceinline__ u32 goep_chan_ll_seed(u32 seed, u32 sender, u32 flag) {
  return seed ^ (sender * 0x9e3779b9u) ^ (flag * 0x85ebca6bu);
}

// iters rounds of an LL exchange of generated data, checked in the kernel:
// round r sends `words` payload words (u32 for LL8, u64 for LL16) made from
// goep_pattern_value with goep_chan_ll_seed(seed, me, flag) and checks what
// arrives against the recv channel's peer's seed for the same flag. Used for
// graph replays (a stale packet would be accepted only with a stale flag,
// and would then fail the check) and for LL latency. out[0] += wrong words,
// out[1] += threads that gave up; block 0 thread 0 sets out[2] = rounds it
// completed and out[3] = elapsed ns.
extern "C" __global__ void goep_chan_ll_pattern(const goep_memory_channel* chans, u32 send_idx, u32 recv_idx, u32 proto,
                                                u32 me, u64 words, u64 pkt_off, u64 pkt_half, u32 seed, u32 iters,
                                                u32 stage, u64* out) {
  const goep_memory_channel& snd = chans[send_idx];
  const goep_memory_channel& rcv = chans[recv_idx];
  const u32 tid = goep_chan_gtid(), n = goep_chan_gthreads();
  const u32 from = rcv.sem.peer;
  u32 flag = goep_ll_flag_begin(rcv.flag);
  u32 last = flag;
  u64 bad = 0, rounds = 0;
  bool ok = true;
  const u64 t0 = goep_globaltimer();
  for (u32 r = 0; r < iters && ok; ++r) {
    const u64 base = pkt_off + goep_ll_half(flag) * pkt_half;
    const u32 mine = goep_chan_ll_seed(seed, me, flag);
    const u32 theirs = goep_chan_ll_seed(seed, from, flag);
    if (proto == 16) {
      for (u64 k = tid; k < words; k += n) {
        const u64 v = (u64)goep_pattern_value(2 * k, mine) | ((u64)goep_pattern_value(2 * k + 1, mine) << 32);
        goep_mc_write_ll16(snd, base, k, v, flag);
      }
      for (u64 k = tid; k < words; k += n) {
        u64 v;
        if (!goep_mc_read_ll16(rcv, base, k, flag, v, stage)) {
          ok = false;
          break;
        }
        const u64 want =
            (u64)goep_pattern_value(2 * k, theirs) | ((u64)goep_pattern_value(2 * k + 1, theirs) << 32);
        bad += (v != want) ? 1 : 0;
      }
    } else {
      for (u64 k = tid; k < words; k += n) {
        goep_mc_write_ll8(snd, base, k, goep_pattern_value(k, mine), flag);
      }
      for (u64 k = tid; k < words; k += n) {
        u32 v;
        if (!goep_mc_read_ll8(rcv, base, k, flag, v, stage)) {
          ok = false;
          break;
        }
        bad += (v != goep_pattern_value(k, theirs)) ? 1 : 0;
      }
    }
    if (ok) {
      ++rounds;
    }
    last = flag;
    flag = goep_ll_flag_next(flag);
  }
  const u64 elapsed = goep_globaltimer() - t0;
  if (bad != 0) {
    atomicAdd((unsigned long long*)&out[0], (unsigned long long)bad);
  }
  if (!ok) {
    atomicAdd((unsigned long long*)&out[1], 1ull);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out[2] = rounds;
    out[3] = elapsed;
  }
  goep_ll_flag_end(rcv.flag, last);
}

// Bandwidth kernel: puts bytes to every peer of chans[0..nchans) at once
// (entries with no remote buffer, such as this rank's own slot, are
// skipped): local[peer * src_stride, +bytes) -> peer's remote[dst_off].
// The transfer is cut into chunks of one unrolled round of the block
// (blockDim.x * 16 * GOEP_COPY_UNROLL bytes), dealt to blocks peer-major so
// that neighbouring blocks feed different links.
extern "C" __global__ void goep_chan_put_all(const goep_memory_channel* chans, u32 nchans, u64 bytes, u64 src_stride,
                                             u64 dst_off) {
  __shared__ u32 peers[64];
  __shared__ u32 npeers;
  if (threadIdx.x == 0) {
    u32 np = 0;
    for (u32 i = 0; i < nchans && np < 64; ++i) {
      if (chans[i].remote != nullptr) {
        peers[np++] = i;
      }
    }
    npeers = np;
  }
  __syncthreads();
  const u32 np = npeers;
  if (np == 0) {
    return;
  }
  const u64 chunk = (u64)blockDim.x * 16 * GOEP_COPY_UNROLL;
  const u64 nchunks = (bytes + chunk - 1) / chunk;
  const u64 items = nchunks * np;
  for (u64 item = blockIdx.x; item < items; item += gridDim.x) {
    const u32 p = peers[item % np];
    const u64 off = (item / np) * chunk;
    const u64 len = (bytes - off < chunk) ? bytes - off : chunk;
    const goep_memory_channel& ch = chans[p];
    goep_copy(ch.remote + dst_off + off, ch.local + (u64)p * src_stride + off, len, threadIdx.x, blockDim.x);
  }
}

// Compares got[0, n) with want[0, n) byte by byte and checks that the
// guard bytes around got (before bytes below, after bytes above) still hold
// guard. out[0] += mismatches, out[1] += guard bytes changed.
extern "C" __global__ void goep_chan_compare(const u8* got, const u8* want, u64 n, u32 guard, u64 before, u64 after,
                                             u64* out) {
  const u64 tid = goep_chan_gtid(), stride = goep_chan_gthreads();
  u64 bad = 0, trampled = 0;
  for (u64 i = tid; i < n; i += stride) {
    bad += (got[i] != want[i]) ? 1 : 0;
  }
  for (u64 i = tid; i < before; i += stride) {
    trampled += (got[-(i64)(i + 1)] != (u8)guard) ? 1 : 0;
  }
  for (u64 i = tid; i < after; i += stride) {
    trampled += (got[n + i] != (u8)guard) ? 1 : 0;
  }
  if (bad != 0) {
    atomicAdd((unsigned long long*)&out[0], (unsigned long long)bad);
  }
  if (trampled != 0) {
    atomicAdd((unsigned long long*)&out[1], (unsigned long long)trampled);
  }
}

// Thread 0 waits until *p >= target (goep_wait_ge_u64) under the watchdog
// wd; out[0] = 1 when it got there, 0 when it gave up.
extern "C" __global__ void goep_chan_wait_value(const u64* p, u64 target, goep_watchdog* wd, u32 id, u32 peer,
                                                u32 stage, u64* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out[0] = goep_wait_ge_u64(p, target, wd, id, peer, stage) ? 1 : 0;
  }
}
