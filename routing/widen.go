package routing

import (
	"errors"
	"fmt"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// KernelWidenIDs is in kernels/ep_convert.cu (module "ep"): it widens int32
// top-k ids to int64; the host backend runs widenTwin.
const KernelWidenIDs = "goep_ep_widen_i32"

func init() {
	kernels.Register(kernels.Module{Name: "ep", File: "ep_convert.cu", Kernels: []string{KernelWidenIDs}})
	device.RegisterHostKernel(KernelWidenIDs, widenTwin)
}

// widenTwin is goep_ep_widen_i32:
//
//	(const i32* src, i64* dst, u64 n)
func widenTwin(l *device.HostLaunch) error {
	a := l.Args
	n := int(a.GetU64(2))
	src := device.HostSlice[int32](a.GetPtr(0), n)
	dst := device.HostSlice[int64](a.GetPtr(1), n)
	for i, v := range src {
		dst[i] = int64(v)
	}
	return nil
}

// widenThreads and widenMaxBlocks shape the widening launch: a grid-stride
// loop, so any grid is correct.
const (
	widenThreads   = 256
	widenMaxBlocks = 1024
)

// LaunchWidenIDs enqueues on s (nil: the device's default stream) the
// conversion of n int32 ids at src (4-byte aligned) into int64 ids at dst
// (8-byte aligned, room for n): sign-extended, so -1 and out-of-range ids
// keep their values. n == 0 launches nothing. No host work: it can be
// captured into a graph.
func LaunchWidenIDs(dev device.Device, s device.Stream, src, dst uintptr, n int) error {
	switch {
	case dev == nil:
		return errors.New("widen ids: nil device")
	case n < 0:
		return fmt.Errorf("widen ids: %d ids", n)
	case n == 0:
		return nil
	case src == 0 || dst == 0:
		return fmt.Errorf("widen ids: null pointer (src %#x, dst %#x)", src, dst)
	case src%4 != 0 || dst%8 != 0:
		return fmt.Errorf("widen ids: misaligned pointer (src %#x, dst %#x)", src, dst)
	}
	blocks := min((n+widenThreads-1)/widenThreads, widenMaxBlocks)
	args := device.NewArgs(3).Ptr(src).Ptr(dst).U64(uint64(n))
	if err := dev.Launch(KernelWidenIDs, device.D1(blocks), device.D1(widenThreads), 0, s, args); err != nil {
		return fmt.Errorf("widen ids: %w", err)
	}
	return nil
}
