// Copyright the goep authors. See doc.go for the design.

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

#define GN_FIELD(name, params) gnResult(*name) params;
typedef struct {
	GN_API(GN_FIELD)
	const char *(*ncclGetErrorString)(gnResult);
	const char *(*ncclGetLastError)(gnComm); // optional (NCCL 2.13+)
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

static void set_err(char *err, int errlen, const char *msg) {
	if (err == NULL || errlen <= 0) return;
	snprintf(err, (size_t)errlen, "%s", msg ? msg : "");
}

int gn_load(const char *path, char *err, int errlen) {
	gn_api t;
	void *lib;
	dlerror();
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		set_err(err, errlen, dlerror());
		return 1;
	}
	memset(&t, 0, sizeof t);
#define GN_RESOLVE(name, params)                           \
	*(void **)(&t.name) = dlsym(lib, #name);               \
	if (t.name == NULL) {                                  \
		set_err(err, errlen, #name);                       \
		dlclose(lib);                                      \
		return 2;                                          \
	}
	GN_API(GN_RESOLVE)
	GN_RESOLVE(ncclGetErrorString, ())
#undef GN_RESOLVE
	*(void **)(&t.ncclGetLastError) = dlsym(lib, "ncclGetLastError");
	if (gn_ready) { // the first library loaded stays in use
		dlclose(lib);
		return 0;
	}
	gn = t;
	gn_ready = 1;
	return 0;
}

int gn_load_cuda(const char *path, char *err, int errlen) {
	void *lib;
	if (gn_ctx_set != NULL) return 0;
	dlerror();
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		set_err(err, errlen, dlerror());
		return 1;
	}
	*(void **)(&gn_ctx_get) = dlsym(lib, "cuCtxGetCurrent");
	*(void **)(&gn_ctx_set) = dlsym(lib, "cuCtxSetCurrent");
	if (gn_ctx_get == NULL || gn_ctx_set == NULL) {
		gn_ctx_get = NULL;
		gn_ctx_set = NULL;
		set_err(err, errlen, "cuCtxGetCurrent/cuCtxSetCurrent not found");
		dlclose(lib);
		return 1;
	}
	return 0;
}

int gn_loaded(void) { return gn_ready; }

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
