package device

import "github.com/goep-dev/goep/kernels"

// The doctor kernels (kernels/doctor.cu) check a device end to end: the
// test pattern, a write into host-mapped memory, the narrow-float
// conversions. Every backend user may launch them (ep-bench doctor, the
// channels tests' fills), so this package owns them: it registers their
// module and their host twins.
const (
	KernelFillPattern   = "goep_fill_pattern"
	KernelCheckPattern  = "goep_check_pattern"
	KernelWriteHostFlag = "goep_write_host_flag"
	KernelConvertTest   = "goep_convert_test"
	// KernelReserveLocalMemory sizes a context's local memory once, when
	// the first Device opens it (reserveLocalMemory).
	KernelReserveLocalMemory = "goep_reserve_local_memory"
)

func init() {
	kernels.Register(kernels.Module{Name: "doctor", File: "doctor.cu",
		Kernels: []string{KernelFillPattern, KernelCheckPattern, KernelWriteHostFlag, KernelConvertTest,
			KernelReserveLocalMemory}})

	// goep_reserve_local_memory(u32* out, u32 seed): the CUDA path's stack
	// reservation; the host backend has nothing to reserve.
	RegisterHostKernel(KernelReserveLocalMemory, func(l *HostLaunch) error {
		if p := l.Args.GetPtr(0); p != 0 {
			HostSlice[uint32](p, 1)[0] = l.Args.GetU32(1) * (l.Args.GetU32(1) % 128)
		}
		return nil
	})

	// goep_fill_pattern(u32* dst, u64 n, u32 seed)
	RegisterHostKernel(KernelFillPattern, func(l *HostLaunch) error {
		n := int(l.Args.GetU64(1))
		kernels.FillPattern(HostSlice[uint32](l.Args.GetPtr(0), n), l.Args.GetU32(2))
		return nil
	})
	// goep_check_pattern(const u32* src, u64 n, u32 seed, u64* mismatches)
	RegisterHostKernel(KernelCheckPattern, func(l *HostLaunch) error {
		n := int(l.Args.GetU64(1))
		bad := kernels.CountPatternMismatches(HostSlice[uint32](l.Args.GetPtr(0), n), l.Args.GetU32(2))
		HostSlice[uint64](l.Args.GetPtr(3), 1)[0] += bad
		return nil
	})
	// goep_write_host_flag(volatile u32* flag, u32 value)
	RegisterHostKernel(KernelWriteHostFlag, func(l *HostLaunch) error {
		HostSlice[uint32](l.Args.GetPtr(0), 1)[0] = l.Args.GetU32(1)
		return nil
	})
	// goep_convert_test(const float* in, u16* bf16_out, u8* fp8_out,
	//                   float* bf16_back, float* fp8_back, u64 n)
	RegisterHostKernel(KernelConvertTest, func(l *HostLaunch) error {
		n := int(l.Args.GetU64(5))
		in := HostSlice[float32](l.Args.GetPtr(0), n)
		bf, q := HostSlice[uint16](l.Args.GetPtr(1), n), HostSlice[uint8](l.Args.GetPtr(2), n)
		bfBack, qBack := HostSlice[float32](l.Args.GetPtr(3), n), HostSlice[float32](l.Args.GetPtr(4), n)
		for i, x := range in {
			bf[i] = kernels.Float32ToBF16(x)
			q[i] = kernels.Float32ToFP8E4M3(x)
			bfBack[i] = kernels.BF16ToFloat32(bf[i])
			qBack[i] = kernels.FP8E4M3ToFloat32(q[i])
		}
		return nil
	})
}
