// Copyright the goep authors.
//
// The NCCL C API of libgoep_nccl.so. Each entry point checks what C can
// (handles, NULL outputs) and passes plain scalars to the Go side
// (exports.go), which does the work and returns an ncclResult_t. Every
// entry point has its p-prefixed alias (NCCL's profiling names).

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h"
#include "ncclshim.h"

#define GS_ALIAS(name) __attribute__((visibility("default"), alias(#name)))
#define GS_API __attribute__((visibility("default")))

typedef gs_comm *gsComm;

static uint64_t tid(void) { return (uint64_t)pthread_self(); }

// comm_id checks a handle: 0 when it is not one of ours.
static uint64_t comm_id(gsComm c) {
	if (c == NULL || c->magic != GS_COMM_MAGIC) return 0;
	return c->id;
}

static gsResult bad_comm(const char *call, gsComm c) {
	char msg[160];
	snprintf(msg, sizeof msg, "%s: %s communicator", call,
	         c == NULL ? "NULL" : "not a goep (or an already destroyed)");
	return goepNcclFail(GS_INVALID_ARGUMENT, msg);
}

#define COMM_OR_FAIL(call, c)               \
	uint64_t id_ = comm_id(c);              \
	if (id_ == 0) return bad_comm(call, c)

static gsComm new_handle(uint64_t id) {
	gsComm h = (gsComm)malloc(sizeof *h);
	if (h == NULL) return NULL;
	h->magic = GS_COMM_MAGIC;
	h->id = id;
	return h;
}

// ---- Version, ids, errors ---------------------------------------------------

GS_API gsResult ncclGetVersion(int *version) {
	if (version == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclGetVersion: version is NULL");
	*version = goepNcclVersion(GS_VERSION_CODE);
	return GS_SUCCESS;
}
gsResult pncclGetVersion(int *version) GS_ALIAS(ncclGetVersion);

GS_API gsResult ncclGetUniqueId(gsUniqueId *id) {
	if (id == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclGetUniqueId: uniqueId is NULL");
	return goepNcclGetUniqueId(id->internal);
}
gsResult pncclGetUniqueId(gsUniqueId *id) GS_ALIAS(ncclGetUniqueId);

static const char *const gs_errors[] = {
	"no error",
	"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
	"unhandled system error (run with NCCL_DEBUG=INFO for details)",
	"internal error - please report this issue to the NCCL developers",
	"invalid argument (run with NCCL_DEBUG=WARN for details)",
	"invalid usage (run with NCCL_DEBUG=WARN for details)",
	"remote process exited or there was a network error",
	"NCCL operation in progress",
	"timeout",
};

GS_API const char *ncclGetErrorString(gsResult r) {
	if (r < 0 || r >= GS_NUM_RESULTS) return "unknown result code";
	return gs_errors[r];
}
const char *pncclGetErrorString(gsResult r) GS_ALIAS(ncclGetErrorString);

static __thread char gs_last[1024];

GS_API const char *ncclGetLastError(gsComm comm) {
	(void)comm;
	goepNcclLastError(gs_last, (int)sizeof gs_last);
	return gs_last;
}
const char *pncclGetLastError(gsComm comm) GS_ALIAS(ncclGetLastError);

// ---- Communicators ------------------------------------------------------------

static gsResult init_rank(const char *call, gsComm *comm, int nranks, gsUniqueId *id, int rank) {
	uint64_t h = 0;
	gsResult r;
	if (comm == NULL) {
		char msg[96];
		snprintf(msg, sizeof msg, "%s: comm is NULL", call);
		return goepNcclFail(GS_INVALID_ARGUMENT, msg);
	}
	*comm = NULL;
	r = goepNcclCommInitRank(tid(), &h, nranks, id->internal, rank);
	if (r != GS_SUCCESS) return r;
	*comm = new_handle(h);
	if (*comm == NULL) {
		goepNcclCommEnd(h, 2);
		return goepNcclFail(GS_SYSTEM_ERROR, "out of memory");
	}
	return GS_SUCCESS;
}

GS_API gsResult ncclCommInitRank(gsComm *comm, int nranks, gsUniqueId id, int rank) {
	return init_rank("ncclCommInitRank", comm, nranks, &id, rank);
}
gsResult pncclCommInitRank(gsComm *comm, int nranks, gsUniqueId id, int rank) GS_ALIAS(ncclCommInitRank);

GS_API gsResult ncclCommInitRankConfig(gsComm *comm, int nranks, gsUniqueId id, int rank, gsConfigHead *config) {
	// Blocking or not, the shim finishes before returning, which both modes
	// allow; no other field changes what it does.
	if (config != NULL && (config->magic != GS_CONFIG_MAGIC || config->size < sizeof(gsConfigHead))) {
		return goepNcclFail(GS_INVALID_ARGUMENT,
		                    "ncclCommInitRankConfig: config was not set up with NCCL_CONFIG_INITIALIZER");
	}
	return init_rank("ncclCommInitRankConfig", comm, nranks, &id, rank);
}
gsResult pncclCommInitRankConfig(gsComm *comm, int nranks, gsUniqueId id, int rank, gsConfigHead *config)
	GS_ALIAS(ncclCommInitRankConfig);

GS_API gsResult ncclCommInitAll(gsComm *comms, int ndev, const int *devlist) {
	uint64_t *ids;
	gsResult r;
	if (comms == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclCommInitAll: comm is NULL");
	if (ndev < 1) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclCommInitAll: ndev < 1");
	ids = (uint64_t *)calloc((size_t)ndev, sizeof *ids);
	if (ids == NULL) return goepNcclFail(GS_SYSTEM_ERROR, "out of memory");
	r = goepNcclCommInitAll(ids, ndev, (int *)devlist);
	for (int i = 0; i < ndev; i++) comms[i] = NULL;
	if (r == GS_SUCCESS) {
		for (int i = 0; i < ndev; i++) {
			comms[i] = new_handle(ids[i]);
			if (comms[i] == NULL) r = GS_SYSTEM_ERROR;
		}
	}
	free(ids);
	return r;
}
gsResult pncclCommInitAll(gsComm *comms, int ndev, const int *devlist) GS_ALIAS(ncclCommInitAll);

GS_API gsResult ncclCommFinalize(gsComm comm) {
	COMM_OR_FAIL("ncclCommFinalize", comm);
	return goepNcclCommEnd(id_, 0);
}
gsResult pncclCommFinalize(gsComm comm) GS_ALIAS(ncclCommFinalize);

static gsResult end(const char *call, gsComm comm, int how) {
	gsResult r;
	if (comm == NULL) return GS_SUCCESS; // NCCL accepts a NULL comm here
	COMM_OR_FAIL(call, comm);
	r = goepNcclCommEnd(id_, how);
	comm->magic = 0;
	free(comm);
	return r;
}

GS_API gsResult ncclCommDestroy(gsComm comm) { return end("ncclCommDestroy", comm, 1); }
gsResult pncclCommDestroy(gsComm comm) GS_ALIAS(ncclCommDestroy);

GS_API gsResult ncclCommAbort(gsComm comm) { return end("ncclCommAbort", comm, 2); }
gsResult pncclCommAbort(gsComm comm) GS_ALIAS(ncclCommAbort);

GS_API gsResult ncclCommSplit(gsComm comm, int color, int key, gsComm *newcomm, gsConfigHead *config) {
	uint64_t h = 0;
	gsResult r;
	(void)config; // as in ncclCommInitRankConfig
	COMM_OR_FAIL("ncclCommSplit", comm);
	if (newcomm == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclCommSplit: newcomm is NULL");
	*newcomm = NULL;
	r = goepNcclCommSplit(id_, color, key, &h);
	if (r == GS_SUCCESS && h != 0) {
		*newcomm = new_handle(h);
		if (*newcomm == NULL) {
			goepNcclCommEnd(h, 2);
			return goepNcclFail(GS_SYSTEM_ERROR, "out of memory");
		}
	}
	return r;
}
gsResult pncclCommSplit(gsComm comm, int color, int key, gsComm *newcomm, gsConfigHead *config)
	GS_ALIAS(ncclCommSplit);

#define QUERY(name, what, T, outname)                                                 \
	GS_API gsResult name(gsComm comm, T *outname) {                                   \
		COMM_OR_FAIL(#name, comm);                                                    \
		if (outname == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, #name ": NULL output"); \
		return goepNcclCommQuery(id_, what, (int *)outname);                          \
	}                                                                                 \
	gsResult p##name(gsComm comm, T *outname) GS_ALIAS(name);

QUERY(ncclCommCount, 0, int, count)
QUERY(ncclCommCuDevice, 1, int, device)
QUERY(ncclCommUserRank, 2, int, rank)
QUERY(ncclCommGetAsyncError, 3, gsResult, asyncError)

// ---- Collectives and point-to-point -----------------------------------------------

static gsResult call(const char *name, gsComm comm, int kind, const void *send, void *recv, size_t count,
                     gsDataType dt, gsRedOp op, int root, gsStream stream) {
	COMM_OR_FAIL(name, comm);
	return goepNcclCall(tid(), id_, kind, (uintptr_t)send, (uintptr_t)recv, count, dt, op, root, (uintptr_t)stream);
}

GS_API gsResult ncclAllReduce(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op, gsComm comm,
                              gsStream stream) {
	return call("ncclAllReduce", comm, GS_ALLREDUCE, send, recv, count, dt, op, 0, stream);
}
gsResult pncclAllReduce(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op, gsComm comm,
                        gsStream stream) GS_ALIAS(ncclAllReduce);

GS_API gsResult ncclAllGather(const void *send, void *recv, size_t count, gsDataType dt, gsComm comm,
                              gsStream stream) {
	return call("ncclAllGather", comm, GS_ALLGATHER, send, recv, count, dt, 0, 0, stream);
}
gsResult pncclAllGather(const void *send, void *recv, size_t count, gsDataType dt, gsComm comm, gsStream stream)
	GS_ALIAS(ncclAllGather);

GS_API gsResult ncclReduceScatter(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op,
                                  gsComm comm, gsStream stream) {
	return call("ncclReduceScatter", comm, GS_REDUCESCATTER, send, recv, count, dt, op, 0, stream);
}
gsResult pncclReduceScatter(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op, gsComm comm,
                            gsStream stream) GS_ALIAS(ncclReduceScatter);

GS_API gsResult ncclBroadcast(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                              gsStream stream) {
	return call("ncclBroadcast", comm, GS_BROADCAST, send, recv, count, dt, 0, root, stream);
}
gsResult pncclBroadcast(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                        gsStream stream) GS_ALIAS(ncclBroadcast);

GS_API gsResult ncclBcast(void *buff, size_t count, gsDataType dt, int root, gsComm comm, gsStream stream) {
	return call("ncclBcast", comm, GS_BROADCAST, buff, buff, count, dt, 0, root, stream);
}
gsResult pncclBcast(void *buff, size_t count, gsDataType dt, int root, gsComm comm, gsStream stream)
	GS_ALIAS(ncclBcast);

GS_API gsResult ncclReduce(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op, int root,
                           gsComm comm, gsStream stream) {
	return call("ncclReduce", comm, GS_REDUCE, send, recv, count, dt, op, root, stream);
}
gsResult pncclReduce(const void *send, void *recv, size_t count, gsDataType dt, gsRedOp op, int root, gsComm comm,
                     gsStream stream) GS_ALIAS(ncclReduce);

GS_API gsResult ncclSend(const void *send, size_t count, gsDataType dt, int peer, gsComm comm, gsStream stream) {
	return call("ncclSend", comm, GS_SEND, send, NULL, count, dt, 0, peer, stream);
}
gsResult pncclSend(const void *send, size_t count, gsDataType dt, int peer, gsComm comm, gsStream stream)
	GS_ALIAS(ncclSend);

GS_API gsResult ncclRecv(void *recv, size_t count, gsDataType dt, int peer, gsComm comm, gsStream stream) {
	return call("ncclRecv", comm, GS_RECV, NULL, recv, count, dt, 0, peer, stream);
}
gsResult pncclRecv(void *recv, size_t count, gsDataType dt, int peer, gsComm comm, gsStream stream)
	GS_ALIAS(ncclRecv);

// NCCL 2.28's collectives: forwarded to the real NCCL.
GS_API gsResult ncclAlltoAll(const void *send, void *recv, size_t count, gsDataType dt, gsComm comm, gsStream stream) {
	return call("ncclAlltoAll", comm, GS_ALLTOALL, send, recv, count, dt, 0, 0, stream);
}
gsResult pncclAlltoAll(const void *send, void *recv, size_t count, gsDataType dt, gsComm comm, gsStream stream)
	GS_ALIAS(ncclAlltoAll);

GS_API gsResult ncclGather(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                           gsStream stream) {
	return call("ncclGather", comm, GS_GATHER, send, recv, count, dt, 0, root, stream);
}
gsResult pncclGather(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                     gsStream stream) GS_ALIAS(ncclGather);

GS_API gsResult ncclScatter(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                            gsStream stream) {
	return call("ncclScatter", comm, GS_SCATTER, send, recv, count, dt, 0, root, stream);
}
gsResult pncclScatter(const void *send, void *recv, size_t count, gsDataType dt, int root, gsComm comm,
                      gsStream stream) GS_ALIAS(ncclScatter);

GS_API gsResult ncclGroupStart(void) { return goepNcclGroup(tid(), 1); }
gsResult pncclGroupStart(void) GS_ALIAS(ncclGroupStart);

GS_API gsResult ncclGroupEnd(void) { return goepNcclGroup(tid(), 0); }
gsResult pncclGroupEnd(void) GS_ALIAS(ncclGroupEnd);

// ---- Memory -------------------------------------------------------------------------

GS_API gsResult ncclMemAlloc(void **ptr, size_t size) {
	uintptr_t p = 0;
	gsResult r;
	if (ptr == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclMemAlloc: ptr is NULL");
	r = goepNcclMemAlloc(&p, size);
	*ptr = (void *)p;
	return r;
}
gsResult pncclMemAlloc(void **ptr, size_t size) GS_ALIAS(ncclMemAlloc);

GS_API gsResult ncclMemFree(void *ptr) { return goepNcclMemFree((uintptr_t)ptr); }
gsResult pncclMemFree(void *ptr) GS_ALIAS(ncclMemFree);

GS_API gsResult ncclCommRegister(gsComm comm, void *buff, size_t size, void **handle) {
	uint64_t h = 0;
	gsResult r;
	COMM_OR_FAIL("ncclCommRegister", comm);
	if (handle == NULL) return goepNcclFail(GS_INVALID_ARGUMENT, "ncclCommRegister: handle is NULL");
	r = goepNcclRegister(id_, (uintptr_t)buff, size, &h);
	*handle = (void *)(uintptr_t)h;
	return r;
}
gsResult pncclCommRegister(gsComm comm, void *buff, size_t size, void **handle) GS_ALIAS(ncclCommRegister);

GS_API gsResult ncclCommDeregister(gsComm comm, void *handle) {
	COMM_OR_FAIL("ncclCommDeregister", comm);
	return goepNcclDeregister(id_, (uint64_t)(uintptr_t)handle);
}
gsResult pncclCommDeregister(gsComm comm, void *handle) GS_ALIAS(ncclCommDeregister);

// ---- Not supported ------------------------------------------------------------------
// Programs may call these; with the shim preloaded they must not reach the
// real NCCL with a goep handle, so each answers ncclInvalidUsage and logs
// its name.

#define UNSUPPORTED(name, params)                                      \
	GS_API gsResult name params { return goepNcclUnsupported(#name); } \
	gsResult p##name params GS_ALIAS(name);

UNSUPPORTED(ncclCommShrink, (gsComm comm, int *exclude, int n, gsComm *newcomm, gsConfigHead *config, int flags))
UNSUPPORTED(ncclCommGrow, (gsComm comm, int nranks, const gsUniqueId *id, int rank, gsComm *newcomm,
                           gsConfigHead *config))
UNSUPPORTED(ncclCommGetUniqueId, (gsComm comm, gsUniqueId *id))
UNSUPPORTED(ncclCommInitRankScalable, (gsComm *newcomm, int nranks, int rank, int nid, gsUniqueId *ids,
                                       gsConfigHead *config))
UNSUPPORTED(ncclCommRevoke, (gsComm comm, int flags))
UNSUPPORTED(ncclCommSuspend, (gsComm comm, int flags))
UNSUPPORTED(ncclCommResume, (gsComm comm))
UNSUPPORTED(ncclCommMemStats, (gsComm comm, int stat, uint64_t *value))
UNSUPPORTED(ncclCommWindowRegister, (gsComm comm, void *buff, size_t size, void **win, int flags))
UNSUPPORTED(ncclCommWindowDeregister, (gsComm comm, void *win))
UNSUPPORTED(ncclWinGetUserPtr, (gsComm comm, void *win, void **out))
UNSUPPORTED(ncclRedOpCreatePreMulSum, (gsRedOp *op, void *scalar, gsDataType dt, int residence, gsComm comm))
UNSUPPORTED(ncclRedOpDestroy, (gsRedOp op, gsComm comm))
UNSUPPORTED(ncclGroupSimulateEnd, (void *simInfo))

// ---- goep's own ---------------------------------------------------------------------

// goepNcclCommCounts copies the communicator's per-path call counts:
// out[kind * 4 + path] for kinds GS_ALLREDUCE..GS_SCATTER and paths plan,
// native, nccl, staged (n entries at most). For tests and tools.
GS_API gsResult goepNcclCommCounts(gsComm comm, int64_t *out, int n) {
	COMM_OR_FAIL("goepNcclCommCounts", comm);
	if (out == NULL || n < 0) return goepNcclFail(GS_INVALID_ARGUMENT, "goepNcclCommCounts: bad output");
	return goepNcclCounts(id_, out, n);
}
