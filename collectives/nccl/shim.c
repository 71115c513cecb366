// Copyright the goep authors. See doc.go for the design.

#include <stdio.h>
#include <string.h>

#include "shim.h"

#define GN_FIELD(name, params) gnResult(*name) params;
typedef struct {
	GN_API(GN_FIELD)
	const char *(*ncclGetErrorString)(gnResult);
	const char *(*ncclGetLastError)(gnComm); // optional (NCCL 2.13+)
	GN_OPT_API(GN_FIELD)                     // optional
} gn_api;
#undef GN_FIELD

static gn_api gn;
static int gn_ready;

// The two driver entry points for binding a context; neither has ever had a
// versioned variant, so plain dlsym names are the only ABI.
typedef int (*gnCtxGet)(void **ctx);
typedef int (*gnCtxSet)(void *ctx);
static gnCtxGet gn_ctx_get;
static gnCtxSet gn_ctx_set;

// The entry points in table order: those of GN_API (required), then the
// optional ones. Go resolves each name (internal/dl) and hands the pointers
// to gn_install.
static const char *const gn_names[] = {
#define GN_NAME(name, params) #name,
	GN_API(GN_NAME)
#undef GN_NAME
	"ncclGetErrorString",
	"ncclGetLastError",
#define GN_NAME(name, params) #name,
	GN_OPT_API(GN_NAME)
#undef GN_NAME
};
#define GN_OPT_COUNT(name, params) +1
#define GN_REQUIRED ((int)(sizeof gn_names / sizeof gn_names[0]) - 1 - (0 GN_OPT_API(GN_OPT_COUNT)))

int gn_symbol_count(void) { return (int)(sizeof gn_names / sizeof gn_names[0]); }
const char *gn_symbol_name(int i) { return (i >= 0 && i < gn_symbol_count()) ? gn_names[i] : NULL; }
int gn_symbol_required(int i) { return i < GN_REQUIRED; }

int gn_install(void *const *fns) {
	gn_api t;
	int i = 0;
	if (__atomic_load_n(&gn_ready, __ATOMIC_ACQUIRE)) return 1; // the first library stays in use
	memset(&t, 0, sizeof t);
#define GN_SET(name, params) *(void **)(&t.name) = fns[i++];
	GN_API(GN_SET)
	*(void **)(&t.ncclGetErrorString) = fns[i++];
	*(void **)(&t.ncclGetLastError) = fns[i++];
	GN_OPT_API(GN_SET)
#undef GN_SET
	gn = t;
	__atomic_store_n(&gn_ready, 1, __ATOMIC_RELEASE);
	return 0;
}

void gn_install_cuda(void *get, void *set) {
	*(void **)(&gn_ctx_get) = get;
	*(void **)(&gn_ctx_set) = set;
}

int gn_loaded(void) { return __atomic_load_n(&gn_ready, __ATOMIC_ACQUIRE); }

// bind makes ctx current on this thread unless it already is.
static int bind(uintptr_t ctx) {
	void *cur = NULL;
	if (ctx == 0) return 0;
	if (gn_ctx_set == NULL) return GN_ERR_BIND;
	if (gn_ctx_get(&cur) == 0 && cur == (void *)ctx) return 0;
	return gn_ctx_set((void *)ctx) == 0 ? 0 : GN_ERR_BIND;
}

const char *gn_error_string(int r) {
	if (!gn_ready) return "NCCL not loaded";
	return gn.ncclGetErrorString(r);
}

const char *gn_last_error(uintptr_t comm) {
	if (!gn_ready || gn.ncclGetLastError == NULL) return NULL;
	return gn.ncclGetLastError((gnComm)comm);
}

int gn_version_of(void *fn, int *v) {
	// ncclGetVersion is the first entry of GN_API.
	return ((gnResult(*)(int *))fn)(v);
}

int gn_version(int *v) {
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	return gn.ncclGetVersion(v);
}

int gn_unique_id(unsigned char *out) {
	gnUniqueId id;
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	memset(&id, 0, sizeof id);
	r = gn.ncclGetUniqueId(&id);
	memcpy(out, id.internal, GN_UNIQUE_ID_BYTES);
	return r;
}

gnRet gn_comm_init_rank(uintptr_t ctx, int nranks, const unsigned char *idb, int rank) {
	gnRet out = {0, 0};
	gnUniqueId id;
	gnComm comm = NULL;
	if (!gn_ready) {
		out.r = GN_ERR_NOT_LOADED;
		return out;
	}
	if ((out.r = bind(ctx)) != 0) return out;
	memcpy(id.internal, idb, GN_UNIQUE_ID_BYTES);
	out.r = gn.ncclCommInitRank(&comm, nranks, id, rank);
	out.v = (uintptr_t)comm;
	return out;
}

int gn_comm_destroy(uintptr_t ctx, uintptr_t comm) {
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	if ((r = bind(ctx)) != 0) return r;
	return gn.ncclCommDestroy((gnComm)comm);
}

int gn_comm_abort(uintptr_t ctx, uintptr_t comm) {
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	if ((r = bind(ctx)) != 0) return r;
	return gn.ncclCommAbort((gnComm)comm);
}

int gn_comm_async_error(uintptr_t comm, int *err) {
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	return gn.ncclCommGetAsyncError((gnComm)comm, err);
}

int gn_all_reduce(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, uintptr_t comm,
                  uintptr_t stream) {
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	if ((r = bind(ctx)) != 0) return r;
	return gn.ncclAllReduce((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, op, (gnComm)comm,
	                        (gnStream)stream);
}

int gn_all_gather(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, uintptr_t comm, uintptr_t stream) {
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	if ((r = bind(ctx)) != 0) return r;
	return gn.ncclAllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, (gnComm)comm,
	                        (gnStream)stream);
}

int gn_reduce_scatter(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, uintptr_t comm,
                      uintptr_t stream) {
	int r;
	if (!gn_ready) return GN_ERR_NOT_LOADED;
	if ((r = bind(ctx)) != 0) return r;
	return gn.ncclReduceScatter((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, op, (gnComm)comm,
	                            (gnStream)stream);
}

#define GN_CALL(fn, args)                                 \
	do {                                                  \
		int r_;                                           \
		if (!gn_ready) return GN_ERR_NOT_LOADED;          \
		if (gn.fn == NULL) return GN_ERR_MISSING;         \
		if ((r_ = bind(ctx)) != 0) return r_;             \
		return gn.fn args;                                \
	} while (0)

int gn_broadcast(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm,
                 uintptr_t stream) {
	GN_CALL(ncclBroadcast, ((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, root, (gnComm)comm,
	                        (gnStream)stream));
}

int gn_reduce(uintptr_t ctx, uint64_t send, uint64_t recv, size_t count, int dt, int op, int root, uintptr_t comm,
              uintptr_t stream) {
	GN_CALL(ncclReduce, ((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, op, root, (gnComm)comm,
	                     (gnStream)stream));
}

int gn_send(uintptr_t ctx, uint64_t send, size_t count, int dt, int peer, uintptr_t comm, uintptr_t stream) {
	GN_CALL(ncclSend, ((const void *)(uintptr_t)send, count, dt, peer, (gnComm)comm, (gnStream)stream));
}

int gn_recv(uintptr_t ctx, uint64_t recv, size_t count, int dt, int peer, uintptr_t comm, uintptr_t stream) {
	GN_CALL(ncclRecv, ((void *)(uintptr_t)recv, count, dt, peer, (gnComm)comm, (gnStream)stream));
}

int gn_group_start(void) {
	uintptr_t ctx = 0;
	GN_CALL(ncclGroupStart, ());
}

int gn_group_end(void) {
	uintptr_t ctx = 0;
	GN_CALL(ncclGroupEnd, ());
}

// The NCCL 2.28 collectives, for forwarders; the caller's context is current.
int gn_all_to_all(uint64_t send, uint64_t recv, size_t count, int dt, uintptr_t comm, uintptr_t stream) {
	uintptr_t ctx = 0;
	GN_CALL(ncclAlltoAll, ((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, (gnComm)comm,
	                       (gnStream)stream));
}

int gn_gather(uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm, uintptr_t stream) {
	uintptr_t ctx = 0;
	GN_CALL(ncclGather, ((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, root, (gnComm)comm,
	                     (gnStream)stream));
}

int gn_scatter(uint64_t send, uint64_t recv, size_t count, int dt, int root, uintptr_t comm, uintptr_t stream) {
	uintptr_t ctx = 0;
	GN_CALL(ncclScatter, ((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, dt, root, (gnComm)comm,
	                      (gnStream)stream));
}
