// Package nccl loads NCCL (libnccl.so.2) at run time, the way internal/cuda
// loads the driver: cgo with our own declarations of the few types and
// entry points goep uses (shim.h, written from NCCL's documented C API),
// dlopen at first use, no NCCL header or library at build time. A machine
// without NCCL builds and runs everything else; asking for NCCL there is an
// error that says where it was looked for.
//
// Where: $GOEP_NCCL (that file only), else libnccl.so.2 through the dynamic
// loader's search path, else pip wheels (nvidia-nccl-cu12, -cu13:
// site-packages/nvidia/nccl/lib/libnccl.so.2) under the usual Python
// locations ($VIRTUAL_ENV, /usr/lib/python3*, /usr/local/lib/python3*,
// ~/.local/lib/python3*, /opt/*/.venv/lib/python3*, /opt/*/lib/python3*).
//
// No NVLink multicast: Load sets NCCL_NVLS_ENABLE=0 in the process
// environment when it is unset (NCCL reads it at communicator creation) and
// refuses to load when it is set to anything else, or when NCCL_ALGO asks
// for NVLS.
//
// Contexts: every call that enqueues work or creates a communicator makes
// the given CUDA context (a primary context, as internal/cuda uses) current
// on the calling thread inside the same C call, so goroutines may move
// between threads; NCCL's runtime then uses that context's device.

package nccl

/*
#cgo CFLAGS: -O2
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/goep-dev/goep/internal/dl"
)

// EnvLibrary pins the library to one file.
const EnvLibrary = "GOEP_NCCL"

// Soname is what the dynamic loader is asked for.
const Soname = "libnccl.so.2"

// ErrNotFound is wrapped by Load's error when no usable NCCL was found.
var ErrNotFound = errors.New("NCCL not found")

// Library is the loaded NCCL.
type Library struct {
	Path    string // what was dlopened
	Version int    // ncclGetVersion, e.g. 22809 for 2.28.9
	dl      *dl.Library
}

// Sym resolves another entry point of the loaded library (for callers that
// forward NCCL calls goep does not wrap).
func (l *Library) Sym(name string) (unsafe.Pointer, error) {
	if l == nil {
		return nil, errors.New("nccl: no library")
	}
	return l.dl.Sym(name)
}

// VersionString formats Version as major.minor.patch.
func (l *Library) VersionString() string {
	if l == nil {
		return ""
	}
	v := l.Version
	if v >= 10000 { // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z from 2.9 on
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}

var (
	loadOnce sync.Once
	loaded   *Library
	loadErr  error
)

// Load finds and opens NCCL once per process; later calls return the first
// result.
func Load() (*Library, error) {
	loadOnce.Do(func() { loaded, loadErr = load(searchSpec, dl.OSEnv()) })
	return loaded, loadErr
}

// searchSpec is where Load looks after $GOEP_NCCL: the dynamic loader's
// search path first (a system installation), then CUDA_HOME/CUDA_PATH,
// /usr/local/cuda and pip wheels (nvidia-nccl-cu12, -cu13).
var searchSpec = dl.Spec{
	EnvVar:       EnvLibrary,
	File:         Soname,
	Sonames:      []string{Soname},
	SonamesFirst: true,
	WheelDirs:    []string{"nvidia/nccl/lib"},
}

// GuardNVLS enforces the no-multicast rule on the process environment (see
// the package comment). Load calls it; it is exported for launchers that
// start NCCL users.
func GuardNVLS() error {
	v, ok := os.LookupEnv("NCCL_NVLS_ENABLE")
	v = strings.TrimSpace(v)
	if !ok || v == "" {
		if err := os.Setenv("NCCL_NVLS_ENABLE", "0"); err != nil {
			return fmt.Errorf("nccl: setting NCCL_NVLS_ENABLE=0: %w", err)
		}
	} else if v != "0" {
		return fmt.Errorf("nccl: NCCL_NVLS_ENABLE=%q: goep never uses NVLink multicast (it can take shared GPUs out of service); unset it or set it to 0", v)
	}
	if a := strings.TrimSpace(os.Getenv("NCCL_ALGO")); a != "" && !strings.HasPrefix(a, "^") && strings.Contains(strings.ToLower(a), "nvls") {
		return fmt.Errorf("nccl: NCCL_ALGO=%q asks for NVLS (NVLink multicast), which goep never uses", a)
	}
	return nil
}

func load(spec dl.Spec, env dl.Env) (*Library, error) {
	if err := GuardNVLS(); err != nil {
		return nil, err
	}
	lib, err := dl.Search(spec, env, open)
	var nf *dl.NotFoundError
	switch {
	case err == nil:
		return lib, nil
	case errors.As(err, &nf):
		return nil, fmt.Errorf("nccl: no usable %s (set %s to its path; tried %s): %w", Soname, EnvLibrary, strings.Join(nf.Tried, "; "), ErrNotFound)
	}
	return nil, fmt.Errorf("nccl: %w: %w", err, ErrNotFound)
}

// open loads path, resolves every entry point and installs them. The
// first library installed stays in use: a later one must be the same file.
func open(path string) (*Library, error) {
	h, err := dl.Open(path)
	if err != nil {
		return nil, err
	}
	n := int(C.gn_symbol_count())
	arr := (*unsafe.Pointer)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	defer C.free(unsafe.Pointer(arr))
	fns := unsafe.Slice(arr, n)
	for i := range fns {
		name := C.GoString(C.gn_symbol_name(C.int(i)))
		p, err := h.Sym(name)
		if err != nil && C.gn_symbol_required(C.int(i)) != 0 {
			h.Close()
			return nil, fmt.Errorf("not an NCCL library (no %s)", name)
		}
		fns[i] = p
	}
	// Ask the version before installing, so that a library that fails
	// here leaves nothing behind for the next candidate.
	var v C.int
	if r := C.gn_version_of(fns[0], &v); r != 0 {
		h.Close()
		return nil, fmt.Errorf("ncclGetVersion failed (%d)", int(r))
	}
	if C.gn_install(arr) != 0 {
		h.Close()
		return nil, errors.New("another NCCL library is installed already")
	}
	return &Library{Path: path, Version: int(v), dl: h}, nil
}

// ---------------------------------------------------------------------------
// Types and calls.

// DataType is ncclDataType_t.
type DataType int

const (
	Int8       DataType = 0
	Uint8      DataType = 1
	Int32      DataType = 2
	Uint32     DataType = 3
	Int64      DataType = 4
	Uint64     DataType = 5
	Float16    DataType = 6
	Float32    DataType = 7
	Float64    DataType = 8
	Bfloat16   DataType = 9
	Float8e4m3 DataType = 10 // NCCL 2.24 and later
	Float8e5m2 DataType = 11 // NCCL 2.24 and later
	// NumTypes bounds the valid types (ncclNumTypes).
	NumTypes = 12
)

// Size is the element size in bytes (0 for an unknown type).
func (d DataType) Size() int {
	switch d {
	case Int8, Uint8, Float8e4m3, Float8e5m2:
		return 1
	case Float16, Bfloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

func (d DataType) String() string {
	names := [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"}
	if d >= 0 && int(d) < len(names) {
		return names[d]
	}
	return fmt.Sprintf("datatype(%d)", int(d))
}

// RedOp is ncclRedOp_t.
type RedOp int

const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
	// NumOps bounds the built-in reductions (ncclNumOps).
	NumOps = 5
)

func (o RedOp) String() string {
	names := [...]string{"sum", "prod", "max", "min", "avg"}
	if o >= 0 && int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("redop(%d)", int(o))
}

// UniqueIDSize is sizeof(ncclUniqueId).
const UniqueIDSize = C.GN_UNIQUE_ID_BYTES

// UniqueID is an ncclUniqueId: rank 0 makes it, every rank passes it to
// InitRank.
type UniqueID [UniqueIDSize]byte

// Error is a failed NCCL call.
type Error struct {
	Op   string
	Code int    // ncclResult_t, or negative for the shim's own failures
	Msg  string // ncclGetErrorString
	Last string // ncclGetLastError, when NCCL has it and said something
}

func (e *Error) Error() string {
	if e == nil {
		return "nccl: nil *Error"
	}
	s := fmt.Sprintf("nccl: %s: %s (%d)", e.Op, e.Msg, e.Code)
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

func check(op string, r C.int, comm uintptr) error {
	if r == 0 {
		return nil
	}
	e := &Error{Op: op, Code: int(r)}
	switch r {
	case C.GN_ERR_NOT_LOADED:
		e.Msg = "NCCL is not loaded"
	case C.GN_ERR_BIND:
		e.Msg = "cannot make the CUDA context current (libcuda's cuCtxSetCurrent)"
	case C.GN_ERR_MISSING:
		e.Msg = "the loaded NCCL does not export this entry point"
	default:
		e.Msg = C.GoString(C.gn_error_string(r))
		if comm != 0 {
			if s := C.gn_last_error(C.uintptr_t(comm)); s != nil {
				e.Last = C.GoString(s)
			}
		}
	}
	return e
}

// GetUniqueID makes a new unique id (rank 0 calls it once per communicator).
func GetUniqueID() (UniqueID, error) {
	var id UniqueID
	if _, err := Load(); err != nil {
		return id, err
	}
	err := check("ncclGetUniqueId", C.gn_unique_id((*C.uchar)(unsafe.Pointer(&id[0]))), 0)
	return id, err
}

var cudaOnce sync.Once
var cudaErr error

// loadCUDA opens the driver for the context binding (the same library
// internal/cuda opened: $GOEP_LIBCUDA or libcuda.so.1). cuCtxGetCurrent and
// cuCtxSetCurrent have never had versioned variants, so their plain names
// are the only ABI.
func loadCUDA() error {
	cudaOnce.Do(func() {
		path := os.Getenv("GOEP_LIBCUDA")
		if path == "" {
			path = "libcuda.so.1"
		}
		h, err := dl.Open(path)
		if err != nil {
			cudaErr = fmt.Errorf("nccl: loading %s for context binding: %w", path, err)
			return
		}
		get, err1 := h.Sym("cuCtxGetCurrent")
		set, err2 := h.Sym("cuCtxSetCurrent")
		if err := errors.Join(err1, err2); err != nil {
			h.Close()
			cudaErr = fmt.Errorf("nccl: loading %s for context binding: %w", path, err)
			return
		}
		C.gn_install_cuda(get, set)
	})
	return cudaErr
}

// Comm is an ncclComm_t with the CUDA context its calls bind.
type Comm struct {
	h          uintptr
	ctx        uintptr
	rank, size int
}

// InitRank joins rank of an nranks-rank communicator (ncclCommInitRank);
// it returns once every rank has called it. ctx is the CUcontext of this
// rank's GPU (0 binds nothing: for test doubles on host memory).
func InitRank(ctx uintptr, nranks int, id UniqueID, rank int) (*Comm, error) {
	if _, err := Load(); err != nil {
		return nil, err
	}
	if ctx != 0 {
		if err := loadCUDA(); err != nil {
			return nil, err
		}
	}
	r := C.gn_comm_init_rank(C.uintptr_t(ctx), C.int(nranks), (*C.uchar)(unsafe.Pointer(&id[0])), C.int(rank))
	if err := check(fmt.Sprintf("ncclCommInitRank(rank %d of %d)", rank, nranks), r.r, 0); err != nil {
		return nil, err
	}
	return &Comm{h: uintptr(r.v), ctx: ctx, rank: rank, size: nranks}, nil
}

// Handle is the ncclComm_t (0 after Destroy or Abort).
func (c *Comm) Handle() uintptr {
	if c == nil {
		return 0
	}
	return c.h
}

// Rank and Size are the communicator's.
func (c *Comm) Rank() int {
	if c == nil {
		return 0
	}
	return c.rank
}

// Size is the number of ranks.
func (c *Comm) Size() int {
	if c == nil {
		return 0
	}
	return c.size
}

// Destroy frees the communicator (ncclCommDestroy) after its work is done.
func (c *Comm) Destroy() error {
	if c == nil || c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return check("ncclCommDestroy", C.gn_comm_destroy(C.uintptr_t(c.ctx), C.uintptr_t(h)), 0)
}

// Abort ends the communicator's pending work and frees it (ncclCommAbort).
func (c *Comm) Abort() error {
	if c == nil || c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return check("ncclCommAbort", C.gn_comm_abort(C.uintptr_t(c.ctx), C.uintptr_t(h)), 0)
}

// AsyncError reports an asynchronous failure of the communicator
// (ncclCommGetAsyncError); nil while none happened.
func (c *Comm) AsyncError() error {
	if c == nil || c.h == 0 {
		return nil
	}
	var e C.int
	if err := check("ncclCommGetAsyncError", C.gn_comm_async_error(C.uintptr_t(c.h), &e), c.h); err != nil {
		return err
	}
	if e == 0 || e == 7 { // ncclSuccess, ncclInProgress
		return nil
	}
	return check("asynchronous error", e, c.h)
}

// AllReduce enqueues ncclAllReduce of count elements on stream (a CUstream).
func (c *Comm) AllReduce(send, recv uintptr, count int, dt DataType, op RedOp, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclAllReduce", C.gn_all_reduce(C.uintptr_t(c.ctx), C.uint64_t(send), C.uint64_t(recv), C.size_t(count),
		C.int(dt), C.int(op), C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// AllGather enqueues ncclAllGather of count elements per rank.
func (c *Comm) AllGather(send, recv uintptr, count int, dt DataType, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclAllGather", C.gn_all_gather(C.uintptr_t(c.ctx), C.uint64_t(send), C.uint64_t(recv), C.size_t(count),
		C.int(dt), C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// ReduceScatter enqueues ncclReduceScatter of count elements per rank.
func (c *Comm) ReduceScatter(send, recv uintptr, count int, dt DataType, op RedOp, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclReduceScatter", C.gn_reduce_scatter(C.uintptr_t(c.ctx), C.uint64_t(send), C.uint64_t(recv),
		C.size_t(count), C.int(dt), C.int(op), C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Broadcast enqueues ncclBroadcast of count elements from root.
func (c *Comm) Broadcast(send, recv uintptr, count int, dt DataType, root int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclBroadcast", C.gn_broadcast(C.uintptr_t(c.ctx), C.uint64_t(send), C.uint64_t(recv), C.size_t(count),
		C.int(dt), C.int(root), C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Reduce enqueues ncclReduce of count elements into root's recv.
func (c *Comm) Reduce(send, recv uintptr, count int, dt DataType, op RedOp, root int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclReduce", C.gn_reduce(C.uintptr_t(c.ctx), C.uint64_t(send), C.uint64_t(recv), C.size_t(count),
		C.int(dt), C.int(op), C.int(root), C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Send enqueues ncclSend of count elements to peer.
func (c *Comm) Send(send uintptr, count int, dt DataType, peer int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclSend", C.gn_send(C.uintptr_t(c.ctx), C.uint64_t(send), C.size_t(count), C.int(dt), C.int(peer),
		C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Recv enqueues ncclRecv of count elements from peer.
func (c *Comm) Recv(recv uintptr, count int, dt DataType, peer int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclRecv", C.gn_recv(C.uintptr_t(c.ctx), C.uint64_t(recv), C.size_t(count), C.int(dt), C.int(peer),
		C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// AllToAll enqueues ncclAlltoAll (NCCL 2.28 and later) of count elements
// per peer.
func (c *Comm) AllToAll(send, recv uintptr, count int, dt DataType, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclAlltoAll", C.gn_all_to_all(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(dt),
		C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Gather enqueues ncclGather (NCCL 2.28 and later) of count elements per
// rank into root's recv.
func (c *Comm) Gather(send, recv uintptr, count int, dt DataType, root int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclGather", C.gn_gather(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(dt), C.int(root),
		C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// Scatter enqueues ncclScatter (NCCL 2.28 and later) of count elements
// per rank from root's send.
func (c *Comm) Scatter(send, recv uintptr, count int, dt DataType, root int, stream uintptr) error {
	if c == nil {
		return errNil("Comm")
	}
	return check("ncclScatter", C.gn_scatter(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(dt), C.int(root),
		C.uintptr_t(c.h), C.uintptr_t(stream)), c.h)
}

// IsMissing reports whether err is a call the loaded NCCL does not export
// (an optional entry point; the test stand-in lacks them).
func IsMissing(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == C.GN_ERR_MISSING
}

// GroupStart opens an NCCL group on the calling thread (ncclGroupStart):
// the calls up to GroupEnd are issued together. NCCL's groups are per
// thread: call both on one OS thread (runtime.LockOSThread).
func GroupStart() error { return check("ncclGroupStart", C.gn_group_start(), 0) }

// GroupEnd closes the group (ncclGroupEnd).
func GroupEnd() error { return check("ncclGroupEnd", C.gn_group_end(), 0) }
