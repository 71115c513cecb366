package twins

import (
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

func init() {
	device.RegisterHostKernel(routing.KernelWidenIDs, widenTwin)
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
