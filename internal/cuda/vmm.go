package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// VMMGranularity returns the allocation granularity for pinned device
// memory on dev that is shareable as a POSIX file descriptor: sizes and
// mappings of VMM buffers are multiples of it (2 MiB on current GPUs).
// recommended selects the performance-recommended value instead of the
// minimum.
func VMMGranularity(dev Device, recommended bool) (int, error) {
	rec := C.int(0)
	if recommended {
		rec = 1
	}
	r := C.gc_vmm_granularity(dev.h, rec)
	if r.r != 0 {
		return 0, newError("cuMemGetAllocationGranularity", r.r)
	}
	return int(r.v), nil
}

// VMMBuffer is device memory allocated with the virtual memory management
// API (cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess), or
// imported from another process's file descriptor. Unlike legacy IPC, the
// exporting process can also import its own buffers, and the fd can be sent
// over a Unix socket (SCM_RIGHTS).
type VMMBuffer struct {
	Ptr  DevicePtr // start of the mapping
	Size int       // mapped size (a multiple of the granularity)

	ctx       *Context
	handle    C.uint64_t // CUmemGenericAllocationHandle
	hasHandle bool
	reserved  bool
	mapped    bool
	imported  bool
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

// accessList returns the CUdevice ids to grant read-write access, always
// including the context's own device.
func accessList(ctx *Context, devs []Device) []C.int {
	out := make([]C.int, 0, len(devs)+1)
	out = append(out, C.int(ctx.dev.ordinal))
	for _, d := range devs {
		dup := false
		for _, o := range out {
			if o == C.int(d.ordinal) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, C.int(d.ordinal))
		}
	}
	return out
}

// AllocVMM allocates at least size bytes of device memory on ctx's device,
// exportable as a POSIX file descriptor, mapped read-write for ctx's device
// and every device in accessDevices.
func AllocVMM(ctx *Context, size int, accessDevices []Device) (*VMMBuffer, error) {
	if size <= 0 {
		return nil, errors.New("cuda: AllocVMM size must be positive")
	}
	gran, err := VMMGranularity(ctx.dev, false)
	if err != nil {
		return nil, err
	}
	b := &VMMBuffer{ctx: ctx, Size: roundUp(size, gran)}
	r := C.gc_vmm_create(ctx.h, C.int(ctx.dev.ordinal), C.size_t(b.Size))
	if r.r != 0 {
		return nil, newError("cuMemCreate", r.r)
	}
	b.handle, b.hasHandle = C.uint64_t(r.v), true
	if err := b.mapAndGrant(gran, accessDevices); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return b, nil
}

// ImportVMM maps an allocation exported by ExportFD (in this or another
// process) into ctx. size must be the exporter's Size. The fd is not closed:
// the caller still owns it and may close it right after ImportVMM returns.
func ImportVMM(ctx *Context, fd int, size int, accessDevices []Device) (*VMMBuffer, error) {
	if size <= 0 {
		return nil, errors.New("cuda: ImportVMM size must be positive")
	}
	if fd < 0 {
		return nil, fmt.Errorf("cuda: ImportVMM: bad file descriptor %d", fd)
	}
	gran, err := VMMGranularity(ctx.dev, false)
	if err != nil {
		return nil, err
	}
	b := &VMMBuffer{ctx: ctx, Size: roundUp(size, gran), imported: true}
	r := C.gc_vmm_import_fd(ctx.h, C.int(fd))
	if r.r != 0 {
		return nil, newError("cuMemImportFromShareableHandle", r.r)
	}
	b.handle, b.hasHandle = C.uint64_t(r.v), true
	if err := b.mapAndGrant(gran, accessDevices); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return b, nil
}

func (b *VMMBuffer) mapAndGrant(gran int, accessDevices []Device) error {
	r := C.gc_vmm_address_reserve(b.ctx.h, C.size_t(b.Size), C.size_t(gran))
	if r.r != 0 {
		return newError("cuMemAddressReserve", r.r)
	}
	b.Ptr, b.reserved = DevicePtr(r.v), true
	if err := check("cuMemMap", C.gc_vmm_map(b.ctx.h, C.uint64_t(b.Ptr), C.size_t(b.Size), b.handle)); err != nil {
		return err
	}
	b.mapped = true
	devs := accessList(b.ctx, accessDevices)
	if len(devs) > C.GC_MAX_ACCESS_DEVICES {
		return fmt.Errorf("cuda: at most %d access devices", C.GC_MAX_ACCESS_DEVICES)
	}
	return check("cuMemSetAccess",
		C.gc_vmm_set_access(b.ctx.h, C.uint64_t(b.Ptr), C.size_t(b.Size), &devs[0], C.int(len(devs))))
}

// Imported reports whether the buffer came from ImportVMM.
func (b *VMMBuffer) Imported() bool {
	if b == nil {
		return false
	}
	return b.imported
}

// ExportFD returns a new file descriptor for the allocation
// (cuMemExportToShareableHandle). The caller owns it and must close it.
func (b *VMMBuffer) ExportFD() (int, error) {
	if b == nil {
		return 0, errNil("VMMBuffer")
	}
	if !b.hasHandle {
		return -1, errors.New("cuda: VMMBuffer is closed")
	}
	r := C.gc_vmm_export_fd(b.ctx.h, b.handle)
	if r.r != 0 {
		return -1, newError("cuMemExportToShareableHandle", r.r)
	}
	return int(int64(r.v)), nil
}

// Close unmaps the buffer, frees the address range and releases the
// allocation handle, in that order. The memory itself is freed once every
// process that mapped it has done the same. Close is idempotent.
func (b *VMMBuffer) Close() error {
	if b == nil {
		return nil
	}
	var errs []error
	if b.mapped {
		errs = append(errs, check("cuMemUnmap", C.gc_vmm_unmap(b.ctx.h, C.uint64_t(b.Ptr), C.size_t(b.Size))))
		b.mapped = false
	}
	if b.reserved {
		errs = append(errs, check("cuMemAddressFree", C.gc_vmm_address_free(b.ctx.h, C.uint64_t(b.Ptr), C.size_t(b.Size))))
		b.reserved = false
		b.Ptr = 0
	}
	if b.hasHandle {
		errs = append(errs, check("cuMemRelease", C.gc_vmm_release(b.ctx.h, b.handle)))
		b.handle, b.hasHandle = 0, false
	}
	return errors.Join(errs...)
}
