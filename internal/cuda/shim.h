// Copyright the goep authors. Declarations written for goep; see doc.go.
//
// shim.h declares the small slice of the CUDA driver ABI that goep uses, in
// our own names (prefix gc), plus the C helpers that Go calls. We do not
// include the vendor header: every type below is written from the documented
// ABI of the CUDA 12.0 driver API on LP64 Linux. testdata/abicheck.c compiles
// this file against a real cuda.h (with GC_ABI_CHECK defined) to check that
// every declaration matches.

#ifndef GOEP_CUDA_SHIM_H
#define GOEP_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

// API version handed to cuGetProcAddress_v2: every entry point resolves to the
// ABI that the CUDA 12.0 headers bind its plain name to.
#define GC_API_VERSION 12000

// Kernel launches take at most this many parameters.
#define GC_MAX_PARAMS 64
// cuMemSetAccess takes at most this many devices.
#define GC_MAX_ACCESS_DEVICES 64

// Result codes the shim itself produces (same numbers as the driver's).
#define GC_SUCCESS 0
#define GC_ERROR_INVALID_VALUE 1
#define GC_ERROR_NOT_INITIALIZED 3

// ---- Scalar types (identical in both modes) --------------------------------
typedef int gcDevice;                   // CUdevice
typedef unsigned long long gcDptr;      // CUdeviceptr (64-bit on LP64)
typedef unsigned long long gcMemHandle; // CUmemGenericAllocationHandle

// ---- Structs with a fixed layout (ours, always defined) --------------------
struct gc_uuid {
	char bytes[16];
};

// CUipcMemHandle and CUipcEventHandle: 64 opaque bytes, passed BY VALUE.
struct gc_ipc_handle {
	char reserved[64];
};

// CUmemLocation: {type, id}, two 4-byte ints.
struct gc_mem_location {
	int type; // CUmemLocationType
	int id;   // device ordinal when type is DEVICE
};

// CUmemAllocationProp (32 bytes on LP64).
struct gc_alloc_prop {
	int type;                        // CUmemAllocationType, offset 0
	int requestedHandleTypes;        // CUmemAllocationHandleType, offset 4
	struct gc_mem_location location; // offset 8
	void *win32HandleMetaData;       // offset 16
	struct {
		unsigned char compressionType;      // offset 24
		unsigned char gpuDirectRDMACapable; // offset 25
		unsigned short usage;               // offset 26
		unsigned char reserved[4];          // offset 28
	} allocFlags;
};

// CUmemcpyAttributes (CUDA 12.8+, 24 bytes): a batch copy's attributes.
struct gc_memcpy_attr {
	int srcAccessOrder;                 // CUmemcpySrcAccessOrder, offset 0
	struct gc_mem_location srcLocHint;  // offset 4
	struct gc_mem_location dstLocHint;  // offset 12
	unsigned int flags;                 // CUmemcpyFlags, offset 20
};

// CUmemAccessDesc (12 bytes).
struct gc_access_desc {
	struct gc_mem_location location; // offset 0
	int flags;                       // CUmemAccess_flags, offset 8
};

// ---- Types whose names differ between our build and the ABI check ---------
#ifdef GC_ABI_CHECK
// abicheck.c has included the vendor header: use its types so that the
// compiler can compare each function-pointer type with the vendor prototype.
typedef CUresult gcResult;
typedef CUcontext gcCtx;
typedef CUstream gcStream;
typedef CUevent gcEvent;
typedef CUmodule gcModule;
typedef CUfunction gcFunction;
typedef CUgraph gcGraph;
typedef CUgraphNode gcGraphNode;
typedef CUgraphExec gcGraphExec;
typedef CUmemoryPool gcMemPool;
typedef CUuuid gcUuid;
typedef CUipcMemHandle gcIpcMemHandle;
typedef CUipcEventHandle gcIpcEventHandle;
typedef CUmemAllocationProp gcAllocProp;
typedef CUmemAccessDesc gcAccessDesc;
typedef CUdevice_attribute gcDevAttr;
typedef CUpointer_attribute gcPtrAttr;
typedef CUfunction_attribute gcFuncAttr;
typedef CUstreamCaptureMode gcCaptureMode;
typedef CUstreamCaptureStatus gcCaptureStatus;
typedef CUmemPool_attribute gcPoolAttr;
typedef CUmemAllocationGranularity_flags gcGranFlags;
typedef CUmemAllocationHandleType gcHandleType;
typedef CUjit_option gcJitOption;
typedef CUdriverProcAddressQueryResult gcProcStatus;
#else
typedef int gcResult; // CUresult
typedef struct gc_ctx_opaque *gcCtx;
typedef struct gc_stream_opaque *gcStream;
typedef struct gc_event_opaque *gcEvent;
typedef struct gc_module_opaque *gcModule;
typedef struct gc_function_opaque *gcFunction;
typedef struct gc_graph_opaque *gcGraph;
typedef struct gc_graph_node_opaque *gcGraphNode;
typedef struct gc_graph_exec_opaque *gcGraphExec;
typedef struct gc_mem_pool_opaque *gcMemPool;
typedef struct gc_uuid gcUuid;
typedef struct gc_ipc_handle gcIpcMemHandle;
typedef struct gc_ipc_handle gcIpcEventHandle;
typedef struct gc_alloc_prop gcAllocProp;
typedef struct gc_access_desc gcAccessDesc;
// Enumerations are int-sized in the driver ABI.
typedef int gcDevAttr;
typedef int gcPtrAttr;
typedef int gcFuncAttr;
typedef int gcCaptureMode;
typedef int gcCaptureStatus;
typedef int gcPoolAttr;
typedef int gcGranFlags;
typedef int gcHandleType;
typedef int gcJitOption;
typedef int gcProcStatus;
#endif

// cuGetProcAddress_v2, the one symbol taken with dlsym (CUDA 12.0+ drivers).
typedef gcResult (*gcGetProcAddressFn)(const char *symbol, void **pfn,
                                       int cudaVersion, uint64_t flags,
                                       gcProcStatus *symbolStatus);

// ---- The entry points we use ------------------------------------------------
// GC_API(X) lists X(name, impl, params): `name` is the plain name passed to
// cuGetProcAddress_v2, `impl` is the exported symbol that the CUDA 12.0
// headers bind that name to (the ABI we declare), `params` its parameters.
// All of them return CUresult. Note that the plain name cuGraphInstantiate
// resolves (at 11000 and later) to cuGraphInstantiate_v2, the five-argument
// form with an error-node/log buffer, although the 12.0 header maps the
// source-level name to cuGraphInstantiateWithFlags; so we ask for
// cuGraphInstantiateWithFlags by its own name.
#define GC_API(X)                                                                        \
	X(cuGetErrorName, cuGetErrorName, (gcResult error, const char **pStr))                  \
	X(cuGetErrorString, cuGetErrorString, (gcResult error, const char **pStr))              \
	X(cuInit, cuInit, (unsigned int flags))                                                 \
	X(cuDriverGetVersion, cuDriverGetVersion, (int *driverVersion))                         \
	X(cuDeviceGetCount, cuDeviceGetCount, (int *count))                                     \
	X(cuDeviceGet, cuDeviceGet, (gcDevice *device, int ordinal))                           \
	X(cuDeviceGetName, cuDeviceGetName, (char *name, int len, gcDevice dev))                \
	X(cuDeviceGetUuid, cuDeviceGetUuid_v2, (gcUuid *uuid, gcDevice dev))                    \
	X(cuDeviceTotalMem, cuDeviceTotalMem_v2, (size_t *bytes, gcDevice dev))                 \
	X(cuDeviceGetAttribute, cuDeviceGetAttribute, (int *pi, gcDevAttr attrib, gcDevice dev)) \
	X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, (char *pciBusId, int len, gcDevice dev))    \
	X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer,                                         \
	  (int *canAccessPeer, gcDevice dev, gcDevice peerDev))                                 \
	X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, (gcMemPool *pool, gcDevice dev)) \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, (gcCtx *pctx, gcDevice dev))      \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, (gcDevice dev))              \
	X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState,                               \
	  (gcDevice dev, unsigned int *flags, int *active))                                     \
	X(cuDevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2, (gcDevice dev, unsigned int flags)) \
	X(cuCtxGetCurrent, cuCtxGetCurrent, (gcCtx *pctx))                                      \
	X(cuCtxSetCurrent, cuCtxSetCurrent, (gcCtx ctx))                                        \
	X(cuCtxSynchronize, cuCtxSynchronize, (void))                                           \
	X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, (gcCtx peerContext, unsigned int Flags)) \
	X(cuCtxDisablePeerAccess, cuCtxDisablePeerAccess, (gcCtx peerContext))                  \
	X(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange,                             \
	  (int *leastPriority, int *greatestPriority))                                          \
	X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *free, size_t *total))                         \
	X(cuStreamCreateWithPriority, cuStreamCreateWithPriority,                               \
	  (gcStream *phStream, unsigned int flags, int priority))                               \
	X(cuStreamDestroy, cuStreamDestroy_v2, (gcStream hStream))                              \
	X(cuStreamSynchronize, cuStreamSynchronize, (gcStream hStream))                         \
	X(cuStreamQuery, cuStreamQuery, (gcStream hStream))                                     \
	X(cuStreamWaitEvent, cuStreamWaitEvent,                                                 \
	  (gcStream hStream, gcEvent hEvent, unsigned int Flags))                               \
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2, (gcStream hStream, gcCaptureMode mode)) \
	X(cuStreamEndCapture, cuStreamEndCapture, (gcStream hStream, gcGraph *phGraph))         \
	X(cuStreamIsCapturing, cuStreamIsCapturing,                                             \
	  (gcStream hStream, gcCaptureStatus *captureStatus))                                   \
	X(cuStreamWriteValue32, cuStreamWriteValue32_v2,                                        \
	  (gcStream stream, gcDptr addr, uint32_t value, unsigned int flags))                   \
	X(cuStreamWriteValue64, cuStreamWriteValue64_v2,                                        \
	  (gcStream stream, gcDptr addr, uint64_t value, unsigned int flags))                   \
	X(cuStreamWaitValue32, cuStreamWaitValue32_v2,                                          \
	  (gcStream stream, gcDptr addr, uint32_t value, unsigned int flags))                   \
	X(cuStreamWaitValue64, cuStreamWaitValue64_v2,                                          \
	  (gcStream stream, gcDptr addr, uint64_t value, unsigned int flags))                   \
	X(cuEventCreate, cuEventCreate, (gcEvent *phEvent, unsigned int Flags))                 \
	X(cuEventRecord, cuEventRecord, (gcEvent hEvent, gcStream hStream))                     \
	X(cuEventSynchronize, cuEventSynchronize, (gcEvent hEvent))                             \
	X(cuEventQuery, cuEventQuery, (gcEvent hEvent))                                         \
	X(cuEventElapsedTime, cuEventElapsedTime,                                               \
	  (float *pMilliseconds, gcEvent hStart, gcEvent hEnd))                                 \
	X(cuEventDestroy, cuEventDestroy_v2, (gcEvent hEvent))                                  \
	X(cuIpcGetEventHandle, cuIpcGetEventHandle, (gcIpcEventHandle *pHandle, gcEvent event)) \
	X(cuIpcOpenEventHandle, cuIpcOpenEventHandle,                                           \
	  (gcEvent *phEvent, gcIpcEventHandle handle))                                          \
	X(cuIpcGetMemHandle, cuIpcGetMemHandle, (gcIpcMemHandle *pHandle, gcDptr dptr))         \
	X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2,                                            \
	  (gcDptr *pdptr, gcIpcMemHandle handle, unsigned int Flags))                           \
	X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, (gcDptr dptr))                              \
	X(cuMemAlloc, cuMemAlloc_v2, (gcDptr *dptr, size_t bytesize))                           \
	X(cuMemFree, cuMemFree_v2, (gcDptr dptr))                                               \
	X(cuMemAllocAsync, cuMemAllocAsync, (gcDptr *dptr, size_t bytesize, gcStream hStream))  \
	X(cuMemFreeAsync, cuMemFreeAsync, (gcDptr dptr, gcStream hStream))                      \
	X(cuMemPoolSetAttribute, cuMemPoolSetAttribute,                                         \
	  (gcMemPool pool, gcPoolAttr attr, void *value))                                       \
	X(cuMemPoolGetAttribute, cuMemPoolGetAttribute,                                         \
	  (gcMemPool pool, gcPoolAttr attr, void *value))                                       \
	X(cuMemsetD8, cuMemsetD8_v2, (gcDptr dstDevice, unsigned char uc, size_t N))            \
	X(cuMemsetD32, cuMemsetD32_v2, (gcDptr dstDevice, unsigned int ui, size_t N))           \
	X(cuMemsetD8Async, cuMemsetD8Async,                                                     \
	  (gcDptr dstDevice, unsigned char uc, size_t N, gcStream hStream))                     \
	X(cuMemsetD32Async, cuMemsetD32Async,                                                   \
	  (gcDptr dstDevice, unsigned int ui, size_t N, gcStream hStream))                      \
	X(cuMemcpyHtoD, cuMemcpyHtoD_v2, (gcDptr dstDevice, const void *srcHost, size_t ByteCount)) \
	X(cuMemcpyDtoH, cuMemcpyDtoH_v2, (void *dstHost, gcDptr srcDevice, size_t ByteCount))   \
	X(cuMemcpyDtoD, cuMemcpyDtoD_v2, (gcDptr dstDevice, gcDptr srcDevice, size_t ByteCount)) \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2,                                              \
	  (gcDptr dstDevice, const void *srcHost, size_t ByteCount, gcStream hStream))          \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2,                                              \
	  (void *dstHost, gcDptr srcDevice, size_t ByteCount, gcStream hStream))                \
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2,                                              \
	  (gcDptr dstDevice, gcDptr srcDevice, size_t ByteCount, gcStream hStream))             \
	X(cuMemcpyPeer, cuMemcpyPeer,                                                           \
	  (gcDptr dstDevice, gcCtx dstContext, gcDptr srcDevice, gcCtx srcContext,              \
	   size_t ByteCount))                                                                   \
	X(cuMemcpyPeerAsync, cuMemcpyPeerAsync,                                                 \
	  (gcDptr dstDevice, gcCtx dstContext, gcDptr srcDevice, gcCtx srcContext,              \
	   size_t ByteCount, gcStream hStream))                                                 \
	X(cuMemHostAlloc, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags))     \
	X(cuMemFreeHost, cuMemFreeHost, (void *p))                                              \
	X(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2,                              \
	  (gcDptr *pdptr, void *p, unsigned int Flags))                                         \
	X(cuMemHostRegister, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags)) \
	X(cuMemHostUnregister, cuMemHostUnregister, (void *p))                                  \
	X(cuPointerGetAttribute, cuPointerGetAttribute,                                         \
	  (void *data, gcPtrAttr attribute, gcDptr ptr))                                        \
	X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity,                         \
	  (size_t *granularity, const gcAllocProp *prop, gcGranFlags option))                   \
	X(cuMemCreate, cuMemCreate,                                                             \
	  (gcMemHandle *handle, size_t size, const gcAllocProp *prop, unsigned long long flags)) \
	X(cuMemRelease, cuMemRelease, (gcMemHandle handle))                                     \
	X(cuMemAddressReserve, cuMemAddressReserve,                                             \
	  (gcDptr *ptr, size_t size, size_t alignment, gcDptr addr, unsigned long long flags))  \
	X(cuMemAddressFree, cuMemAddressFree, (gcDptr ptr, size_t size))                        \
	X(cuMemMap, cuMemMap,                                                                   \
	  (gcDptr ptr, size_t size, size_t offset, gcMemHandle handle, unsigned long long flags)) \
	X(cuMemUnmap, cuMemUnmap, (gcDptr ptr, size_t size))                                    \
	X(cuMemSetAccess, cuMemSetAccess,                                                       \
	  (gcDptr ptr, size_t size, const gcAccessDesc *desc, size_t count))                    \
	X(cuMemExportToShareableHandle, cuMemExportToShareableHandle,                           \
	  (void *shareableHandle, gcMemHandle handle, gcHandleType handleType,                  \
	   unsigned long long flags))                                                           \
	X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle,                       \
	  (gcMemHandle *handle, void *osHandle, gcHandleType shHandleType))                     \
	X(cuModuleLoadDataEx, cuModuleLoadDataEx,                                               \
	  (gcModule *module, const void *image, unsigned int numOptions, gcJitOption *options,  \
	   void **optionValues))                                                                \
	X(cuModuleGetFunction, cuModuleGetFunction,                                             \
	  (gcFunction *hfunc, gcModule hmod, const char *name))                                 \
	X(cuModuleUnload, cuModuleUnload, (gcModule hmod))                                      \
	X(cuFuncGetAttribute, cuFuncGetAttribute, (int *pi, gcFuncAttr attrib, gcFunction hfunc)) \
	X(cuFuncSetAttribute, cuFuncSetAttribute, (gcFunction hfunc, gcFuncAttr attrib, int value)) \
	X(cuOccupancyMaxActiveBlocksPerMultiprocessor,                                          \
	  cuOccupancyMaxActiveBlocksPerMultiprocessor,                                          \
	  (int *numBlocks, gcFunction func, int blockSize, size_t dynamicSMemSize))             \
	X(cuLaunchKernel, cuLaunchKernel,                                                       \
	  (gcFunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,   \
	   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,              \
	   unsigned int sharedMemBytes, gcStream hStream, void **kernelParams, void **extra))   \
	X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel,                                 \
	  (gcFunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,   \
	   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,              \
	   unsigned int sharedMemBytes, gcStream hStream, void **kernelParams))                 \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags,                             \
	  (gcGraphExec *phGraphExec, gcGraph hGraph, unsigned long long flags))                 \
	X(cuGraphLaunch, cuGraphLaunch, (gcGraphExec hGraphExec, gcStream hStream))             \
	X(cuGraphGetNodes, cuGraphGetNodes, (gcGraph hGraph, gcGraphNode *nodes, size_t *numNodes)) \
	X(cuGraphDestroy, cuGraphDestroy, (gcGraph hGraph))                                     \
	X(cuGraphExecDestroy, cuGraphExecDestroy, (gcGraphExec hGraphExec))

// ---- Optional entry points ---------------------------------------------------
// Resolved at a later API version than GC_API_VERSION; a driver without them
// leaves them NULL and the helpers answer CUDA_ERROR_NOT_SUPPORTED.
//
// cuMemcpyBatchAsync at 12080 (CUDA 12.8's first form, with failIdx): a
// batch of copies that executes in stream order as a whole, the copies in
// it in no particular order.
#define GC_MEMCPY_BATCH_VERSION 12080
typedef gcResult (*gcMemcpyBatchAsyncFn)(gcDptr *dsts, gcDptr *srcs, size_t *sizes, size_t count,
                                         struct gc_memcpy_attr *attrs, size_t *attrsIdxs, size_t numAttrs,
                                         size_t *failIdx, gcStream hStream);

// The resolved table.
#define GC_FIELD(name, impl, params) gcResult (*name) params;
typedef struct gc_api {
	GC_API(GC_FIELD)
} gc_api;
#undef GC_FIELD

#ifndef GC_ABI_CHECK

// ---- Helpers called from Go -------------------------------------------------
// Handles cross the cgo boundary as uintptr_t (Go keeps them as uintptr), so
// no Go pointer checks or escapes are involved. Outputs come back in small
// structs returned by value: an out-parameter pointing at a Go variable would
// make that variable escape to the heap (one allocation per call).

typedef struct {
	int r;      // CUresult
	uint64_t v; // the output (signed ints are sign-extended)
} gcRet;

typedef struct {
	int r;
	uint64_t a, b;
} gcRet2;

typedef struct {
	int r;
	float v;
} gcRetF32;

typedef struct {
	int r;
	void *p;
} gcRetPtr;

// Loader. Returns a stage code (0 ok); see load.go for their meaning.
int gc_load(void *gpa_fn, char *err, int errlen, int *detail);
int gc_is_loaded(void);
const char *gc_error_name(int code);
const char *gc_error_string(int code);
int gc_nop(void);
int gc_bind(uintptr_t ctx); // only the context binding (benchmarks)

// Driver and devices (no context needed).
int gc_init(unsigned int flags);
gcRet gc_driver_version(void);
gcRet gc_device_count(void);
gcRet gc_device_get(int ordinal);
int gc_device_name(int dev, char *buf, int len);
int gc_device_uuid(int dev, unsigned char *out16);
gcRet gc_device_total_mem(int dev);
gcRet gc_device_attribute(int dev, int attr);
int gc_device_pci_bus_id(int dev, char *buf, int len);
gcRet gc_device_can_access_peer(int dev, int peer);
gcRet gc_device_default_mem_pool(int dev);
gcRet gc_primary_ctx_retain(int dev);
int gc_primary_ctx_release(int dev);
gcRet gc_primary_ctx_flags(int dev);
int gc_primary_ctx_set_flags(int dev, unsigned int flags);
int gc_mem_pool_set_u64(uintptr_t pool, int attr, uint64_t value);
gcRet gc_mem_pool_get_u64(uintptr_t pool, int attr);
gcRet gc_pointer_attribute(int attr, uint64_t ptr);
gcRet gc_vmm_granularity(int dev, int recommended);

// Context-bound helpers: each makes ctx current on the calling thread (only
// if it is not already) and then makes the call, in one cgo crossing.
int gc_ctx_synchronize(uintptr_t ctx);
int gc_ctx_enable_peer_access(uintptr_t ctx, uintptr_t peer);
int gc_ctx_disable_peer_access(uintptr_t ctx, uintptr_t peer);
gcRet2 gc_ctx_stream_priority_range(uintptr_t ctx);
gcRet2 gc_ctx_mem_get_info(uintptr_t ctx);

gcRet gc_stream_create(uintptr_t ctx, unsigned int flags, int priority);
int gc_stream_destroy(uintptr_t ctx, uintptr_t s);
int gc_stream_synchronize(uintptr_t ctx, uintptr_t s);
int gc_stream_query(uintptr_t ctx, uintptr_t s);
int gc_stream_wait_event(uintptr_t ctx, uintptr_t s, uintptr_t e, unsigned int flags);
int gc_stream_begin_capture(uintptr_t ctx, uintptr_t s, int mode);
gcRet gc_stream_end_capture(uintptr_t ctx, uintptr_t s);
gcRet gc_stream_is_capturing(uintptr_t ctx, uintptr_t s);
int gc_stream_write_value32(uintptr_t ctx, uintptr_t s, uint64_t addr, uint32_t v, unsigned int flags);
int gc_stream_write_value64(uintptr_t ctx, uintptr_t s, uint64_t addr, uint64_t v, unsigned int flags);
int gc_stream_wait_value32(uintptr_t ctx, uintptr_t s, uint64_t addr, uint32_t v, unsigned int flags);
int gc_stream_wait_value64(uintptr_t ctx, uintptr_t s, uint64_t addr, uint64_t v, unsigned int flags);

gcRet gc_event_create(uintptr_t ctx, unsigned int flags);
int gc_event_record(uintptr_t ctx, uintptr_t e, uintptr_t s);
int gc_event_synchronize(uintptr_t ctx, uintptr_t e);
int gc_event_query(uintptr_t ctx, uintptr_t e);
gcRetF32 gc_event_elapsed_time(uintptr_t ctx, uintptr_t start, uintptr_t end);
int gc_event_destroy(uintptr_t ctx, uintptr_t e);
int gc_ipc_get_event_handle(uintptr_t ctx, uintptr_t e, unsigned char *out64);
gcRet gc_ipc_open_event_handle(uintptr_t ctx, const unsigned char *in64);

gcRet gc_mem_alloc(uintptr_t ctx, size_t size);
int gc_mem_free(uintptr_t ctx, uint64_t p);
gcRet gc_mem_alloc_async(uintptr_t ctx, size_t size, uintptr_t s);
int gc_mem_free_async(uintptr_t ctx, uint64_t p, uintptr_t s);
int gc_memset_d8(uintptr_t ctx, uint64_t dst, unsigned char v, size_t n);
int gc_memset_d32(uintptr_t ctx, uint64_t dst, unsigned int v, size_t n);
int gc_memset_d8_async(uintptr_t ctx, uint64_t dst, unsigned char v, size_t n, uintptr_t s);
int gc_memset_d32_async(uintptr_t ctx, uint64_t dst, unsigned int v, size_t n, uintptr_t s);
int gc_memcpy_htod(uintptr_t ctx, uint64_t dst, const void *src, size_t n);
int gc_memcpy_dtoh(uintptr_t ctx, void *dst, uint64_t src, size_t n);
int gc_memcpy_dtod(uintptr_t ctx, uint64_t dst, uint64_t src, size_t n);
int gc_memcpy_htod_async(uintptr_t ctx, uint64_t dst, const void *src, size_t n, uintptr_t s);
int gc_memcpy_dtoh_async(uintptr_t ctx, void *dst, uint64_t src, size_t n, uintptr_t s);
int gc_memcpy_dtod_async(uintptr_t ctx, uint64_t dst, uint64_t src, size_t n, uintptr_t s);
int gc_memcpy_peer(uintptr_t ctx, uint64_t dst, uintptr_t dstCtx, uint64_t src, uintptr_t srcCtx, size_t n);
int gc_has_memcpy_batch(void);
// gc_memcpy_batch_async queues count copies as one batch (sources in stream
// order; flags: CUmemcpyFlags for all of them). *fail is the index of a
// copy the driver refused, where it says.
int gc_memcpy_batch_async(uintptr_t ctx, uint64_t *dsts, uint64_t *srcs, size_t *sizes, size_t count,
                          unsigned int flags, uintptr_t s, size_t *fail);
int gc_memcpy_peer_async(uintptr_t ctx, uint64_t dst, uintptr_t dstCtx, uint64_t src, uintptr_t srcCtx,
                         size_t n, uintptr_t s);
gcRetPtr gc_mem_host_alloc(uintptr_t ctx, size_t size, unsigned int flags);
int gc_mem_free_host(uintptr_t ctx, void *p);
gcRet gc_mem_host_get_device_pointer(uintptr_t ctx, void *p);
int gc_mem_host_register(uintptr_t ctx, void *p, size_t size, unsigned int flags);
int gc_mem_host_unregister(uintptr_t ctx, void *p);

int gc_ipc_get_mem_handle(uintptr_t ctx, uint64_t p, unsigned char *out64);
gcRet gc_ipc_open_mem_handle(uintptr_t ctx, const unsigned char *in64, unsigned int flags);
int gc_ipc_close_mem_handle(uintptr_t ctx, uint64_t p);

gcRet gc_vmm_create(uintptr_t ctx, int dev, size_t size);
gcRet gc_vmm_address_reserve(uintptr_t ctx, size_t size, size_t alignment);
int gc_vmm_map(uintptr_t ctx, uint64_t p, size_t size, uint64_t handle);
int gc_vmm_set_access(uintptr_t ctx, uint64_t p, size_t size, const int *devs, int ndevs);
gcRet gc_vmm_export_fd(uintptr_t ctx, uint64_t handle);
gcRet gc_vmm_import_fd(uintptr_t ctx, int fd);
int gc_vmm_unmap(uintptr_t ctx, uint64_t p, size_t size);
int gc_vmm_release(uintptr_t ctx, uint64_t handle);
int gc_vmm_address_free(uintptr_t ctx, uint64_t p, size_t size);

gcRet gc_module_load(uintptr_t ctx, const void *image, char *log, unsigned int logSize);
gcRet gc_module_get_function(uintptr_t ctx, uintptr_t mod, const char *name);
int gc_module_unload(uintptr_t ctx, uintptr_t mod);
gcRet gc_func_get_attribute(uintptr_t ctx, uintptr_t f, int attr);
int gc_func_set_attribute(uintptr_t ctx, uintptr_t f, int attr, int value);
gcRet gc_occupancy_max_active_blocks(uintptr_t ctx, uintptr_t f, int blockSize, size_t dynSmem);
int gc_launch(uintptr_t ctx, uintptr_t f, unsigned int gx, unsigned int gy, unsigned int gz,
              unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, uintptr_t s,
              const unsigned char *buf, const uint32_t *offsets, int n, int cooperative);

gcRet gc_graph_instantiate(uintptr_t ctx, uintptr_t g);
int gc_graph_launch(uintptr_t ctx, uintptr_t ge, uintptr_t s);
gcRet gc_graph_num_nodes(uintptr_t ctx, uintptr_t g);
int gc_graph_destroy(uintptr_t ctx, uintptr_t g);
int gc_graph_exec_destroy(uintptr_t ctx, uintptr_t ge);

#endif // GC_ABI_CHECK

#endif // GOEP_CUDA_SHIM_H
