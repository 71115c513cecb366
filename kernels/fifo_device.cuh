// fifo_device.cuh: the device side of a port channel proxy's FIFO (layout
// and protocol in channel_abi.cuh, the consumer in channels/proxy.go).
//
// Any number of threads of any number of launches may push at once: a push
// claims a position with one atomic add on head, so triggers are consumed in
// the order their positions were claimed. When the ring is full the pusher
// waits (bounded, GOEP_OP_FIFO_PUSH) for the proxy to make room; a proxy that
// has stopped therefore surfaces as a timeout, not a hang.
//
// Ordering. A push begins with a system-scope fence, so every write the
// pushing thread made or observed (with __syncthreads, the whole block's) is
// visible to the proxy and to the copy engines it drives before the trigger
// is: data written before a put is the data the put moves.
#ifndef GOEP_FIFO_DEVICE_CUH
#define GOEP_FIFO_DEVICE_CUH

#include "channel_wait.cuh"

// Largest put one trigger carries (the put helpers split larger ones).
#define GOEP_PORT_MAX_CHUNK (1ull << 30)

// Word 0 of a data trigger: src offset and size.
__device__ __forceinline__ u64 goep_trigger_w0(u64 src_off, u64 size) {
  return (src_off & 0xffffffffull) | ((size & GOEP_TRIGGER_MAX_SIZE) << 32);
}

// Word 1: dst offset, type, channel, memory ids.
__device__ __forceinline__ u64 goep_trigger_w1(u32 type, u32 channel, u32 dst, u32 src, u64 dst_off) {
  return (dst_off & 0xffffffffull) | ((u64)(type & 0xf) << 32) | ((u64)(channel & 0x3ff) << 36) |
         ((u64)(dst & 0xff) << 46) | ((u64)(src & 0xff) << 54);
}

// A word op's words (GOEP_TRIGGER_ATOMIC_ADD or GOEP_TRIGGER_STORE): value
// bits 0..62 in word 0, bit 63 in word 1's bit 54.
__device__ __forceinline__ void goep_trigger_word(u32 type, u32 channel, u32 dst, u64 dst_off, u64 value, u64& w0,
                                                  u64& w1) {
  w0 = value & ~GOEP_TRIGGER_COMMIT;
  w1 = goep_trigger_w1(type, channel, dst, (u32)(value >> 63), dst_off);
}

// Claims a position, waits for room, stores the trigger. pos receives the
// position (a flush waits on it). Returns false when the wait for room gave
// up; id and peer name the channel in the timeout record.
__device__ __forceinline__ bool goep_fifo_push(const goep_fifo& f, u64 w0, u64 w1, u64& pos, u32 id, u32 peer,
                                               u32 stage) {
  pos = atomicAdd((unsigned long long*)f.head, 1ull);
  const u64 size = f.size;
  if (pos >= *(volatile const u64*)f.tail_cache + size) {
    // Looks full: read the proxy's tail across PCIe until the slot's
    // previous occupant (pos - size) has been consumed.
    goep_spin sp = goep_spin_start();
    u64 tail;
    while (pos >= (tail = goep_chan_ld_relaxed_sys_u64(f.tail)) + size) {
      if (!goep_spin_ok(sp, f.wd, GOEP_OP_FIFO_PUSH, id, peer, stage, pos - size + 1, tail)) {
        return false;
      }
    }
    atomicMax((unsigned long long*)f.tail_cache, (unsigned long long)tail);
  }
  const u64 commit = ((pos / size) & 1) == 0 ? GOEP_TRIGGER_COMMIT : 0ull;
  u64* slot = f.triggers + 2 * (pos & (size - 1));
  goep_fence_acq_rel_sys();
  // One 16-byte store; the proxy accepts the slot only when both words carry
  // the commit bit of this lap, so the halves may land in either order.
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" : : "l"(slot), "l"(w0 | commit), "l"(w1 | commit)
               : "memory");
  return true;
}

// Waits (bounded, GOEP_OP_FLUSH) until the proxy has completed the flush
// trigger at pos: every trigger before it has been carried out and the
// channel's transfers have landed.
__device__ __forceinline__ bool goep_fifo_sync(const goep_fifo& f, u64 pos, u32 id, u32 peer, u32 stage) {
  goep_spin sp = goep_spin_start();
  u64 done;
  while ((done = goep_chan_ld_relaxed_sys_u64(f.done)) <= pos) {
    if (!goep_spin_ok(sp, f.wd, GOEP_OP_FLUSH, id, peer, stage, pos + 1, done)) {
      return false;
    }
  }
  (void)goep_ld_acquire_sys_u64(f.done);
  return true;
}

#endif  // GOEP_FIFO_DEVICE_CUH
