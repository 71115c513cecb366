// proxy_kernels.cu: kernels the port channel proxy (channels/proxy.go)
// launches itself, on a connection's stream, for what the copy engines
// cannot do. A CPU has no atomics on a peer GPU's memory, so an atomic add
// on a CUDA IPC connection is this one-thread kernel, queued after the
// connection's earlier copies (stream order puts it after their data).
#include "common.cuh"

// *p += v on a 64-bit word of (usually peer) GPU memory: a release
// reduction at system scope, so that a kernel on the owning GPU that
// acquires the word also sees what preceded it on this stream.
extern "C" __global__ void goep_proxy_atomic_add(u64* p, u64 v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
