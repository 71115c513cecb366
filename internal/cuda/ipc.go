package cuda

/*
#include "shim.h"
*/
import "C"

import "unsafe"

const ipcMemLazyEnablePeerAccess = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

// IpcGetMemHandle returns a handle for the allocation containing p (from
// MemAlloc) that another process can open with IpcOpenMemHandle. The handle
// refers to the whole allocation, so p should be its start.
func IpcGetMemHandle(ctx *Context, p DevicePtr) ([IpcHandleSize]byte, error) {
	var h [IpcHandleSize]byte
	err := check("cuIpcGetMemHandle",
		C.gc_ipc_get_mem_handle(ctx.h, C.uint64_t(p), (*C.uchar)(unsafe.Pointer(&h[0]))))
	return h, err
}

// IpcOpenMemHandle maps memory exported by another process into ctx, with
// peer access enabled lazily when the memory is on another device
// (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). A process cannot open its own
// handles. Close the mapping with IpcCloseMemHandle.
func IpcOpenMemHandle(ctx *Context, handle [IpcHandleSize]byte) (DevicePtr, error) {
	r := C.gc_ipc_open_mem_handle(ctx.h, (*C.uchar)(unsafe.Pointer(&handle[0])), ipcMemLazyEnablePeerAccess)
	if r.r != 0 {
		return 0, newError("cuIpcOpenMemHandle", r.r)
	}
	return DevicePtr(r.v), nil
}

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func IpcCloseMemHandle(ctx *Context, p DevicePtr) error {
	return check("cuIpcCloseMemHandle", C.gc_ipc_close_mem_handle(ctx.h, C.uint64_t(p)))
}
