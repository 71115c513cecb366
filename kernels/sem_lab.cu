// sem_lab.cu: a measurement aid, not part of the API. It runs the
// signal/wait ping-pong of channel_kernels.cu with the two halves built in
// different ways, so one run on two GPUs shows where a round trip's time
// goes (the release, the acquire, the expected-counter traffic, the
// watchdog checks) and which correct form is fastest. Only variants that
// keep release/acquire at system scope are candidates for the API; the
// others are there to bound the cost of each piece.
#include "channel_device.cuh"

enum goep_lab_variant : u32 {
  GOEP_LAB_API = 0,              // goep_sem_signal / goep_sem_wait as shipped
  GOEP_LAB_REG_EXPECTED = 1,     // same ordering, expected counter in a register, no watchdog checks
  GOEP_LAB_FENCE_ACQREL = 2,     // fence.acq_rel.sys + relaxed red; relaxed polls + fence.acq_rel.sys
  GOEP_LAB_FENCE_SC = 3,         // fence.sc.sys + relaxed red; relaxed polls + fence.sc.sys
  GOEP_LAB_GPU_SCOPE = 4,        // release/acquire at .gpu scope (not sufficient across GPUs; a bound)
  GOEP_LAB_RELAXED = 5,          // relaxed red and relaxed polls, register counter (the floor)
  GOEP_LAB_ATOM_RELEASE = 6,     // atom.release.sys (returns the old value)
  GOEP_LAB_ACQUIRE_POLLS = 7,    // every poll an acquire load
  GOEP_LAB_RELEASE_ONLY = 8,     // release red, relaxed wait: the cost of the release alone
  GOEP_LAB_ACQUIRE_ONLY = 9,     // relaxed red, acquire wait: the cost of the acquire alone
  GOEP_LAB_VARIANTS = 10,
};

__device__ __forceinline__ void goep_lab_red(u64* p, u32 v) {
  switch (v) {
    case GOEP_LAB_FENCE_ACQREL:
      asm volatile("fence.acq_rel.sys;" : : : "memory");
      asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(1ull) : "memory");
      break;
    case GOEP_LAB_FENCE_SC:
      asm volatile("fence.sc.sys;" : : : "memory");
      asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(1ull) : "memory");
      break;
    case GOEP_LAB_GPU_SCOPE:
      asm volatile("red.release.gpu.global.add.u64 [%0], %1;" : : "l"(p), "l"(1ull) : "memory");
      break;
    case GOEP_LAB_RELAXED:
    case GOEP_LAB_ACQUIRE_ONLY:
      asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(1ull) : "memory");
      break;
    case GOEP_LAB_ATOM_RELEASE: {
      u64 old;
      asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(1ull) : "memory");
      break;
    }
    default:
      asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(1ull) : "memory");
  }
}

// Spins until *p >= want; false after max_polls (so a broken variant ends).
__device__ __forceinline__ bool goep_lab_wait(const u64* p, u64 want, u32 v) {
  u64 got;
  const u64 max_polls = 1ull << 28;
  u64 n = 0;
  if (v == GOEP_LAB_ACQUIRE_POLLS) {
    while (goep_ld_acquire_sys_u64(p) < want) {
      if (++n > max_polls) return false;
    }
    return true;
  }
  if (v == GOEP_LAB_GPU_SCOPE) {
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(got) : "l"(p) : "memory");
      if (++n > max_polls) return false;
    } while (got < want);
    return true;
  }
  while (goep_chan_ld_relaxed_sys_u64(p) < want) {
    if (++n > max_polls) return false;
  }
  switch (v) {
    case GOEP_LAB_FENCE_ACQREL:
      asm volatile("fence.acq_rel.sys;" : : : "memory");
      break;
    case GOEP_LAB_FENCE_SC:
      asm volatile("fence.sc.sys;" : : : "memory");
      break;
    case GOEP_LAB_RELAXED:
    case GOEP_LAB_RELEASE_ONLY:
      break;
    default:
      (void)goep_ld_acquire_sys_u64(p);
  }
  return true;
}

// One thread of block 0: iters round trips with the peer of channel idx,
// timed by the global timer. out = rounds done, elapsed ns.
extern "C" __global__ void goep_sem_lab_pingpong(const goep_memory_channel* chans, u32 idx, u64 iters, u32 initiator,
                                                 u32 variant, u64* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  const goep_semaphore& s = chans[idx].sem;
  u64 done = 0;
  const u64 t0 = goep_globaltimer();
  if (variant == GOEP_LAB_API) {
    for (u64 i = 0; i < iters; ++i) {
      if (initiator != 0) {
        goep_sem_signal(s);
        if (!goep_sem_wait(s)) break;
      } else {
        if (!goep_sem_wait(s)) break;
        goep_sem_signal(s);
      }
      ++done;
    }
  } else {
    u64 expected = goep_sem_expected(s);
    for (u64 i = 0; i < iters; ++i) {
      if (initiator != 0) {
        goep_lab_red(s.remote, variant);
        if (!goep_lab_wait(s.inbound, expected + 1, variant)) break;
      } else {
        if (!goep_lab_wait(s.inbound, expected + 1, variant)) break;
        goep_lab_red(s.remote, variant);
      }
      ++expected;
      ++done;
    }
    goep_sem_consumed(s, expected);
  }
  out[0] = done;
  out[1] = goep_globaltimer() - t0;
}
