// packet_device.cuh: LL ("low latency") packets.
//
// A packet carries a flag next to each 4-byte payload word, so the receiver
// polls the data itself: no separate signal, no fence, one NVLink trip.
// Payload bytes double (LL16: 8 payload bytes in a 16-byte packet written by
// one vector store; LL8: 4 in 8).
//
// Flags. Every launch uses a flag no packet in the buffer carries yet, so
// buffers are never cleared. The flag is a per-buffer counter in device
// memory (goep_ll_flag) that kernels advance themselves, which keeps them
// correct inside a CUDA graph replayed any number of times:
//
//   u32 flag = goep_ll_flag_begin(ch.flag);      // every thread, at start
//   ... put packets with flag, read packets expecting flag ...
//   goep_ll_flag_end(ch.flag, flag);             // every thread, at the end
//
// The sender stamps packets with its own counter and the receiver expects
// its own: both advance once per launch of the same kernel, so they agree.
// A kernel that runs several rounds uses flag, goep_ll_flag_next(flag), ...
// and ends with the last one. Flags skip 0 (fresh memory) and alternate in
// parity forever, so goep_ll_half(flag) can pick one of two halves of a
// buffer, letting a sender run one round ahead of its receiver without
// overwriting packets not yet read. That bound holds when the sender also
// receives from that receiver every round (pairs, all-pairs exchanges such
// as allreduce): finishing round k needs the receiver's round-k packets, so
// the receiver has finished round k-1. One-way chains (A -> B -> C -> A) do
// not bound the lag that way: A can get a chain's length ahead of B, so
// give them as many buffers as the chain is long, or synchronise rounds.
//
// Atomicity. LL16 relies on each 8-byte half {data, flag} of a 16-byte
// aligned vector store arriving whole, LL8 on an aligned 8-byte store
// arriving whole; reads are volatile (relaxed, system scope), so they are
// served from L2, never from a stale L1 line.
#ifndef GOEP_PACKET_DEVICE_CUH
#define GOEP_PACKET_DEVICE_CUH

#include "channel_wait.cuh"

// ---------------------------------------------------------------------------
// Flags.

// The flag after f: f+1, skipping 0 and keeping parity alternating across
// the wrap (0xffffffff is followed by 2).
__device__ __forceinline__ u32 goep_ll_flag_next(u32 f) {
  f += 1u;
  return f != 0u ? f : 2u;
}

// Which half of a double buffer a round with this flag uses (0 or 1).
__device__ __forceinline__ u32 goep_ll_half(u32 flag) { return flag & 1u; }

// The flag this launch uses. Call from any thread before goep_ll_flag_end.
__device__ __forceinline__ u32 goep_ll_flag_begin(const goep_ll_flag* f) {
  return goep_ll_flag_next(*(const volatile u32*)&f->value);
}

// Publishes flag as the counter's value once every block of the launch has
// arrived here. Call from every thread of every block, as the last use of
// the counter (it synchronises the block). The arrival is an acq_rel
// reduction so every block's read of the old value happens before the last
// block's store of the new one.
__device__ __forceinline__ void goep_ll_flag_end(goep_ll_flag* f, u32 flag) {
  __syncthreads();
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) {
    return;
  }
  const u32 blocks = gridDim.x * gridDim.y * gridDim.z;
  if (blocks == 1) {
    f->value = flag;
    return;
  }
  u32 prev;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&f->arrived) : "memory");
  if (prev == blocks - 1) {
    f->arrived = 0;
    f->value = flag;
  }
}

// ---------------------------------------------------------------------------
// One packet.

__device__ __forceinline__ void goep_ll16_store(goep_ll16* p, u32 d1, u32 d2, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" : : "l"(p), "r"(d1), "r"(flag), "r"(d2), "r"(flag)
               : "memory");
}

__device__ __forceinline__ void goep_ll8_store(goep_ll8* p, u32 d, u32 flag) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" : : "l"(p), "r"(d), "r"(flag) : "memory");
}

// One look at a packet: true (with the payload) when it carries flag.
__device__ __forceinline__ bool goep_ll16_try(const goep_ll16* p, u32 flag, u32& d1, u32& d2, u32& seen) {
  u32 a, b, c, d;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p)
               : "memory");
  d1 = a;
  d2 = c;
  seen = (b != flag) ? b : d;
  return b == flag && d == flag;
}

__device__ __forceinline__ bool goep_ll8_try(const goep_ll8* p, u32 flag, u32& d, u32& seen) {
  u32 a, b;
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p) : "memory");
  d = a;
  seen = b;
  return b == flag;
}

// Spins until the packet carries flag, bounded by the watchdog; id, peer and
// stage name the wait in the timeout record.
__device__ __forceinline__ bool goep_ll16_read(const goep_ll16* p, u32 flag, u32& d1, u32& d2, goep_watchdog* wd,
                                               u32 id, u32 peer, u32 stage) {
  goep_spin s = goep_spin_start();
  u32 seen;
  while (!goep_ll16_try(p, flag, d1, d2, seen)) {
    if (!goep_spin_ok(s, wd, GOEP_OP_PACKET, id, peer, stage, flag, seen)) {
      return false;
    }
  }
  return true;
}

__device__ __forceinline__ bool goep_ll8_read(const goep_ll8* p, u32 flag, u32& d, goep_watchdog* wd, u32 id, u32 peer,
                                              u32 stage) {
  goep_spin s = goep_spin_start();
  u32 seen;
  while (!goep_ll8_try(p, flag, d, seen)) {
    if (!goep_spin_ok(s, wd, GOEP_OP_PACKET, id, peer, stage, flag, seen)) {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Byte ranges. Packet i carries payload bytes [i*P, i*P+P) of the range
// (P = 8 for LL16, 4 for LL8); a last partial packet is zero-padded and only
// its valid bytes are unpacked. The payload side may have any alignment
// (aligned ranges use word accesses); the packet side must be aligned to the
// packet size. Threads tid = 0..nthreads-1 take packets tid, tid+nthreads...

// Packet-buffer bytes needed for a payload of bytes.
__device__ __forceinline__ u64 goep_ll16_bytes(u64 bytes) { return (bytes + 7) / 8 * sizeof(goep_ll16); }
__device__ __forceinline__ u64 goep_ll8_bytes(u64 bytes) { return (bytes + 3) / 4 * sizeof(goep_ll8); }

// Reads payload word k (w bytes, w = 4 or 8) of src, zero-padded past n.
__device__ __forceinline__ u64 goep_ll_gather(const char* src, u64 k, u32 w, u64 n, bool aligned) {
  const u64 at = k * w;
  if (aligned && at + w <= n) {
    return w == 8 ? *(const u64*)(src + at) : (u64) * (const u32*)(src + at);
  }
  u64 v = 0;
  for (u32 b = 0; b < w && at + b < n; ++b) {
    v |= (u64)(u8)src[at + b] << (8 * b);
  }
  return v;
}

// Writes payload word k of dst, stopping at n.
__device__ __forceinline__ void goep_ll_scatter(char* dst, u64 k, u32 w, u64 n, bool aligned, u64 v) {
  const u64 at = k * w;
  if (aligned && at + w <= n) {
    if (w == 8) {
      *(u64*)(dst + at) = v;
    } else {
      *(u32*)(dst + at) = (u32)v;
    }
    return;
  }
  for (u32 b = 0; b < w && at + b < n; ++b) {
    dst[at + b] = (char)(u8)(v >> (8 * b));
  }
}

__device__ __forceinline__ void goep_ll16_put(goep_ll16* dst, const void* src, u64 bytes, u32 flag, u32 tid,
                                              u32 nthreads) {
  const char* s = (const char*)src;
  const bool aligned = ((u64)s & 7) == 0;
  const u64 count = (bytes + 7) / 8;
  for (u64 k = tid; k < count; k += nthreads) {
    const u64 v = goep_ll_gather(s, k, 8, bytes, aligned);
    goep_ll16_store(dst + k, (u32)v, (u32)(v >> 32), flag);
  }
}

__device__ __forceinline__ void goep_ll8_put(goep_ll8* dst, const void* src, u64 bytes, u32 flag, u32 tid,
                                             u32 nthreads) {
  const char* s = (const char*)src;
  const bool aligned = ((u64)s & 3) == 0;
  const u64 count = (bytes + 3) / 4;
  for (u64 k = tid; k < count; k += nthreads) {
    goep_ll8_store(dst + k, (u32)goep_ll_gather(s, k, 4, bytes, aligned), flag);
  }
}

// Waits for and unpacks this thread's packets. Returns false at the first
// packet whose wait gave up (the other threads then give up too).
__device__ __forceinline__ bool goep_ll16_unpack(void* dst, const goep_ll16* src, u64 bytes, u32 flag, u32 tid,
                                                 u32 nthreads, goep_watchdog* wd, u32 id, u32 peer, u32 stage) {
  char* d = (char*)dst;
  const bool aligned = ((u64)d & 7) == 0;
  const u64 count = (bytes + 7) / 8;
  for (u64 k = tid; k < count; k += nthreads) {
    u32 lo, hi;
    if (!goep_ll16_read(src + k, flag, lo, hi, wd, id, peer, stage)) {
      return false;
    }
    goep_ll_scatter(d, k, 8, bytes, aligned, (u64)lo | ((u64)hi << 32));
  }
  return true;
}

__device__ __forceinline__ bool goep_ll8_unpack(void* dst, const goep_ll8* src, u64 bytes, u32 flag, u32 tid,
                                                u32 nthreads, goep_watchdog* wd, u32 id, u32 peer, u32 stage) {
  char* d = (char*)dst;
  const bool aligned = ((u64)d & 3) == 0;
  const u64 count = (bytes + 3) / 4;
  for (u64 k = tid; k < count; k += nthreads) {
    u32 v;
    if (!goep_ll8_read(src + k, flag, v, wd, id, peer, stage)) {
      return false;
    }
    goep_ll_scatter(d, k, 4, bytes, aligned, v);
  }
  return true;
}

#endif  // GOEP_PACKET_DEVICE_CUH
