package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int

// Device attributes. The comment names the driver enumerator.
const (
	AttrMaxThreadsPerBlock                     DeviceAttribute = 1   // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
	AttrMaxBlockDimX                           DeviceAttribute = 2   // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X
	AttrMaxBlockDimY                           DeviceAttribute = 3   // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y
	AttrMaxBlockDimZ                           DeviceAttribute = 4   // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z
	AttrMaxGridDimX                            DeviceAttribute = 5   // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X
	AttrMaxGridDimY                            DeviceAttribute = 6   // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y
	AttrMaxGridDimZ                            DeviceAttribute = 7   // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z
	AttrMaxSharedMemoryPerBlock                DeviceAttribute = 8   // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK
	AttrTotalConstantMemory                    DeviceAttribute = 9   // CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY
	AttrWarpSize                               DeviceAttribute = 10  // CU_DEVICE_ATTRIBUTE_WARP_SIZE
	AttrMaxRegistersPerBlock                   DeviceAttribute = 12  // CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK
	AttrClockRate                              DeviceAttribute = 13  // CU_DEVICE_ATTRIBUTE_CLOCK_RATE
	AttrMultiprocessorCount                    DeviceAttribute = 16  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	AttrIntegrated                             DeviceAttribute = 18  // CU_DEVICE_ATTRIBUTE_INTEGRATED
	AttrCanMapHostMemory                       DeviceAttribute = 19  // CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
	AttrComputeMode                            DeviceAttribute = 20  // CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
	AttrConcurrentKernels                      DeviceAttribute = 31  // CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
	AttrECCEnabled                             DeviceAttribute = 32  // CU_DEVICE_ATTRIBUTE_ECC_ENABLED
	AttrPCIBusID                               DeviceAttribute = 33  // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
	AttrPCIDeviceID                            DeviceAttribute = 34  // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
	AttrMemoryClockRate                        DeviceAttribute = 36  // CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE
	AttrGlobalMemoryBusWidth                   DeviceAttribute = 37  // CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH
	AttrL2CacheSize                            DeviceAttribute = 38  // CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
	AttrMaxThreadsPerMultiprocessor            DeviceAttribute = 39  // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
	AttrAsyncEngineCount                       DeviceAttribute = 40  // CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT
	AttrUnifiedAddressing                      DeviceAttribute = 41  // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
	AttrPCIDomainID                            DeviceAttribute = 50  // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID
	AttrComputeCapabilityMajor                 DeviceAttribute = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	AttrComputeCapabilityMinor                 DeviceAttribute = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	AttrStreamPrioritiesSupported              DeviceAttribute = 78  // CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
	AttrMaxSharedMemoryPerMultiprocessor       DeviceAttribute = 81  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
	AttrMaxRegistersPerMultiprocessor          DeviceAttribute = 82  // CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR
	AttrManagedMemory                          DeviceAttribute = 83  // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
	AttrMultiGPUBoard                          DeviceAttribute = 84  // CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD
	AttrCooperativeLaunch                      DeviceAttribute = 95  // CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH
	AttrMaxSharedMemoryPerBlockOptin           DeviceAttribute = 97  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	AttrCanFlushRemoteWrites                   DeviceAttribute = 98  // CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES
	AttrVirtualMemoryManagementSupported       DeviceAttribute = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	AttrHandleTypePosixFileDescriptorSupported DeviceAttribute = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
	AttrMaxBlocksPerMultiprocessor             DeviceAttribute = 106 // CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR
	AttrMaxPersistingL2CacheSize               DeviceAttribute = 108 // CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
	AttrGPUDirectRDMAWithCUDAVMMSupported      DeviceAttribute = 110 // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
	AttrReservedSharedMemoryPerBlock           DeviceAttribute = 111 // CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
	AttrMemoryPoolsSupported                   DeviceAttribute = 115 // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
	AttrGPUDirectRDMASupported                 DeviceAttribute = 116 // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
	AttrClusterLaunch                          DeviceAttribute = 120 // CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH
	AttrCanUse64BitStreamMemOps                DeviceAttribute = 122 // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
	AttrCanUseStreamWaitValueNor               DeviceAttribute = 123 // CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR
	AttrIpcEventSupported                      DeviceAttribute = 125 // CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
)

// Device is a CUDA device (a CUdevice plus its ordinal).
type Device struct {
	ordinal int
	h       C.int // CUdevice
}

// DeviceCount returns the number of CUDA devices visible to this process.
func DeviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	r := C.gc_device_count()
	if r.r != 0 {
		return 0, newError("cuDeviceGetCount", r.r)
	}
	return int(int64(r.v)), nil
}

// GetDevice returns the device with the given ordinal.
func GetDevice(ordinal int) (Device, error) {
	if err := Load(); err != nil {
		return Device{}, err
	}
	r := C.gc_device_get(C.int(ordinal))
	if r.r != 0 {
		return Device{}, newError("cuDeviceGet", r.r)
	}
	return Device{ordinal: ordinal, h: C.int(int64(r.v))}, nil
}

// Ordinal returns the device's ordinal (0-based, as in CUDA_VISIBLE_DEVICES order).
func (d Device) Ordinal() int { return d.ordinal }

// Handle returns the CUdevice value.
func (d Device) Handle() int { return int(d.h) }

func (d Device) String() string { return fmt.Sprintf("cuda:%d", d.ordinal) }

// Name returns the device's product name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	var buf [256]C.char
	if err := check("cuDeviceGetName", C.gc_device_name(d.h, &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// UUID returns the device's 16-byte UUID.
func (d Device) UUID() ([16]byte, error) {
	var u [16]byte
	err := check("cuDeviceGetUuid", C.gc_device_uuid(d.h, (*C.uchar)(unsafe.Pointer(&u[0]))))
	return u, err
}

// TotalMem returns the device's memory size in bytes.
func (d Device) TotalMem() (int, error) {
	r := C.gc_device_total_mem(d.h)
	if r.r != 0 {
		return 0, newError("cuDeviceTotalMem", r.r)
	}
	return int(r.v), nil
}

// Attribute returns a device attribute.
func (d Device) Attribute(attr DeviceAttribute) (int, error) {
	r := C.gc_device_attribute(d.h, C.int(attr))
	if r.r != 0 {
		return 0, newError("cuDeviceGetAttribute", r.r)
	}
	return int(int64(r.v)), nil
}

// MultiprocessorCount returns the number of SMs.
func (d Device) MultiprocessorCount() (int, error) { return d.Attribute(AttrMultiprocessorCount) }

// ComputeCapability returns (major, minor), e.g. (9, 0) for Hopper.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// MaxSharedMemoryPerBlockOptin returns the most dynamic shared memory a
// block can use once the kernel opts in (SetAttribute(FuncAttrMaxDynamicSharedSizeBytes)).
func (d Device) MaxSharedMemoryPerBlockOptin() (int, error) {
	return d.Attribute(AttrMaxSharedMemoryPerBlockOptin)
}

// L2CacheSize returns the L2 cache size in bytes.
func (d Device) L2CacheSize() (int, error) { return d.Attribute(AttrL2CacheSize) }

// ClockRate returns the peak SM clock in kHz.
func (d Device) ClockRate() (int, error) { return d.Attribute(AttrClockRate) }

// PCIBusID returns the device's PCI address, "domain:bus:device.function".
func (d Device) PCIBusID() (string, error) {
	var buf [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.gc_device_pci_bus_id(d.h, &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// CanAccessPeer reports whether d can map memory of peer (peer access).
func (d Device) CanAccessPeer(peer Device) (bool, error) {
	r := C.gc_device_can_access_peer(d.h, peer.h)
	if r.r != 0 {
		return false, newError("cuDeviceCanAccessPeer", r.r)
	}
	return r.v != 0, nil
}

// CtxLmemResizeToMax is CU_CTX_LMEM_RESIZE_TO_MAX: the driver keeps the
// context's local memory at the largest size a launch needed instead of
// shrinking it afterwards.
const CtxLmemResizeToMax = 0x10

// PrimaryContextFlags returns the flags of the device's primary context
// (cuDevicePrimaryCtxGetState).
func (d Device) PrimaryContextFlags() (uint32, error) {
	r := C.gc_primary_ctx_flags(d.h)
	if r.r != 0 {
		return 0, newError("cuDevicePrimaryCtxGetState", r.r)
	}
	return uint32(r.v), nil
}

// SetPrimaryContextFlags sets the flags of the device's primary context
// (cuDevicePrimaryCtxSetFlags), replacing the previous ones.
func (d Device) SetPrimaryContextFlags(flags uint32) error {
	return check("cuDevicePrimaryCtxSetFlags", C.gc_primary_ctx_set_flags(d.h, C.uint(flags)))
}

// Retain retains the device's primary context. Each Retain must be matched
// by one Context.Release.
func (d Device) Retain() (*Context, error) {
	r := C.gc_primary_ctx_retain(d.h)
	if r.r != 0 {
		return nil, newError("cuDevicePrimaryCtxRetain", r.r)
	}
	return &Context{h: C.uintptr_t(r.v), dev: d}, nil
}

// MemPool is a CUmemoryPool (stream-ordered allocator pool).
type MemPool struct {
	h C.uintptr_t
}

// MemPoolAttribute is a CUmemPool_attribute.
type MemPoolAttribute int

// Memory pool attributes with 64-bit values.
const (
	MemPoolAttrReleaseThreshold   MemPoolAttribute = 4 // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
	MemPoolAttrReservedMemCurrent MemPoolAttribute = 5 // CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
	MemPoolAttrReservedMemHigh    MemPoolAttribute = 6 // CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
	MemPoolAttrUsedMemCurrent     MemPoolAttribute = 7 // CU_MEMPOOL_ATTR_USED_MEM_CURRENT
	MemPoolAttrUsedMemHigh        MemPoolAttribute = 8 // CU_MEMPOOL_ATTR_USED_MEM_HIGH
)

// DefaultMemPool returns the device's default memory pool, the one
// MemAllocAsync draws from.
func (d Device) DefaultMemPool() (MemPool, error) {
	r := C.gc_device_default_mem_pool(d.h)
	if r.r != 0 {
		return MemPool{}, newError("cuDeviceGetDefaultMemPool", r.r)
	}
	return MemPool{h: C.uintptr_t(r.v)}, nil
}

// Handle returns the CUmemoryPool.
func (p MemPool) Handle() uintptr { return uintptr(p.h) }

// SetAttribute sets one of the 64-bit pool attributes (the ones listed above).
func (p MemPool) SetAttribute(attr MemPoolAttribute, v uint64) error {
	return check("cuMemPoolSetAttribute", C.gc_mem_pool_set_u64(p.h, C.int(attr), C.uint64_t(v)))
}

// Attribute reads one of the 64-bit pool attributes.
func (p MemPool) Attribute(attr MemPoolAttribute) (uint64, error) {
	r := C.gc_mem_pool_get_u64(p.h, C.int(attr))
	if r.r != 0 {
		return 0, newError("cuMemPoolGetAttribute", r.r)
	}
	return uint64(r.v), nil
}

// SetReleaseThreshold sets how many bytes the pool keeps reserved across
// synchronizations instead of returning them to the OS. Use math.MaxUint64
// to keep everything (typical for steady-state allocation patterns).
func (p MemPool) SetReleaseThreshold(bytes uint64) error {
	return p.SetAttribute(MemPoolAttrReleaseThreshold, bytes)
}
