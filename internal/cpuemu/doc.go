// Package cpuemu runs goep's real CUDA kernels on CPU threads, so that CI
// machines without a GPU execute the kernel sources themselves, not only
// their Go twins.
//
// At first launch of a kernel, the .cu file that defines it and every
// header are taken from package kernels (the embedded sources the GPU build
// compiles), translated (translate.go: inline PTX to runtime calls,
// __shared__ declarations to per-block storage), and compiled by g++
// (C++20, -O1) with runtime/emu_runtime.h into a shared object that is
// cached by the hash of everything that went into it
// ($GOEP_CPUEMU_CACHE, else <user cache dir>/goep/cpuemu) and loaded with
// dlopen. Nothing derived from the sources is committed, so nothing can go
// stale. Device wraps a host-backend device (host memory, goroutine ranks,
// the Go proxy of port channels) and runs its launches in the emulation.
//
// The model: every CUDA thread of a launch is an OS thread and the blocks
// of a grid run at once, up to 2048 threads a launch (grids beyond that run
// in waves on the same threads, as blocks wait for a free SM on a full
// GPU; the protocol kernels, whose blocks wait for each other, are launched
// smaller in the emulated tests). __syncthreads is a
// block barrier that returning threads leave; warp collectives
// (__shfl*_sync, __ballot_sync, __syncwarp, ...) rendezvous the lanes of
// their mask; shared memory is per block and starts poisoned (0xA5), as
// uninitialised shared memory would be. The PTX the kernels use becomes
// C++ atomics with the orders it names: ld.acquire and st.release are
// acquire loads and release stores, ld/st.relaxed relaxed ones, fence.acq_rel
// and fence.sc are fences of those orders, red/atom are read-modify-writes
// of their order; CUDA's atomic* functions are relaxed. Volatile and
// multi-word accesses (LL packets, FIFO triggers) are single-copy atomic
// per 8 bytes and no wider, and vector stores write their halves in
// alternating order; vector loads and stores check their alignment and
// fail on a null page, where a GPU would fault. Every wait is bounded: a
// barrier or warp rendezvous longer than Options.WaitLimit fails the
// launch, and every thread then leaves at its
// next barrier or poll. A thread that polls the same value again and again
// yields, then sleeps (up to 100 us), so that the threads with work get the
// cores.
//
// What it cannot model:
//   - The GPU's weaker memory model. The emulated kernels run on x86-64,
//     which is multi-copy atomic and keeps stores in order (TSO): a missing
//     fence or a plain access where the PTX model needs .acquire/.release
//     usually still works here. g++ may reorder plain accesses around
//     relaxed atomics as the C++ model allows, which catches some of these,
//     not all. Scopes (.cta, .gpu, .sys) are all one coherent system.
//   - Non-coherent and cached loads (ld.global.nc, .cg, L1 hints): here
//     every load sees the latest store, where a GPU may serve a stale line.
//   - Warp-synchronous execution: lanes run independently between
//     collectives (as on Volta and later with independent thread
//     scheduling), so code that relies on lock-step lanes without
//     __syncwarp is not caught as wrong, nor modelled as right.
//   - Timing: the GPU's global timer is the host's monotonic clock, and
//     emulated kernels are orders of magnitude slower; timeouts in tests
//     must be generous. Performance says nothing here.
//   - Hopper-only paths (TMA, mbarrier expect-tx): kernels/intranode_tma.cu
//     is not emulated (its plain build is intranode.cu's dispatch), nor are
//     sem_lab.cu and ce_lab.cu (they measure GPUs).
//   - Device memory faults beyond the null page and misalignment: an
//     out-of-bounds access reads or writes whatever host memory is there.
//
// Skips: tests that use the emulation skip, saying why, when no C++
// compiler is installed (Compiler, ErrNoCompiler); CI installs g++.
package cpuemu
