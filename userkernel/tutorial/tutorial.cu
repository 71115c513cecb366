// The MSCCL++ channel tutorial on goep's channels: every rank owns one
// buffer of nranks slices; rank r's data is slice r, and each kernel sends
// it into slice r of every peer's buffer, then waits until every peer's
// slice has arrived in its own. One block; thread p serves peer p.
#include "channel_device.cuh"

// Port channels: the proxy copies with the copy engines. Thread p pushes
// one put-with-signal of this rank's slice to peer p and waits until the
// proxy carried it out (flush: the slice could then be overwritten), then
// waits for peer p's signal, which the peer's proxy raised after its put
// into this rank's slice p landed.
extern "C" __global__ void tutorial_port_all_gather(const goep_port_channel* chans, u32 rank, u32 nranks, u64 slice,
                                                    u32* failed) {
  const u32 p = threadIdx.x;
  if (p >= nranks || p == rank) return;
  const goep_port_channel& ch = chans[p];
  // Every wait is bounded: a false return means the communicator's
  // watchdog gave up (the host reports which wait); leave the kernel.
  if (!goep_pc_put_with_signal_and_flush(ch, rank * slice, rank * slice, slice, 1) || !goep_pc_wait(ch, 2)) {
    atomicAdd(failed, 1u);
  }
}

// Memory channels: the block's threads copy this rank's slice into every
// peer's buffer over NVLink themselves, then thread p signals peer p (after
// the barrier, so every thread's stores are ordered before the signal) and
// waits for peer p's signal.
extern "C" __global__ void tutorial_memory_all_gather(const goep_memory_channel* chans, u32 rank, u32 nranks,
                                                      u64 slice, u32* failed) {
  for (u32 p = 0; p < nranks; p++) {
    if (p != rank) goep_mc_put(chans[p], rank * slice, rank * slice, slice, threadIdx.x, blockDim.x);
  }
  __syncthreads();
  const u32 p = threadIdx.x;
  if (p >= nranks || p == rank) return;
  goep_mc_signal(chans[p]);
  if (!goep_mc_wait(chans[p], 2)) atomicAdd(failed, 1u);
}
