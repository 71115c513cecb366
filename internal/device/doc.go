// Package device is the seam between host Go and the backends: one Device
// interface, implemented on CUDA GPUs and on the host (Go twins of kernels).
//
// The upper layers (channels, buffer, collectives, bench) allocate memory,
// copy, launch named kernels and share memory between ranks through the
// Device interface. Two implementations exist:
//
//   - the CUDA backend (cuda.go), which runs the NVRTC-compiled kernels of
//     package kernels on a GPU through internal/cuda;
//   - the host backend (host.go), which keeps "device" memory in anonymous
//     mmap'd host pages and runs a registered Go function in place of each
//     kernel. Ranks are goroutines of one process, so sharing memory between
//     ranks is handing over an address.
//
// The host backend is a semantic reference, not an emulator: a host kernel
// computes what the GPU kernel must compute, sequentially, so CI can check
// layouts, routing, protocols and plans without a GPU, and GPU results can be
// compared against it. It does not model the GPU memory model; protocol
// ordering is proven on GPUs.
//
// Pointers are uintptr on both backends. On the host backend a pointer is a
// real process address into memory that the garbage collector never moves;
// on the CUDA backend it is a CUdeviceptr.
package device
