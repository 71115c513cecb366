// channel_device.cuh: the device API of goep's memory channels, the one
// header that EP kernels, collectives and the plan executor include.
//
//   #include "channel_device.cuh"
//   extern "C" __global__ void k(const goep_memory_channel* chans, ...) {
//     const goep_memory_channel ch = chans[peer];   // handles come by pointer
//     ...
//   }
//
// A memory channel joins this rank to one peer over NVLink (CUDA IPC or
// peer access): it can copy into the peer's registered memory (put), copy
// out of it (get), send LL packets into the peer's packet buffer, and
// signal / wait on the pair's semaphore (see sem_device.cuh for the memory
// ordering). No flush exists or is needed: data written before a signal is
// visible to the peer once its wait returns.
//
// Offsets are bytes from the start of the buffer the channel was built
// with; the host checked the buffers, kernels are trusted to stay inside
// them (remote_size etc. are in the handle for kernels that want to check).
//
// Every wait is bounded (channel_wait.cuh) and returns false when it gave
// up; see goep_block_any_failed for leaving a kernel together.
//
// Port channels (goep_pc_*: put, signal, flush and atomic add carried out
// by a CPU proxy with the copy engines) are in port_device.cuh, included
// here.
#ifndef GOEP_CHANNEL_DEVICE_CUH
#define GOEP_CHANNEL_DEVICE_CUH

#include "channel_abi.cuh"
#include "channel_copy.cuh"
#include "channel_wait.cuh"
#include "packet_device.cuh"
#include "port_device.cuh"
#include "sem_device.cuh"

// ---------------------------------------------------------------------------
// Data. Threads tid = 0..nthreads-1 of any group cooperate (all call with
// the same arguments).

// local[src_off, +bytes) -> peer's remote[dst_off, +bytes).
__device__ __forceinline__ void goep_mc_put(const goep_memory_channel& ch, u64 dst_off, u64 src_off, u64 bytes, u32 tid,
                                            u32 nthreads) {
  goep_copy(ch.remote + dst_off, ch.local + src_off, bytes, tid, nthreads);
}

// Peer's remote[remote_off, +bytes) -> local[local_off, +bytes).
__device__ __forceinline__ void goep_mc_get(const goep_memory_channel& ch, u64 remote_off, u64 local_off, u64 bytes,
                                            u32 tid, u32 nthreads) {
  goep_copy(ch.local + local_off, ch.remote + remote_off, bytes, tid, nthreads);
}

// Typed pointers into the peer's and the local buffer, for kernels that
// write single words (counters, ring heads) themselves.
template <typename T>
__device__ __forceinline__ T* goep_mc_remote_ptr(const goep_memory_channel& ch, u64 off) {
  return (T*)(ch.remote + off);
}
template <typename T>
__device__ __forceinline__ T* goep_mc_local_ptr(const goep_memory_channel& ch, u64 off) {
  return (T*)(ch.local + off);
}

// ---------------------------------------------------------------------------
// Synchronisation (single thread; see sem_device.cuh).

__device__ __forceinline__ void goep_mc_signal(const goep_memory_channel& ch) { goep_sem_signal(ch.sem); }
__device__ __forceinline__ void goep_mc_relaxed_signal(const goep_memory_channel& ch) {
  goep_sem_relaxed_signal(ch.sem);
}
__device__ __forceinline__ bool goep_mc_wait(const goep_memory_channel& ch, u32 stage = 0) {
  return goep_sem_wait(ch.sem, stage);
}
__device__ __forceinline__ bool goep_mc_relaxed_wait(const goep_memory_channel& ch, u32 stage = 0) {
  return goep_sem_relaxed_wait(ch.sem, stage);
}
__device__ __forceinline__ bool goep_mc_poll(const goep_memory_channel& ch) { return goep_sem_poll(ch.sem); }

// The common block pattern: the whole block puts, then thread 0 signals
// once every thread's stores are issued (the barrier makes them visible to
// thread 0, the release makes them visible to the peer).
__device__ __forceinline__ void goep_mc_block_put_with_signal(const goep_memory_channel& ch, u64 dst_off, u64 src_off,
                                                              u64 bytes) {
  goep_mc_put(ch, dst_off, src_off, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    goep_mc_signal(ch);
  }
}

// ---------------------------------------------------------------------------
// LL packets (see packet_device.cuh). Packet offsets are bytes into the
// packet buffers and must be multiples of the packet size; payload offsets
// may be anything.

// local[src_off, +bytes) -> LL16 packets at the peer's remote_packets[pkt_off].
__device__ __forceinline__ void goep_mc_put_ll16(const goep_memory_channel& ch, u64 pkt_off, u64 src_off, u64 bytes,
                                                 u32 flag, u32 tid, u32 nthreads) {
  goep_ll16_put((goep_ll16*)(ch.remote_packets + pkt_off), ch.local + src_off, bytes, flag, tid, nthreads);
}

// LL16 packets at local_packets[pkt_off] -> local[dst_off, +bytes), waiting
// for each packet to carry flag.
__device__ __forceinline__ bool goep_mc_unpack_ll16(const goep_memory_channel& ch, u64 dst_off, u64 pkt_off, u64 bytes,
                                                    u32 flag, u32 tid, u32 nthreads, u32 stage = 0) {
  return goep_ll16_unpack(ch.local + dst_off, (const goep_ll16*)(ch.local_packets + pkt_off), bytes, flag, tid,
                          nthreads, ch.sem.wd, ch.sem.id, ch.sem.peer, stage);
}

__device__ __forceinline__ void goep_mc_put_ll8(const goep_memory_channel& ch, u64 pkt_off, u64 src_off, u64 bytes,
                                                u32 flag, u32 tid, u32 nthreads) {
  goep_ll8_put((goep_ll8*)(ch.remote_packets + pkt_off), ch.local + src_off, bytes, flag, tid, nthreads);
}

__device__ __forceinline__ bool goep_mc_unpack_ll8(const goep_memory_channel& ch, u64 dst_off, u64 pkt_off, u64 bytes,
                                                   u32 flag, u32 tid, u32 nthreads, u32 stage = 0) {
  return goep_ll8_unpack(ch.local + dst_off, (const goep_ll8*)(ch.local_packets + pkt_off), bytes, flag, tid, nthreads,
                         ch.sem.wd, ch.sem.id, ch.sem.peer, stage);
}

// Single packets, for kernels that compute on payloads (reductions) rather
// than copy them: write packet index k of the peer's buffer at pkt_off, read
// packet k of the local one.
__device__ __forceinline__ void goep_mc_write_ll16(const goep_memory_channel& ch, u64 pkt_off, u64 k, u64 v, u32 flag) {
  goep_ll16_store((goep_ll16*)(ch.remote_packets + pkt_off) + k, (u32)v, (u32)(v >> 32), flag);
}
__device__ __forceinline__ bool goep_mc_read_ll16(const goep_memory_channel& ch, u64 pkt_off, u64 k, u32 flag, u64& v,
                                                  u32 stage = 0) {
  u32 lo, hi;
  if (!goep_ll16_read((const goep_ll16*)(ch.local_packets + pkt_off) + k, flag, lo, hi, ch.sem.wd, ch.sem.id,
                      ch.sem.peer, stage)) {
    return false;
  }
  v = (u64)lo | ((u64)hi << 32);
  return true;
}
__device__ __forceinline__ void goep_mc_write_ll8(const goep_memory_channel& ch, u64 pkt_off, u64 k, u32 v, u32 flag) {
  goep_ll8_store((goep_ll8*)(ch.remote_packets + pkt_off) + k, v, flag);
}
__device__ __forceinline__ bool goep_mc_read_ll8(const goep_memory_channel& ch, u64 pkt_off, u64 k, u32 flag, u32& v,
                                                 u32 stage = 0) {
  return goep_ll8_read((const goep_ll8*)(ch.local_packets + pkt_off) + k, flag, v, ch.sem.wd, ch.sem.id, ch.sem.peer,
                       stage);
}

#endif  // GOEP_CHANNEL_DEVICE_CUH
