package twins

import (
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

func init() {
	device.RegisterHostKernel(routing.KernelLayoutInt64, layoutTwin[int64])
	device.RegisterHostKernel(routing.KernelLayoutInt32, layoutTwin[int32])
}

// layoutTwin is goep_layout_i64 / goep_layout_i32:
//
//	(const Idx* topk, int num_tokens, int k, int num_experts, int num_ranks,
//	 i32* per_rank, i32* per_expert, u8* is_token_in_rank, i32* invalid,
//	 u32* workspace)
//
// It computes the reference layout on the same memory. The workspace is the
// GPU kernel's scratch, zero before and after every launch, so the twin
// leaves it alone.
func layoutTwin[I routing.Index](l *device.HostLaunch) error {
	a := l.Args
	s := routing.Shape{Tokens: int(a.GetI32(1)), K: int(a.GetI32(2)), Experts: int(a.GetI32(3)), Ranks: int(a.GetI32(4))}
	if err := s.Validate(); err != nil {
		return err // the GPU kernel would misbehave; LaunchLayout never sends this
	}
	idx := device.HostSlice[I](a.GetPtr(0), s.Entries())
	invalid := routing.CountLayout(idx,
		s,
		device.HostSlice[int32](a.GetPtr(5), s.Ranks),
		device.HostSlice[int32](a.GetPtr(6), s.Experts),
		device.HostSlice[uint8](a.GetPtr(7), s.Tokens*s.Ranks),
	)
	if p := a.GetPtr(8); p != 0 {
		device.HostSlice[int32](p, 1)[0] = int32(invalid)
	}
	return nil
}
