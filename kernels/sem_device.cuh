// sem_device.cuh: the device side of goep's semaphores.
//
// A semaphore pairs two ranks. Each side owns an inbound token (a monotonic
// u64 in its registered memory) and an expected counter (device memory).
// signal adds 1 to the peer's inbound token; wait advances expected by one
// and spins until the own inbound token reaches it. Signals are never lost
// (they are counted, not set) and never consumed twice (expected only moves
// forward), across launches and graph replays alike.
//
// Memory ordering. The token lives in the receiver's GPU memory and the
// sender is a thread of another GPU (over NVLink) or, for host-to-device
// semaphores, the peer's host through a copy engine. Threads of different
// GPUs share no scope narrower than .sys, so .gpu-scoped operations between
// them are not morally strong and order nothing: signal is a release
// reduction at system scope and wait ends with an acquire load at system
// scope (it polls with relaxed loads, then acquires once). The
// release orders every write the signalling thread has made or observed
// (cumulativity) before the token update; a block that put data with many
// threads must therefore synchronise (__syncthreads) before one thread
// signals. The acquire orders the waiter's later reads after the token, so
// data written before the signal is visible once wait returns.
//
// The relaxed forms skip that ordering (relaxed reduction / relaxed loads at
// system scope): use them for pure rendezvous, or pair them with explicit
// fences (goep_fence_acq_rel_sys) around several operations.
//
// One thread at a time may wait on or poll a given semaphore: the expected
// counter is a plain word that the waiter reads and advances (volatile
// accesses, so a later waiter of the same launch on another SM, after its
// own synchronisation with this one, never reads a stale L1 line). Any
// number of threads may signal.
#ifndef GOEP_SEM_DEVICE_CUH
#define GOEP_SEM_DEVICE_CUH

#include "channel_wait.cuh"

// Adds 1 to the peer's inbound token, after every write this thread made or
// observed (release, system scope). Not for host-to-device semaphores
// (remote is 0 there).
__device__ __forceinline__ void goep_sem_signal(const goep_semaphore& s) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(s.remote), "l"(1ull) : "memory");
}

// Adds 1 to the peer's inbound token with no ordering of earlier writes.
__device__ __forceinline__ void goep_sem_relaxed_signal(const goep_semaphore& s) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" : : "l"(s.remote), "l"(1ull) : "memory");
}

// The expected counter: signals consumed so far (read), and advancing it.
__device__ __forceinline__ u64 goep_sem_expected(const goep_semaphore& s) { return *(volatile const u64*)s.expected; }
__device__ __forceinline__ void goep_sem_consumed(const goep_semaphore& s, u64 v) { *(volatile u64*)s.expected = v; }

// Consumes one signal if one is there: returns true (and advances expected)
// when the inbound token is past expected, false at once otherwise.
__device__ __forceinline__ bool goep_sem_poll(const goep_semaphore& s) {
  const u64 want = goep_sem_expected(s) + 1;
  if (goep_chan_ld_relaxed_sys_u64(s.inbound) >= want) {
    (void)goep_ld_acquire_sys_u64(s.inbound);  // synchronises with the signal
    goep_sem_consumed(s, want);
    return true;
  }
  return false;
}

// Waits for the next signal, bounded by the watchdog. Returns false when the
// wait gave up (timeout or abort); expected is then left where it was.
__device__ __forceinline__ bool goep_sem_wait(const goep_semaphore& s, u32 stage = 0) {
  const u64 want = goep_sem_expected(s) + 1;
  goep_spin sp = goep_spin_start();
  u64 got;
  // Spin with relaxed loads: an acquire load on every iteration makes each
  // poll slower than the signal takes to arrive. Once the token is there,
  // one acquire load of the same word (it reads the signal's value or a later
  // one of the same release sequence: tokens only grow, by atomic adds)
  // synchronises with the signal's release.
  while ((got = goep_chan_ld_relaxed_sys_u64(s.inbound)) < want) {
    if (!goep_spin_ok(sp, s.wd, GOEP_OP_SEM_WAIT, s.id, s.peer, stage, want, got)) {
      return false;
    }
  }
  (void)goep_ld_acquire_sys_u64(s.inbound);
  goep_sem_consumed(s, want);
  return true;
}

// Waits for the next signal without acquire ordering.
__device__ __forceinline__ bool goep_sem_relaxed_wait(const goep_semaphore& s, u32 stage = 0) {
  const u64 want = goep_sem_expected(s) + 1;
  goep_spin sp = goep_spin_start();
  u64 got;
  while ((got = goep_chan_ld_relaxed_sys_u64(s.inbound)) < want) {
    if (!goep_spin_ok(sp, s.wd, GOEP_OP_SEM_RELAXED_WAIT, s.id, s.peer, stage, want, got)) {
      return false;
    }
  }
  goep_sem_consumed(s, want);
  return true;
}

// Spins on goep_sem_poll, bounded like a wait; for loops that interleave
// polls of several semaphores, build the loop from goep_sem_poll and
// goep_spin_ok instead.
__device__ __forceinline__ bool goep_sem_poll_until(const goep_semaphore& s, u32 stage = 0) {
  goep_spin sp = goep_spin_start();
  while (!goep_sem_poll(s)) {
    if (!goep_spin_ok(sp, s.wd, GOEP_OP_SEM_POLL, s.id, s.peer, stage, goep_sem_expected(s) + 1,
                      goep_chan_ld_relaxed_sys_u64(s.inbound))) {
      return false;
    }
  }
  return true;
}

#endif  // GOEP_SEM_DEVICE_CUH
