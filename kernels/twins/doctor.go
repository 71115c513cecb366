package twins

import (
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

func init() {
	// goep_fill_pattern(u32* dst, u64 n, u32 seed)
	device.RegisterHostKernel("goep_fill_pattern", func(l *device.HostLaunch) error {
		n := int(l.Args.GetU64(1))
		kernels.FillPattern(device.HostSlice[uint32](l.Args.GetPtr(0), n), l.Args.GetU32(2))
		return nil
	})
	// goep_check_pattern(const u32* src, u64 n, u32 seed, u64* mismatches)
	device.RegisterHostKernel("goep_check_pattern", func(l *device.HostLaunch) error {
		n := int(l.Args.GetU64(1))
		bad := kernels.CountPatternMismatches(device.HostSlice[uint32](l.Args.GetPtr(0), n), l.Args.GetU32(2))
		device.HostSlice[uint64](l.Args.GetPtr(3), 1)[0] += bad
		return nil
	})
	// goep_write_host_flag(volatile u32* flag, u32 value)
	device.RegisterHostKernel("goep_write_host_flag", func(l *device.HostLaunch) error {
		device.HostSlice[uint32](l.Args.GetPtr(0), 1)[0] = l.Args.GetU32(1)
		return nil
	})
	// goep_convert_test(const float* in, u16* bf16_out, u8* fp8_out,
	//                   float* bf16_back, float* fp8_back, u64 n)
	device.RegisterHostKernel("goep_convert_test", func(l *device.HostLaunch) error {
		n := int(l.Args.GetU64(5))
		in := device.HostSlice[float32](l.Args.GetPtr(0), n)
		bf, q := device.HostSlice[uint16](l.Args.GetPtr(1), n), device.HostSlice[uint8](l.Args.GetPtr(2), n)
		bfBack, qBack := device.HostSlice[float32](l.Args.GetPtr(3), n), device.HostSlice[float32](l.Args.GetPtr(4), n)
		for i, x := range in {
			bf[i] = kernels.Float32ToBF16(x)
			q[i] = kernels.Float32ToFP8E4M3(x)
			bfBack[i] = kernels.BF16ToFloat32(bf[i])
			qBack[i] = kernels.FP8E4M3ToFloat32(q[i])
		}
		return nil
	})
}
