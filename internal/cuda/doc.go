// Package cuda is goep's cgo layer over the CUDA driver, loaded at run time
// through cuGetProcAddress_v2 at a fixed API version.
//
// Loading. The package is built with cgo but links only libdl: no cuda.h, no
// libcuda at link time. shim.h declares, in our own names, the few types and
// structs we need, written from the documented CUDA 12.0 ABI. At run time
// Load dlopens libcuda.so.1 (or $GOEP_LIBCUDA) with RTLD_NOW|RTLD_LOCAL,
// takes the one symbol cuGetProcAddress_v2 with dlsym, and resolves every
// other entry point through it by its plain name ("cuMemAlloc",
// "cuStreamBeginCapture", ...) at the fixed API version 12000. The driver
// then returns the implementation the CUDA 12.0 headers bind that name to
// (cuMemAlloc_v2, cuStreamBeginCapture_v2, cuGraphInstantiateWithFlags...),
// whatever newer versions it also has, so our declarations stay valid on
// every future driver. A missing entry point is an error naming it. The one
// exception is optional: cuMemcpyBatchAsync, resolved at 12080 (its first
// form), is nil on older drivers and MemcpyBatchAsync then answers
// ErrNotSupported (HasMemcpyBatch). Loading
// happens once (cuInit(0) included) and never panics: without a driver,
// Load returns an error wrapping ErrNoDriver. The same binary thus builds and
// runs its CPU-only tests on machines without a GPU.
//
// Contexts. The current CUDA context is per OS thread, and goroutines move
// between threads. Instead of runtime.LockOSThread, every call that needs a
// context carries it (directly, or via its Stream, Event, Function...), and
// the C helper makes it current inside the same cgo call: it compares
// cuCtxGetCurrent with the wanted context and calls cuCtxSetCurrent only when
// they differ. One cgo crossing per operation, correct on any thread.
// Contexts are primary contexts (Device.Retain / Context.Release), the ones
// the CUDA runtime and engines such as PyTorch use, so handles can be shared.
//
// Cost. Hot calls (launch, event record, stream query, async copies) do not
// allocate: handles cross as integers, outputs come back in C structs by
// value, and KernelArgs reuses its buffer.
package cuda
