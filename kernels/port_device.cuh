// port_device.cuh: the device API of goep's port channels (included by
// channel_device.cuh).
//
//   #include "channel_device.cuh"
//   extern "C" __global__ void k(const goep_port_channel* chans, ...) {
//     const goep_port_channel& ch = chans[peer];
//     ... the block writes local memory ...
//     __syncthreads();
//     if (threadIdx.x == 0 && !goep_pc_put_with_signal(ch, dst_off, src_off, bytes)) { ... gave up ... }
//   }
//
// A port channel joins this rank to one peer through a CPU proxy
// (channels.Proxy): a thread pushes a trigger into the proxy's FIFO and
// the proxy does the work on the connection: put is a copy-engine copy
// from this rank's registered memory to the peer's, signal a
// host-to-device update of the peer's semaphore token ordered after every
// earlier put of the channel, flush waits until the proxy has completed
// everything pushed before it, and atomic_add adds to a 64-bit word of the
// peer's registered memory (on CUDA IPC a one-thread kernel the proxy
// launches after the earlier puts; kernels polling the word see it with
// ld.acquire.sys). The SMs are free while the copy engines move data, which
// is the point of port channels; a memory channel (goep_mc_*) moves data
// with threads instead.
//
// Functions are called by one thread. Memory ids name registrations in the
// proxy (Proxy.AddMemory); the plain forms use the channel's defaults (dst:
// the peer's memory, src: this rank's). Offsets are bytes below 4 GiB. A
// put, signal or atomic add returns once its trigger is in the FIFO; the
// work happens later, in FIFO order. Data the block wrote before a put is
// what the put moves, provided the block synchronised before the pushing
// thread pushed.
//
// Every function that waits is bounded by the communicator's watchdog
// (FIFO back-pressure, flush, semaphore wait) and returns false when it
// gave up; the host then reports a TimeoutError naming the channel, peer,
// stage and what was awaited.
#ifndef GOEP_PORT_DEVICE_CUH
#define GOEP_PORT_DEVICE_CUH

#include "fifo_device.cuh"
#include "sem_device.cuh"

__device__ __forceinline__ bool goep_pc_push(const goep_port_channel& ch, u64 w0, u64 w1, u64& pos, u32 stage) {
  return goep_fifo_push(ch.fifo, w0, w1, pos, ch.sem.id, ch.sem.peer, stage);
}

// Puts bytes from memory src_id at src_off to memory dst_id at dst_off;
// flags is 0 or GOEP_TRIGGER_SIGNAL, optionally with GOEP_TRIGGER_FLUSH
// (then it returns once the flush completed). Puts above
// GOEP_PORT_MAX_CHUNK go as several triggers, the flags on the last.
__device__ __forceinline__ bool goep_pc_put_ids_flags(const goep_port_channel& ch, u32 dst_id, u64 dst_off, u32 src_id,
                                                      u64 src_off, u64 bytes, u32 flags, u32 stage) {
  for (;;) {
    const u64 chunk = bytes < GOEP_PORT_MAX_CHUNK ? bytes : GOEP_PORT_MAX_CHUNK;
    const bool last = chunk == bytes;
    const u32 type = GOEP_TRIGGER_PUT | (last ? flags : 0u);
    u64 pos;
    if (!goep_pc_push(ch, goep_trigger_w0(src_off, chunk), goep_trigger_w1(type, ch.channel, dst_id, src_id, dst_off),
                      pos, stage)) {
      return false;
    }
    if (last) {
      return (flags & GOEP_TRIGGER_FLUSH) == 0 || goep_fifo_sync(ch.fifo, pos, ch.sem.id, ch.sem.peer, stage);
    }
    dst_off += chunk;
    src_off += chunk;
    bytes -= chunk;
  }
}

// local[src_off, +bytes) -> the peer's memory [dst_off, +bytes), with the
// channel's default memories.
__device__ __forceinline__ bool goep_pc_put(const goep_port_channel& ch, u64 dst_off, u64 src_off, u64 bytes,
                                            u32 stage = 0) {
  return goep_pc_put_ids_flags(ch, ch.dst, dst_off, ch.src, src_off, bytes, 0, stage);
}

// The same with explicit memory ids.
__device__ __forceinline__ bool goep_pc_put_ids(const goep_port_channel& ch, u32 dst_id, u64 dst_off, u32 src_id,
                                                u64 src_off, u64 bytes, u32 stage = 0) {
  return goep_pc_put_ids_flags(ch, dst_id, dst_off, src_id, src_off, bytes, 0, stage);
}

// Put, then signal the peer once the data has landed (one trigger).
__device__ __forceinline__ bool goep_pc_put_with_signal(const goep_port_channel& ch, u64 dst_off, u64 src_off,
                                                        u64 bytes, u32 stage = 0) {
  return goep_pc_put_ids_flags(ch, ch.dst, dst_off, ch.src, src_off, bytes, GOEP_TRIGGER_SIGNAL, stage);
}

// Put, signal, and wait until the proxy has completed both (the source may
// then be overwritten).
__device__ __forceinline__ bool goep_pc_put_with_signal_and_flush(const goep_port_channel& ch, u64 dst_off,
                                                                  u64 src_off, u64 bytes, u32 stage = 0) {
  return goep_pc_put_ids_flags(ch, ch.dst, dst_off, ch.src, src_off, bytes, GOEP_TRIGGER_SIGNAL | GOEP_TRIGGER_FLUSH,
                               stage);
}

// Signals the peer after every earlier put of this channel has landed.
__device__ __forceinline__ bool goep_pc_signal(const goep_port_channel& ch, u32 stage = 0) {
  u64 pos;
  return goep_pc_push(ch, 0, goep_trigger_w1(GOEP_TRIGGER_SIGNAL, ch.channel, 0, 0, 0), pos, stage);
}

// Waits until the proxy has carried out everything pushed before and the
// channel's transfers (puts, signals, atomic adds) have landed.
__device__ __forceinline__ bool goep_pc_flush(const goep_port_channel& ch, u32 stage = 0) {
  u64 pos;
  return goep_pc_push(ch, 0, goep_trigger_w1(GOEP_TRIGGER_FLUSH, ch.channel, 0, 0, 0), pos, stage) &&
         goep_fifo_sync(ch.fifo, pos, ch.sem.id, ch.sem.peer, stage);
}

// Adds value (two's complement: subtracting works) to the 64-bit word at
// dst_off (8-byte aligned) of memory dst_id, after every earlier put of the
// channel. Kernels on the owner see the sum with goep_wait_ge_u64 or
// ld.acquire.sys.
__device__ __forceinline__ bool goep_pc_atomic_add_id(const goep_port_channel& ch, u32 dst_id, u64 dst_off, u64 value,
                                                      u32 stage = 0) {
  u64 w0, w1, pos;
  goep_trigger_word(GOEP_TRIGGER_ATOMIC_ADD, ch.channel, dst_id, dst_off, value, w0, w1);
  return goep_pc_push(ch, w0, w1, pos, stage);
}

// The same on the channel's default destination (the peer's memory).
__device__ __forceinline__ bool goep_pc_atomic_add(const goep_port_channel& ch, u64 dst_off, u64 value,
                                                   u32 stage = 0) {
  return goep_pc_atomic_add_id(ch, ch.dst, dst_off, value, stage);
}

// Stores value into the 64-bit word at dst_off (8-byte aligned) of the
// channel's default destination, after every earlier put of the channel,
// in one piece (a waiter never sees a torn value). Cheaper than an atomic
// add where the transport's add is a kernel launch (CUDA IPC): for a word
// only this channel writes between two resets by its owner.
__device__ __forceinline__ bool goep_pc_store(const goep_port_channel& ch, u64 dst_off, u64 value, u32 stage = 0) {
  u64 w0, w1, pos;
  goep_trigger_word(GOEP_TRIGGER_STORE, ch.channel, ch.dst, dst_off, value, w0, w1);
  return goep_pc_push(ch, w0, w1, pos, stage);
}

// Waits for the peer's next signal (see goep_sem_wait); poll consumes one
// if it is there.
__device__ __forceinline__ bool goep_pc_wait(const goep_port_channel& ch, u32 stage = 0) {
  return goep_sem_wait(ch.sem, stage);
}
__device__ __forceinline__ bool goep_pc_poll(const goep_port_channel& ch) { return goep_sem_poll(ch.sem); }

#endif  // GOEP_PORT_DEVICE_CUH
