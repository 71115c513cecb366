// Copyright the goep authors. See doc.go for the design.

#include <stdio.h>
#include <string.h>

#include "shim.h"

// Driver enumerators used only on the C side (values checked by
// testdata/abicheck.c against the vendor header).
#define GC_MEM_ALLOCATION_TYPE_PINNED 1         // CU_MEM_ALLOCATION_TYPE_PINNED
#define GC_MEM_HANDLE_TYPE_POSIX_FD 1           // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
#define GC_MEM_LOCATION_TYPE_DEVICE 1           // CU_MEM_LOCATION_TYPE_DEVICE
#define GC_MEM_ACCESS_FLAGS_PROT_READWRITE 3    // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
#define GC_MEM_ALLOC_GRANULARITY_MINIMUM 0      // CU_MEM_ALLOC_GRANULARITY_MINIMUM
#define GC_MEM_ALLOC_GRANULARITY_RECOMMENDED 1  // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
#define GC_JIT_ERROR_LOG_BUFFER 5               // CU_JIT_ERROR_LOG_BUFFER
#define GC_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6    // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
#define GC_GET_PROC_ADDRESS_DEFAULT 0           // CU_GET_PROC_ADDRESS_DEFAULT
#define GC_GET_PROC_ADDRESS_SUCCESS 0           // CU_GET_PROC_ADDRESS_SUCCESS

static gc_api gc;         // resolved entry points; all NULL until gc_load succeeds
static gcMemcpyBatchAsyncFn gc_memcpy_batch; // optional: NULL where the driver lacks it
static int gc_ready;      // set once the table is complete

// ---- Loader -----------------------------------------------------------------

static void set_err(char *err, int errlen, const char *msg) {
	if (err == NULL || errlen <= 0) return;
	if (msg == NULL) msg = "";
	snprintf(err, (size_t)errlen, "%s", msg);
}

// gc_load resolves every entry point of GC_API through cuGetProcAddress_v2
// (gpa_fn, which the Go side took from the driver library it opened with
// internal/dl) at GC_API_VERSION. Nothing is kept unless every step
// succeeds. Stage codes:
//   0 ok;
//   3 cuGetProcAddress_v2 failed (err: symbol, detail: CUresult);
//   4 symbol missing or version too old (err: symbol, detail: symbol status);
//   5 everything resolved, but a library was loaded before: the first one
//     stays in use and the caller closes this one again.
int gc_load(void *gpa_fn, char *err, int errlen, int *detail) {
	gcGetProcAddressFn gpa;
	gc_api table;
	*detail = 0;
	*(void **)(&gpa) = gpa_fn;
	memset(&table, 0, sizeof table);
#define GC_RESOLVE(name, impl, params)                                                  \
	{                                                                                   \
		void *fn = NULL;                                                                \
		gcProcStatus st = (gcProcStatus)GC_GET_PROC_ADDRESS_SUCCESS;                    \
		gcResult r = gpa(#name, &fn, GC_API_VERSION, GC_GET_PROC_ADDRESS_DEFAULT, &st); \
		if (r != GC_SUCCESS || fn == NULL || (int)st != GC_GET_PROC_ADDRESS_SUCCESS) {  \
			int stage = ((int)st != GC_GET_PROC_ADDRESS_SUCCESS) ? 4 : 3;              \
			set_err(err, errlen, #name);                                                \
			*detail = (stage == 4) ? (int)st : (int)r;                                  \
			return stage;                                                               \
		}                                                                               \
		*(void **)(&table.name) = fn;                                                   \
	}
	GC_API(GC_RESOLVE)
#undef GC_RESOLVE
	if (gc_ready) return 5;
	{
		void *fn = NULL;
		gcProcStatus st = (gcProcStatus)GC_GET_PROC_ADDRESS_SUCCESS;
		gcResult r = gpa("cuMemcpyBatchAsync", &fn, GC_MEMCPY_BATCH_VERSION, GC_GET_PROC_ADDRESS_DEFAULT, &st);
		if (r == GC_SUCCESS && (int)st == GC_GET_PROC_ADDRESS_SUCCESS) {
			*(void **)(&gc_memcpy_batch) = fn;
		}
	}
	gc = table;
	__atomic_store_n(&gc_ready, 1, __ATOMIC_RELEASE);
	return 0;
}

int gc_is_loaded(void) { return __atomic_load_n(&gc_ready, __ATOMIC_ACQUIRE); }

const char *gc_error_name(int code) {
	const char *s = NULL;
	if (!gc_ready) return NULL;
	if (gc.cuGetErrorName((gcResult)code, &s) != GC_SUCCESS) return NULL;
	return s;
}

const char *gc_error_string(int code) {
	const char *s = NULL;
	if (!gc_ready) return NULL;
	if (gc.cuGetErrorString((gcResult)code, &s) != GC_SUCCESS) return NULL;
	return s;
}

int gc_nop(void) { return gc_ready; }

// ---- Context binding --------------------------------------------------------

// bind makes ctx current on this OS thread unless it already is. The check is
// a thread-local read inside the driver; the switch happens only when a
// goroutine lands on a thread last used for another context.
static inline gcResult bind(uintptr_t ctx) {
	gcCtx cur = NULL;
	gcResult r;
	if (!gc_ready) return GC_ERROR_NOT_INITIALIZED;
	r = gc.cuCtxGetCurrent(&cur);
	if (r != GC_SUCCESS) return r;
	if (cur == (gcCtx)ctx) return GC_SUCCESS;
	return gc.cuCtxSetCurrent((gcCtx)ctx);
}

int gc_bind(uintptr_t ctx) { return bind(ctx); }

#define NEED_LOADED(fail) \
	if (!gc_ready) return fail
#define BOUND(ctx, call)                 \
	do {                                 \
		gcResult br_ = bind(ctx);        \
		if (br_ != GC_SUCCESS) return br_; \
		return (call);                   \
	} while (0)

static const gcRet ret_not_loaded = {GC_ERROR_NOT_INITIALIZED, 0};

// ---- Driver and devices -------------------------------------------------------

int gc_init(unsigned int flags) {
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuInit(flags);
}

gcRet gc_driver_version(void) {
	gcRet o = {0, 0};
	int v = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDriverGetVersion(&v);
	o.v = (uint64_t)(int64_t)v;
	return o;
}

gcRet gc_device_count(void) {
	gcRet o = {0, 0};
	int n = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceGetCount(&n);
	o.v = (uint64_t)(int64_t)n;
	return o;
}

gcRet gc_device_get(int ordinal) {
	gcRet o = {0, 0};
	gcDevice d = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceGet(&d, ordinal);
	o.v = (uint64_t)(int64_t)d;
	return o;
}

int gc_device_name(int dev, char *buf, int len) {
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuDeviceGetName(buf, len, dev);
}

int gc_device_uuid(int dev, unsigned char *out16) {
	gcUuid u;
	gcResult r;
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	memset(&u, 0, sizeof u);
	r = gc.cuDeviceGetUuid(&u, dev);
	memcpy(out16, u.bytes, sizeof u.bytes);
	return r;
}

gcRet gc_device_total_mem(int dev) {
	gcRet o = {0, 0};
	size_t b = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceTotalMem(&b, dev);
	o.v = (uint64_t)b;
	return o;
}

gcRet gc_device_attribute(int dev, int attr) {
	gcRet o = {0, 0};
	int v = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceGetAttribute(&v, (gcDevAttr)attr, dev);
	o.v = (uint64_t)(int64_t)v;
	return o;
}

int gc_device_pci_bus_id(int dev, char *buf, int len) {
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuDeviceGetPCIBusId(buf, len, dev);
}

gcRet gc_device_can_access_peer(int dev, int peer) {
	gcRet o = {0, 0};
	int v = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceCanAccessPeer(&v, dev, peer);
	o.v = (uint64_t)(int64_t)v;
	return o;
}

gcRet gc_device_default_mem_pool(int dev) {
	gcRet o = {0, 0};
	gcMemPool p = NULL;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDeviceGetDefaultMemPool(&p, dev);
	o.v = (uint64_t)(uintptr_t)p;
	return o;
}

gcRet gc_primary_ctx_retain(int dev) {
	gcRet o = {0, 0};
	gcCtx c = NULL;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDevicePrimaryCtxRetain(&c, dev);
	o.v = (uint64_t)(uintptr_t)c;
	return o;
}

int gc_primary_ctx_release(int dev) {
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuDevicePrimaryCtxRelease(dev);
}

gcRet gc_primary_ctx_flags(int dev) {
	gcRet o = {0, 0};
	unsigned int flags = 0;
	int active = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuDevicePrimaryCtxGetState(dev, &flags, &active);
	o.v = (uint64_t)flags;
	return o;
}

int gc_primary_ctx_set_flags(int dev, unsigned int flags) {
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuDevicePrimaryCtxSetFlags(dev, flags);
}

int gc_mem_pool_set_u64(uintptr_t pool, int attr, uint64_t value) {
	uint64_t v = value;
	NEED_LOADED(GC_ERROR_NOT_INITIALIZED);
	return gc.cuMemPoolSetAttribute((gcMemPool)pool, (gcPoolAttr)attr, &v);
}

gcRet gc_mem_pool_get_u64(uintptr_t pool, int attr) {
	gcRet o = {0, 0};
	uint64_t v = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuMemPoolGetAttribute((gcMemPool)pool, (gcPoolAttr)attr, &v);
	o.v = v;
	return o;
}

// The attribute is written into a zeroed 8-byte buffer; every attribute we
// read is at most 8 bytes wide and the target is little-endian.
gcRet gc_pointer_attribute(int attr, uint64_t ptr) {
	gcRet o = {0, 0};
	uint64_t v = 0;
	NEED_LOADED(ret_not_loaded);
	o.r = gc.cuPointerGetAttribute(&v, (gcPtrAttr)attr, (gcDptr)ptr);
	o.v = v;
	return o;
}

static void device_alloc_prop(gcAllocProp *prop, int dev) {
	memset(prop, 0, sizeof *prop);
	prop->type = GC_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = GC_MEM_HANDLE_TYPE_POSIX_FD;
	prop->location.type = GC_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
}

gcRet gc_vmm_granularity(int dev, int recommended) {
	gcRet o = {0, 0};
	gcAllocProp prop;
	size_t g = 0;
	NEED_LOADED(ret_not_loaded);
	device_alloc_prop(&prop, dev);
	o.r = gc.cuMemGetAllocationGranularity(
	    &g, &prop,
	    recommended ? GC_MEM_ALLOC_GRANULARITY_RECOMMENDED : GC_MEM_ALLOC_GRANULARITY_MINIMUM);
	o.v = (uint64_t)g;
	return o;
}

// ---- Contexts -------------------------------------------------------------------

int gc_ctx_synchronize(uintptr_t ctx) { BOUND(ctx, gc.cuCtxSynchronize()); }

int gc_ctx_enable_peer_access(uintptr_t ctx, uintptr_t peer) {
	BOUND(ctx, gc.cuCtxEnablePeerAccess((gcCtx)peer, 0));
}

int gc_ctx_disable_peer_access(uintptr_t ctx, uintptr_t peer) {
	BOUND(ctx, gc.cuCtxDisablePeerAccess((gcCtx)peer));
}

gcRet2 gc_ctx_stream_priority_range(uintptr_t ctx) {
	gcRet2 o = {0, 0, 0};
	int least = 0, greatest = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuCtxGetStreamPriorityRange(&least, &greatest);
	o.a = (uint64_t)(int64_t)least;
	o.b = (uint64_t)(int64_t)greatest;
	return o;
}

gcRet2 gc_ctx_mem_get_info(uintptr_t ctx) {
	gcRet2 o = {0, 0, 0};
	size_t f = 0, t = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemGetInfo(&f, &t);
	o.a = (uint64_t)f;
	o.b = (uint64_t)t;
	return o;
}

// ---- Streams --------------------------------------------------------------------

gcRet gc_stream_create(uintptr_t ctx, unsigned int flags, int priority) {
	gcRet o = {0, 0};
	gcStream s = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuStreamCreateWithPriority(&s, flags, priority);
	o.v = (uint64_t)(uintptr_t)s;
	return o;
}

int gc_stream_destroy(uintptr_t ctx, uintptr_t s) { BOUND(ctx, gc.cuStreamDestroy((gcStream)s)); }
int gc_stream_synchronize(uintptr_t ctx, uintptr_t s) { BOUND(ctx, gc.cuStreamSynchronize((gcStream)s)); }
int gc_stream_query(uintptr_t ctx, uintptr_t s) { BOUND(ctx, gc.cuStreamQuery((gcStream)s)); }

int gc_stream_wait_event(uintptr_t ctx, uintptr_t s, uintptr_t e, unsigned int flags) {
	BOUND(ctx, gc.cuStreamWaitEvent((gcStream)s, (gcEvent)e, flags));
}

int gc_stream_begin_capture(uintptr_t ctx, uintptr_t s, int mode) {
	BOUND(ctx, gc.cuStreamBeginCapture((gcStream)s, (gcCaptureMode)mode));
}

gcRet gc_stream_end_capture(uintptr_t ctx, uintptr_t s) {
	gcRet o = {0, 0};
	gcGraph g = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuStreamEndCapture((gcStream)s, &g);
	o.v = (uint64_t)(uintptr_t)g;
	return o;
}

gcRet gc_stream_is_capturing(uintptr_t ctx, uintptr_t s) {
	gcRet o = {0, 0};
	gcCaptureStatus st = (gcCaptureStatus)0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuStreamIsCapturing((gcStream)s, &st);
	o.v = (uint64_t)st;
	return o;
}

int gc_stream_write_value32(uintptr_t ctx, uintptr_t s, uint64_t addr, uint32_t v, unsigned int flags) {
	BOUND(ctx, gc.cuStreamWriteValue32((gcStream)s, (gcDptr)addr, v, flags));
}
int gc_stream_write_value64(uintptr_t ctx, uintptr_t s, uint64_t addr, uint64_t v, unsigned int flags) {
	BOUND(ctx, gc.cuStreamWriteValue64((gcStream)s, (gcDptr)addr, v, flags));
}
int gc_stream_wait_value32(uintptr_t ctx, uintptr_t s, uint64_t addr, uint32_t v, unsigned int flags) {
	BOUND(ctx, gc.cuStreamWaitValue32((gcStream)s, (gcDptr)addr, v, flags));
}
int gc_stream_wait_value64(uintptr_t ctx, uintptr_t s, uint64_t addr, uint64_t v, unsigned int flags) {
	BOUND(ctx, gc.cuStreamWaitValue64((gcStream)s, (gcDptr)addr, v, flags));
}

// ---- Events ---------------------------------------------------------------------

gcRet gc_event_create(uintptr_t ctx, unsigned int flags) {
	gcRet o = {0, 0};
	gcEvent e = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuEventCreate(&e, flags);
	o.v = (uint64_t)(uintptr_t)e;
	return o;
}

int gc_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s) {
	BOUND(ctx, gc.cuEventRecord((gcEvent)e, (gcStream)s));
}
int gc_event_synchronize(uintptr_t ctx, uintptr_t e) { BOUND(ctx, gc.cuEventSynchronize((gcEvent)e)); }
int gc_event_query(uintptr_t ctx, uintptr_t e) { BOUND(ctx, gc.cuEventQuery((gcEvent)e)); }

gcRetF32 gc_event_elapsed_time(uintptr_t ctx, uintptr_t start, uintptr_t end) {
	gcRetF32 o = {0, 0.0f};
	float ms = 0.0f;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuEventElapsedTime(&ms, (gcEvent)start, (gcEvent)end);
	o.v = ms;
	return o;
}

int gc_event_destroy(uintptr_t ctx, uintptr_t e) { BOUND(ctx, gc.cuEventDestroy((gcEvent)e)); }

int gc_ipc_get_event_handle(uintptr_t ctx, uintptr_t e, unsigned char *out64) {
	gcIpcEventHandle h;
	gcResult r = bind(ctx);
	if (r != GC_SUCCESS) return r;
	memset(&h, 0, sizeof h);
	r = gc.cuIpcGetEventHandle(&h, (gcEvent)e);
	memcpy(out64, h.reserved, sizeof h.reserved);
	return r;
}

gcRet gc_ipc_open_event_handle(uintptr_t ctx, const unsigned char *in64) {
	gcRet o = {0, 0};
	gcIpcEventHandle h;
	gcEvent e = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	memcpy(h.reserved, in64, sizeof h.reserved);
	o.r = gc.cuIpcOpenEventHandle(&e, h); // the 64-byte handle goes by value
	o.v = (uint64_t)(uintptr_t)e;
	return o;
}

// ---- Memory ---------------------------------------------------------------------

gcRet gc_mem_alloc(uintptr_t ctx, size_t size) {
	gcRet o = {0, 0};
	gcDptr p = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemAlloc(&p, size);
	o.v = (uint64_t)p;
	return o;
}

int gc_mem_free(uintptr_t ctx, uint64_t p) { BOUND(ctx, gc.cuMemFree((gcDptr)p)); }

gcRet gc_mem_alloc_async(uintptr_t ctx, size_t size, uintptr_t s) {
	gcRet o = {0, 0};
	gcDptr p = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemAllocAsync(&p, size, (gcStream)s);
	o.v = (uint64_t)p;
	return o;
}

int gc_mem_free_async(uintptr_t ctx, uint64_t p, uintptr_t s) {
	BOUND(ctx, gc.cuMemFreeAsync((gcDptr)p, (gcStream)s));
}

int gc_memset_d8(uintptr_t ctx, uint64_t dst, unsigned char v, size_t n) {
	BOUND(ctx, gc.cuMemsetD8((gcDptr)dst, v, n));
}
int gc_memset_d32(uintptr_t ctx, uint64_t dst, unsigned int v, size_t n) {
	BOUND(ctx, gc.cuMemsetD32((gcDptr)dst, v, n));
}
int gc_memset_d8_async(uintptr_t ctx, uint64_t dst, unsigned char v, size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemsetD8Async((gcDptr)dst, v, n, (gcStream)s));
}
int gc_memset_d32_async(uintptr_t ctx, uint64_t dst, unsigned int v, size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemsetD32Async((gcDptr)dst, v, n, (gcStream)s));
}

int gc_memcpy_htod(uintptr_t ctx, uint64_t dst, const void *src, size_t n) {
	BOUND(ctx, gc.cuMemcpyHtoD((gcDptr)dst, src, n));
}
int gc_memcpy_dtoh(uintptr_t ctx, void *dst, uint64_t src, size_t n) {
	BOUND(ctx, gc.cuMemcpyDtoH(dst, (gcDptr)src, n));
}
int gc_memcpy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, size_t n) {
	BOUND(ctx, gc.cuMemcpyDtoD((gcDptr)dst, (gcDptr)src, n));
}
int gc_memcpy_htod_async(uintptr_t ctx, uint64_t dst, const void *src, size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemcpyHtoDAsync((gcDptr)dst, src, n, (gcStream)s));
}
int gc_memcpy_dtoh_async(uintptr_t ctx, void *dst, uint64_t src, size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemcpyDtoHAsync(dst, (gcDptr)src, n, (gcStream)s));
}
int gc_memcpy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemcpyDtoDAsync((gcDptr)dst, (gcDptr)src, n, (gcStream)s));
}
int gc_memcpy_peer(uintptr_t ctx, uint64_t dst, uintptr_t dstCtx, uint64_t src, uintptr_t srcCtx, size_t n) {
	BOUND(ctx, gc.cuMemcpyPeer((gcDptr)dst, (gcCtx)dstCtx, (gcDptr)src, (gcCtx)srcCtx, n));
}
int gc_has_memcpy_batch(void) { return gc_ready && gc_memcpy_batch != NULL; }

#define GC_MEMCPY_SRC_ACCESS_ORDER_STREAM 1 // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
#define GC_ERROR_NOT_SUPPORTED 801          // CUDA_ERROR_NOT_SUPPORTED

int gc_memcpy_batch_async(uintptr_t ctx, uint64_t *dsts, uint64_t *srcs, size_t *sizes, size_t count,
                          unsigned int flags, uintptr_t s, size_t *fail) {
	struct gc_memcpy_attr attr;
	size_t first = 0;
	*fail = (size_t)-1;
	if (!gc_ready) return GC_ERROR_NOT_INITIALIZED;
	if (gc_memcpy_batch == NULL) return GC_ERROR_NOT_SUPPORTED;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = GC_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	attr.flags = flags;
	BOUND(ctx, gc_memcpy_batch((gcDptr *)dsts, (gcDptr *)srcs, sizes, count, &attr, &first, 1, fail, (gcStream)s));
}

int gc_memcpy_peer_async(uintptr_t ctx, uint64_t dst, uintptr_t dstCtx, uint64_t src, uintptr_t srcCtx,
                         size_t n, uintptr_t s) {
	BOUND(ctx, gc.cuMemcpyPeerAsync((gcDptr)dst, (gcCtx)dstCtx, (gcDptr)src, (gcCtx)srcCtx, n, (gcStream)s));
}

gcRetPtr gc_mem_host_alloc(uintptr_t ctx, size_t size, unsigned int flags) {
	gcRetPtr o = {0, NULL};
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemHostAlloc(&o.p, size, flags);
	return o;
}

int gc_mem_free_host(uintptr_t ctx, void *p) { BOUND(ctx, gc.cuMemFreeHost(p)); }

int gc_mem_host_register(uintptr_t ctx, void *p, size_t size, unsigned int flags) {
	BOUND(ctx, gc.cuMemHostRegister(p, size, flags));
}

int gc_mem_host_unregister(uintptr_t ctx, void *p) { BOUND(ctx, gc.cuMemHostUnregister(p)); }

gcRet gc_mem_host_get_device_pointer(uintptr_t ctx, void *p) {
	gcRet o = {0, 0};
	gcDptr d = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemHostGetDevicePointer(&d, p, 0);
	o.v = (uint64_t)d;
	return o;
}

// ---- Legacy IPC (handles go by value) -------------------------------------------

int gc_ipc_get_mem_handle(uintptr_t ctx, uint64_t p, unsigned char *out64) {
	gcIpcMemHandle h;
	gcResult r = bind(ctx);
	if (r != GC_SUCCESS) return r;
	memset(&h, 0, sizeof h);
	r = gc.cuIpcGetMemHandle(&h, (gcDptr)p);
	memcpy(out64, h.reserved, sizeof h.reserved);
	return r;
}

gcRet gc_ipc_open_mem_handle(uintptr_t ctx, const unsigned char *in64, unsigned int flags) {
	gcRet o = {0, 0};
	gcIpcMemHandle h;
	gcDptr p = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	memcpy(h.reserved, in64, sizeof h.reserved);
	o.r = gc.cuIpcOpenMemHandle(&p, h, flags);
	o.v = (uint64_t)p;
	return o;
}

int gc_ipc_close_mem_handle(uintptr_t ctx, uint64_t p) { BOUND(ctx, gc.cuIpcCloseMemHandle((gcDptr)p)); }

// ---- Virtual memory management --------------------------------------------------

gcRet gc_vmm_create(uintptr_t ctx, int dev, size_t size) {
	gcRet o = {0, 0};
	gcAllocProp prop;
	gcMemHandle h = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	device_alloc_prop(&prop, dev);
	o.r = gc.cuMemCreate(&h, size, &prop, 0);
	o.v = (uint64_t)h;
	return o;
}

gcRet gc_vmm_address_reserve(uintptr_t ctx, size_t size, size_t alignment) {
	gcRet o = {0, 0};
	gcDptr p = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuMemAddressReserve(&p, size, alignment, 0, 0);
	o.v = (uint64_t)p;
	return o;
}

int gc_vmm_map(uintptr_t ctx, uint64_t p, size_t size, uint64_t handle) {
	BOUND(ctx, gc.cuMemMap((gcDptr)p, size, 0, (gcMemHandle)handle, 0));
}

int gc_vmm_set_access(uintptr_t ctx, uint64_t p, size_t size, const int *devs, int ndevs) {
	gcAccessDesc desc[GC_MAX_ACCESS_DEVICES];
	int i;
	gcResult r = bind(ctx);
	if (r != GC_SUCCESS) return r;
	if (ndevs <= 0 || ndevs > GC_MAX_ACCESS_DEVICES) return GC_ERROR_INVALID_VALUE;
	memset(desc, 0, sizeof desc);
	for (i = 0; i < ndevs; i++) {
		desc[i].location.type = GC_MEM_LOCATION_TYPE_DEVICE;
		desc[i].location.id = devs[i];
		desc[i].flags = GC_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	return gc.cuMemSetAccess((gcDptr)p, size, desc, (size_t)ndevs);
}

gcRet gc_vmm_export_fd(uintptr_t ctx, uint64_t handle) {
	gcRet o = {0, 0};
	int fd = -1;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	// For POSIX file descriptors the shareable handle is an int written
	// through the void* argument.
	o.r = gc.cuMemExportToShareableHandle(&fd, (gcMemHandle)handle, GC_MEM_HANDLE_TYPE_POSIX_FD, 0);
	o.v = (uint64_t)(int64_t)fd;
	return o;
}

gcRet gc_vmm_import_fd(uintptr_t ctx, int fd) {
	gcRet o = {0, 0};
	gcMemHandle h = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	// For POSIX file descriptors the fd itself is passed in the pointer.
	o.r = gc.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, GC_MEM_HANDLE_TYPE_POSIX_FD);
	o.v = (uint64_t)h;
	return o;
}

int gc_vmm_unmap(uintptr_t ctx, uint64_t p, size_t size) { BOUND(ctx, gc.cuMemUnmap((gcDptr)p, size)); }
int gc_vmm_release(uintptr_t ctx, uint64_t handle) { BOUND(ctx, gc.cuMemRelease((gcMemHandle)handle)); }
int gc_vmm_address_free(uintptr_t ctx, uint64_t p, size_t size) {
	BOUND(ctx, gc.cuMemAddressFree((gcDptr)p, size));
}

// ---- Modules and functions ------------------------------------------------------

gcRet gc_module_load(uintptr_t ctx, const void *image, char *log, unsigned int logSize) {
	gcRet o = {0, 0};
	gcModule m = NULL;
	gcJitOption opts[2];
	void *vals[2];
	unsigned int nopts = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	if (log != NULL && logSize > 0) {
		log[0] = 0;
		opts[0] = (gcJitOption)GC_JIT_ERROR_LOG_BUFFER;
		vals[0] = log;
		opts[1] = (gcJitOption)GC_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
		vals[1] = (void *)(uintptr_t)logSize; // option values of integer type go in the pointer
		nopts = 2;
	}
	o.r = gc.cuModuleLoadDataEx(&m, image, nopts, nopts ? opts : NULL, nopts ? vals : NULL);
	o.v = (uint64_t)(uintptr_t)m;
	return o;
}

gcRet gc_module_get_function(uintptr_t ctx, uintptr_t mod, const char *name) {
	gcRet o = {0, 0};
	gcFunction f = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuModuleGetFunction(&f, (gcModule)mod, name);
	o.v = (uint64_t)(uintptr_t)f;
	return o;
}

int gc_module_unload(uintptr_t ctx, uintptr_t mod) { BOUND(ctx, gc.cuModuleUnload((gcModule)mod)); }

gcRet gc_func_get_attribute(uintptr_t ctx, uintptr_t f, int attr) {
	gcRet o = {0, 0};
	int v = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuFuncGetAttribute(&v, (gcFuncAttr)attr, (gcFunction)f);
	o.v = (uint64_t)(int64_t)v;
	return o;
}

int gc_func_set_attribute(uintptr_t ctx, uintptr_t f, int attr, int value) {
	BOUND(ctx, gc.cuFuncSetAttribute((gcFunction)f, (gcFuncAttr)attr, value));
}

gcRet gc_occupancy_max_active_blocks(uintptr_t ctx, uintptr_t f, int blockSize, size_t dynSmem) {
	gcRet o = {0, 0};
	int n = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, (gcFunction)f, blockSize, dynSmem);
	o.v = (uint64_t)(int64_t)n;
	return o;
}

// gc_launch builds the kernelParams array on the C stack: entry i points at
// buf + offsets[i]. buf and offsets are plain bytes owned by Go for the
// duration of the call; the driver copies the values before returning.
int gc_launch(uintptr_t ctx, uintptr_t f, unsigned int gx, unsigned int gy, unsigned int gz,
              unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, uintptr_t s,
              const unsigned char *buf, const uint32_t *offsets, int n, int cooperative) {
	void *params[GC_MAX_PARAMS];
	void **pp = NULL;
	int i;
	gcResult r = bind(ctx);
	if (r != GC_SUCCESS) return r;
	if (n < 0 || n > GC_MAX_PARAMS) return GC_ERROR_INVALID_VALUE;
	for (i = 0; i < n; i++) params[i] = (void *)(buf + offsets[i]);
	if (n > 0) pp = params;
	if (cooperative)
		return gc.cuLaunchCooperativeKernel((gcFunction)f, gx, gy, gz, bx, by, bz, smem, (gcStream)s, pp);
	return gc.cuLaunchKernel((gcFunction)f, gx, gy, gz, bx, by, bz, smem, (gcStream)s, pp, NULL);
}

// ---- Graphs ---------------------------------------------------------------------

gcRet gc_graph_instantiate(uintptr_t ctx, uintptr_t g) {
	gcRet o = {0, 0};
	gcGraphExec ge = NULL;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuGraphInstantiateWithFlags(&ge, (gcGraph)g, 0);
	o.v = (uint64_t)(uintptr_t)ge;
	return o;
}

int gc_graph_launch(uintptr_t ctx, uintptr_t ge, uintptr_t s) {
	BOUND(ctx, gc.cuGraphLaunch((gcGraphExec)ge, (gcStream)s));
}

gcRet gc_graph_num_nodes(uintptr_t ctx, uintptr_t g) {
	gcRet o = {0, 0};
	size_t n = 0;
	o.r = bind(ctx);
	if (o.r != GC_SUCCESS) return o;
	o.r = gc.cuGraphGetNodes((gcGraph)g, NULL, &n);
	o.v = (uint64_t)n;
	return o;
}

int gc_graph_destroy(uintptr_t ctx, uintptr_t g) { BOUND(ctx, gc.cuGraphDestroy((gcGraph)g)); }
int gc_graph_exec_destroy(uintptr_t ctx, uintptr_t ge) {
	BOUND(ctx, gc.cuGraphExecDestroy((gcGraphExec)ge));
}
