package routing

import (
	"math/bits"

	"github.com/goep-dev/goep/internal/device"
)

func init() {
	device.RegisterHostKernel(KernelLayoutInt64, layoutTwin[int64])
	device.RegisterHostKernel(KernelLayoutInt32, layoutTwin[int32])
}

// layoutTwin is goep_layout_i64 / goep_layout_i32:
//
//	(const Idx* topk, int num_tokens, int k, int num_experts, int num_ranks,
//	 i32* per_rank, i32* per_expert, u8* is_token_in_rank, i32* invalid,
//	 u32* workspace)
//
// It does the kernel's arithmetic, not CountLayout's (the reference the
// tests compare it with): one array of counts [experts | ranks | invalid]
// as the kernel's shared memory, the rank of an expert by the kernel's
// multiply-high with (2^32 / (E/R) + 1), a token's ranks as a bit mask
// spread into its is_token_in_rank row, and the per-rank counts as the
// population of each mask bit over tokens (the kernel's ballots). The
// workspace is the GPU kernel's scratch, zero before and after every
// launch, so the twin leaves it alone.
func layoutTwin[I Index](l *device.HostLaunch) error {
	a := l.Args
	s := Shape{Tokens: int(a.GetI32(1)), K: int(a.GetI32(2)), Experts: int(a.GetI32(3)), Ranks: int(a.GetI32(4))}
	if err := s.Validate(); err != nil {
		return err // the GPU kernel would misbehave; LaunchLayout never sends this
	}
	topk := device.HostSlice[I](a.GetPtr(0), s.Entries())
	inRank := device.HostSlice[uint8](a.GetPtr(7), s.Tokens*s.Ranks)
	counts := make([]int32, s.Experts+s.Ranks+1)
	ranks := counts[s.Experts : s.Experts+s.Ranks]
	rankMagic := uint64(1)<<32/uint64(s.Experts/s.Ranks) + 1
	for t := range s.Tokens {
		var mask uint64
		for _, v := range topk[t*s.K : (t+1)*s.K] {
			e := int64(v)
			if e >= 0 && e < int64(s.Experts) {
				counts[e]++
				mask |= 1 << (uint64(e) * rankMagic >> 32)
			} else if e != -1 {
				counts[len(counts)-1]++
			}
		}
		row := inRank[t*s.Ranks : (t+1)*s.Ranks]
		for r := range row {
			row[r] = uint8(mask >> r & 1)
		}
		for m := mask; m != 0; m &= m - 1 {
			ranks[bits.TrailingZeros64(m)]++
		}
	}
	copy(device.HostSlice[int32](a.GetPtr(5), s.Ranks), ranks)
	copy(device.HostSlice[int32](a.GetPtr(6), s.Experts), counts[:s.Experts])
	if p := a.GetPtr(8); p != 0 {
		device.HostSlice[int32](p, 1)[0] = counts[len(counts)-1]
	}
	return nil
}
