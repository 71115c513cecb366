// Package userkernel builds and launches a user's own CUDA kernels on goep's
// channels, as MSCCL++'s channel tutorial does with its own: the user writes
// a kernel that takes the device handles of goep's memory and port channels
// (and semaphores) and calls the device API of goep's headers
// (goep_pc_put_with_signal_and_flush, goep_mc_put, goep_mc_wait, ...), and
// goep compiles it for the GPU at hand, loads it and launches it.
//
//	src := userkernel.Source{Name: "mine", Code: `#include "channel_device.cuh"
//	extern "C" __global__ void mine(const goep_port_channel* chans, u32 rank, u32 n, u64 slice) { ... }`}
//	mod, err := userkernel.Load(ctx, comm, src)          // collective
//	handles, err := comm.UploadPortChannels(mesh.ByRank(comm.Size()))
//	err = mod.Launch("mine", userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(32)},
//		userkernel.NewArgs(4).Ptr(handles.Ptr()).U32(uint32(rank)).U32(uint32(n)).U64(slice))
//	err = mod.Synchronize(nil)                            // a device wait that timed out comes back here
//
// Compiling. On the CUDA backend the source goes to NVRTC with goep's own
// options and every header of package kernels available to #include
// (channel_device.cuh for memory channels, port_device.cuh, sem_device.cuh,
// packet_device.cuh, fifo_device.cuh, common.cuh; kernels.Headers lists
// them), for the GPU's exact architecture, through goep's compiler and its
// disk cache (the key hashes the source: a changed source never meets a
// stale CUBIN). A source NVRTC rejects fails Load with NVRTC's log
// (*kernels.CompileError), whose lines cite Source.Name + ".cu" and the
// user's own line numbers. Kernels are the source's extern "C" __global__
// functions, written `extern "C" __global__ void name(` on one line. Load
// also compiles static_asserts of the handle structs' sizes and offsets, as
// the Go side encodes them (channels/devapi), into the program, so a header
// and a Go side that disagree cannot run. A kernel name means one kernel for
// the life of the process (loaded code is cached by name): give a changed
// kernel a new name.
//
// Handles. Kernels take arrays of handles in device memory:
// Communicator.UploadPortChannels, UploadMemoryChannels, UploadSemaphores,
// or UploadHandleBytes with the handles' bytes (DeviceHandleBytes) laid out
// as the user likes.
//
// Ranks sharing a GPU. Goroutine ranks may share a GPU; kernels that wait on
// each other must then be resident at once. Launch refuses a grid above the
// communicator's spin budget (channels.Placement.SpinBlocks, SMs / ranks - 1
// blocks), saying so, unless the launch declares NoPeerWaits. Load preloads
// the kernels and ends with a barrier, so no rank loads code while a peer's
// kernel spins.
//
// Bounded waits. Every wait of goep's device API is bounded by the
// communicator's watchdog (channels.Timeouts.Wait): a kernel whose peer
// never signals returns (the wait returns false; the kernel should return
// too), and Synchronize reports a *channels.TimeoutError naming the channel,
// the peer, the stage and what was awaited. Waits a user writes himself
// should use goep_wait_ge_u64 or goep_spin_ok with Communicator.Watchdog:
// an unbounded spin is the one hang goep cannot prevent.
//
// Backends. User kernels run on a GPU, or on CPU threads in goep's CPU
// emulation (internal/cpuemu, which goep's tests and ep-bench use on
// machines without one: the same source, compiled by g++). The plain host
// backend runs only goep's own kernels, through their Go twins; Load
// refuses it with ErrNeedsGPU.
//
// userkernel/tutorial is the channel tutorial itself (every rank puts its
// slice of one buffer to every peer, with port or memory channels, and
// checks what arrived); `ep-bench userkernel` runs it.
package userkernel
