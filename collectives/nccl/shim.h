// Copyright the goep authors. Declarations written for goep; see doc.go.
//
// shim.h declares, in our own names (prefix gn), the slice of the NCCL ABI
// goep uses, written from NCCL's documented C API (nccl.h, 2.12 and later,
// LP64 Linux): ncclResult_t, ncclDataType_t and ncclRedOp_t are int-sized
// enums, ncclComm_t is a pointer, ncclUniqueId is a 128-byte struct passed
// by value, cudaStream_t is a pointer. No NCCL header is included.
#ifndef GOEP_NCCL_SHIM_H
#define GOEP_NCCL_SHIM_H

#include <stddef.h>
#include <stdint.h>

#define GN_UNIQUE_ID_BYTES 128

typedef int gnResult;                  // ncclResult_t
typedef struct gn_comm_opaque *gnComm; // ncclComm_t
typedef struct {
	char internal[GN_UNIQUE_ID_BYTES];
} gnUniqueId; // ncclUniqueId
typedef int gnDataType;                // ncclDataType_t
typedef int gnRedOp;                   // ncclRedOp_t
typedef void *gnStream;                // cudaStream_t (a CUstream)

// Entry points that return ncclResult_t: X(name, params).
#define GN_API(X)                                                                         \
	X(ncclGetVersion, (int *version))                                                    \
	X(ncclGetUniqueId, (gnUniqueId * uniqueId))                                          \
	X(ncclCommInitRank, (gnComm * comm, int nranks, gnUniqueId commId, int rank))        \
	X(ncclCommDestroy, (gnComm comm))                                                    \
	X(ncclCommAbort, (gnComm comm))                                                      \
	X(ncclCommGetAsyncError, (gnComm comm, gnResult * asyncError))                       \
	X(ncclAllReduce, (const void *sendbuff, void *recvbuff, size_t count,                \
	                  gnDataType datatype, gnRedOp op, gnComm comm, gnStream stream))    \
	X(ncclAllGather, (const void *sendbuff, void *recvbuff, size_t sendcount,            \
	                  gnDataType datatype, gnComm comm, gnStream stream))                \
	X(ncclReduceScatter, (const void *sendbuff, void *recvbuff, size_t recvcount,        \
	                      gnDataType datatype, gnRedOp op, gnComm comm, gnStream stream))

// Entry points goep's collectives do not need but forwarders do; a library
// without them (the test stand-in) still loads, and calling one is
// GN_ERR_MISSING: X(name, params).
#define GN_OPT_API(X)                                                                     \
	X(ncclBroadcast, (const void *sendbuff, void *recvbuff, size_t count,                \
	                  gnDataType datatype, int root, gnComm comm, gnStream stream))      \
	X(ncclReduce, (const void *sendbuff, void *recvbuff, size_t count,                   \
	               gnDataType datatype, gnRedOp op, int root, gnComm comm, gnStream stream)) \
	X(ncclSend, (const void *sendbuff, size_t count, gnDataType datatype, int peer,      \
	             gnComm comm, gnStream stream))                                          \
	X(ncclRecv, (void *recvbuff, size_t count, gnDataType datatype, int peer,            \
	             gnComm comm, gnStream stream))                                          \
	X(ncclGroupStart, (void))                                                            \
	X(ncclGroupEnd, (void))                                                              \
	X(ncclAlltoAll, (const void *sendbuff, void *recvbuff, size_t count, gnDataType datatype, \
	                 gnComm comm, gnStream stream))                                      \
	X(ncclGather, (const void *sendbuff, void *recvbuff, size_t count, gnDataType datatype, \
	               int root, gnComm comm, gnStream stream))                              \
	X(ncclScatter, (const void *sendbuff, void *recvbuff, size_t count, gnDataType datatype, \
	                int root, gnComm comm, gnStream stream))

// Status codes of the shim itself (negative, never NCCL's).
#define GN_ERR_NOT_LOADED (-1)
#define GN_ERR_BIND (-2) // cuCtxSetCurrent failed or libcuda is missing
#define GN_ERR_MISSING (-3) // the library lacks the entry point (see GN_OPT_API)

typedef struct {
	int r;
	uintptr_t v;
} gnRet;

// Loader: the Go side opens the library (internal/dl) and resolves, in
// order, gn_symbol_name(0 .. gn_symbol_count()-1) (gn_symbol_required says
// which may be NULL), then installs the pointers. gn_install returns 1 and
// keeps the table when a library was installed before (the first stays in
// use), else 0.
int gn_symbol_count(void);
const char *gn_symbol_name(int i);
int gn_symbol_required(int i);
int gn_install(void *const *fns);
// The driver's cuCtxGetCurrent and cuCtxSetCurrent, for the context binding.
void gn_install_cuda(void *get, void *set);
int gn_loaded(void);

const char *gn_error_string(int r);
const char *gn_last_error(uintptr_t comm); // NULL when NCCL lacks ncclGetLastError
int gn_version(int *v);
int gn_version_of(void *ncclGetVersion, int *v);
int gn_unique_id(unsigned char *out);

// Calls with a context bind it on the calling thread first (ctx 0: none, for
// fakes on host memory) in the same C call.
gnRet gn_comm_init_rank(uintptr_t ctx, int nranks, const unsigned char *id, int rank);
int gn_comm_destroy(uintptr_t ctx, uintptr_t comm);
int gn_comm_abort(uintptr_t ctx, uintptr_t comm);
int gn_comm_async_error(uintptr_t comm, int *err);
int gn_all_reduce(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, uintptr_t comm,
                  uintptr_t stream);
int gn_all_gather(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, uintptr_t comm, uintptr_t stream);
int gn_reduce_scatter(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, uintptr_t comm,
                      uintptr_t stream);

int gn_broadcast(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm,
                 uintptr_t stream);
int gn_reduce(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, int root, uintptr_t comm,
              uintptr_t stream);
int gn_send(uintptr_t ctx, uint64_t send, size_t count, int dt, int peer, uintptr_t comm, uintptr_t stream);
int gn_recv(uintptr_t ctx, uint64_t recv, size_t count, int dt, int peer, uintptr_t comm, uintptr_t stream);
int gn_all_to_all(uint64_t send, uint64_t recv, size_t count, int dt, uintptr_t comm, uintptr_t stream);
int gn_gather(uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm, uintptr_t stream);
int gn_scatter(uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm, uintptr_t stream);
int gn_group_start(void);
int gn_group_end(void);

#endif // GOEP_NCCL_SHIM_H
