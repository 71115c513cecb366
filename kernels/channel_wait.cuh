// channel_wait.cuh: bounded spins. Every device-side wait in goep goes
// through goep_spin_ok, which gives up when the communicator's watchdog has
// been aborted or when the wait has lasted longer than the watchdog's
// timeout; the first thread to time out records what it waited for in
// host-mapped memory and raises the abort flag, so the other spinning
// threads of the launch give up too and the kernel ends instead of hanging.
//
// A wait that gives up returns false. Kernels must then stop using the
// channels and leave: typically the waiting thread writes a flag to shared
// memory, the block synchronises, and every thread returns (see
// goep_block_any_failed). The host turns the record into an error that
// names the channel, the peer and the stage.
#ifndef GOEP_CHANNEL_WAIT_CUH
#define GOEP_CHANNEL_WAIT_CUH

#include "channel_abi.cuh"

// How many failed polls pass between two looks at the timer and the abort
// flag (a power of two). Polls are L2 round trips; looking every 64 keeps
// the fast path to one load and a compare.
#ifndef GOEP_SPIN_CHECK_EVERY
#define GOEP_SPIN_CHECK_EVERY 64
#endif
static_assert((GOEP_SPIN_CHECK_EVERY & (GOEP_SPIN_CHECK_EVERY - 1)) == 0, "goep: GOEP_SPIN_CHECK_EVERY must be a power of two");

// Relaxed 64-bit load at system scope (common.cuh has the 32-bit one).
__device__ __forceinline__ u64 goep_chan_ld_relaxed_sys_u64(const u64* p) {
  u64 v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// State of one bounded spin; start is taken lazily at the first check so
// that waits that succeed quickly never read the timer.
struct goep_spin {
  u64 start;
  u32 count;
};

__device__ __forceinline__ goep_spin goep_spin_start() {
  goep_spin s;
  s.start = 0;
  s.count = 0;
  return s;
}

// True once the watchdog was aborted (by a thread that timed out, or by the
// host). Relaxed at system scope: the host writes the flag by DMA.
__device__ __forceinline__ bool goep_aborted(const goep_watchdog* wd) {
  return goep_ld_relaxed_sys_u32(&wd->abort) != GOEP_ABORT_NONE;
}

// Claims the record (only the first thread of all launches sharing the
// watchdog wins), fills it, then publishes state last with release at
// system scope so that a host reading state != 0 sees every field.
__device__ __noinline__ void goep_watchdog_expire(goep_watchdog* wd, u32 op, u32 id, u32 peer, u32 stage, u64 waited,
                                                  u64 expected, u64 observed) {
  if (atomicCAS(&wd->abort, (u32)GOEP_ABORT_NONE, (u32)GOEP_ABORT_TIMEOUT) != GOEP_ABORT_NONE) {
    return;  // someone else timed out first, or the host aborted
  }
  volatile goep_timeout_record* r = wd->record;
  r->op = op;
  r->id = id;
  r->peer = peer;
  r->stage = stage;
  r->waited_ns = waited;
  r->expected = expected;
  r->observed = observed;
  goep_st_release_sys_u32((u32*)&r->state, (u32)GOEP_TIMEOUT_EXPIRED);
}

// Call after every failed poll. Returns true to keep spinning, false when
// the spin must give up (and then the record has been written, unless
// another thread or the host got there first).
// slack_shift lengthens the wait to timeout << slack_shift: for a wait
// downstream of other waits of the same launch (see goep_wait_ge_u64_after).
__device__ __forceinline__ bool goep_spin_ok(goep_spin& s, goep_watchdog* wd, u32 op, u32 id, u32 peer, u32 stage,
                                             u64 expected, u64 observed, u32 slack_shift = 0) {
  if (((++s.count) & (GOEP_SPIN_CHECK_EVERY - 1)) != 0) {
    return true;
  }
  if (goep_aborted(wd)) {
    return false;
  }
  const u64 now = goep_globaltimer();
  if (s.start == 0) {
    s.start = now;
    return true;
  }
  const u64 waited = now - s.start;
  if (waited < (wd->timeout_ns << slack_shift)) {
    return true;
  }
  goep_watchdog_expire(wd, op, id, peer, stage, waited, expected, observed);
  return false;
}

// ---------------------------------------------------------------------------
// Waits on plain counters (EP head/tail counters, grid barriers, flags the
// host writes): spin with relaxed loads at system scope until *p reaches
// target, then acquire it once (an acquire per poll makes each poll slower
// than the update takes to arrive; the final acquire reads the releasing
// write's value or a later one of the same counter and synchronises with it). id names the counter for the host (Communicator.NewWaitID), peer
// is the rank expected to move it. Return false when the spin gave up.

__device__ __forceinline__ bool goep_wait_ge_u64(const u64* p, u64 target, goep_watchdog* wd, u32 id, u32 peer,
                                                 u32 stage, u32 slack_shift = 0) {
  goep_spin s = goep_spin_start();
  u64 v;
  while ((v = goep_chan_ld_relaxed_sys_u64(p)) < target) {
    if (!goep_spin_ok(s, wd, GOEP_OP_VALUE, id, peer, stage, target, v, slack_shift)) {
      return false;
    }
  }
  (void)goep_ld_acquire_sys_u64(p);
  return true;
}

// A wait for what other waits of the same launch deliver (a receiver block
// waiting for the forwarder blocks of its node, which wait on the network):
// it gives up only at twice the timeout, so when a rank never arrives the
// wait that times out first, and names it in the record, is the upstream
// one; the downstream wait then leaves on the abort.
__device__ __forceinline__ bool goep_wait_ge_u64_after(const u64* p, u64 target, goep_watchdog* wd, u32 id, u32 peer,
                                                       u32 stage) {
  return goep_wait_ge_u64(p, target, wd, id, peer, stage, 1);
}

// 32-bit counters may wrap: "reached" means the signed distance is >= 0.
__device__ __forceinline__ bool goep_wait_ge_u32(const u32* p, u32 target, goep_watchdog* wd, u32 id, u32 peer,
                                                 u32 stage) {
  goep_spin s = goep_spin_start();
  u32 v;
  while ((i32)((v = goep_ld_relaxed_sys_u32(p)) - target) < 0) {
    if (!goep_spin_ok(s, wd, GOEP_OP_VALUE, id, peer, stage, target, v)) {
      return false;
    }
  }
  (void)goep_ld_acquire_sys_u32(p);
  return true;
}

// ---------------------------------------------------------------------------
// Leaving together. After a failed wait a block must not hit a barrier that
// the failed threads skip. goep_block_any_failed is a barrier that also
// tells every thread whether any thread of the block reported failure, so
// the usual shape is:
//
//   bool ok = (threadIdx.x == 0) ? goep_sem_wait(ch.sem) : true;
//   if (goep_block_any_failed(!ok)) return;
__device__ __forceinline__ bool goep_block_any_failed(bool failed) { return __syncthreads_or(failed ? 1 : 0) != 0; }

#endif  // GOEP_CHANNEL_WAIT_CUH
