package lowlatency_test

import (
	"testing"
	"time"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/lowlatency"
)

// The checks of the issue, on a given backend: random routings with -1
// and out-of-range ids (ignored, and counted: also with int32 ids, split
// calls and masked ranks), an expert that receives nothing, all tokens to one
// expert, T = 0, 1 and max, top-k 1..9, FP8 and UE8M0 scales, a masked
// rank (and the mask cleared again), rank-major, int32 ids, split
// send/receive with two micro-batches on alternating sets.
func cases() []llCase {
	return []llCase{
		{name: "bf16-random", ranks: 4, maxTokens: 9, hidden: 64, topk: 3, le: 2, weights: true, microBatches: 2, iters: 3,
			minus1: 10, bad: 5, hot: -1, cold: 5},
		{name: "fp8-split", ranks: 3, maxTokens: 6, hidden: 256, topk: 4, le: 3, format: lowlatency.FP8, weights: true,
			split: true, microBatches: 2, iters: 2, minus1: 15, bad: 4, hot: -1, cold: -1},
		{name: "ue8m0-ids32", ranks: 2, maxTokens: 5, hidden: 384, topk: 2, le: 4, format: lowlatency.UE8M0, ids32: true,
			microBatches: 1, iters: 2, bad: 10, hot: -1, cold: 0},
		{name: "one-expert", ranks: 4, maxTokens: 7, hidden: 32, topk: 1, le: 2, tokens: []int{7, 7, 7, 7}, weights: true,
			microBatches: 2, iters: 2, hot: 5, cold: -1},
		{name: "t0-t1-max", ranks: 3, maxTokens: 4, hidden: 48, topk: 9, le: 3, tokens: []int{0, 1, 4}, weights: true,
			split: true, microBatches: 2, iters: 2, dups: 10, hot: -1, cold: -1},
		{name: "masked", ranks: 4, maxTokens: 5, hidden: 64, topk: 4, le: 2, weights: true, microBatches: 2, iters: 4,
			masks: []uint32{1 << 2, 1 << 2, 0, 1<<1 | 1<<3}, minus1: 5, bad: 6, hot: -1, cold: -1},
		{name: "rank-major", ranks: 3, maxTokens: 6, hidden: 256, topk: 3, le: 2, format: lowlatency.FP8, rankMajor: true,
			weights: true, split: true, microBatches: 2, iters: 2, minus1: 20, hot: -1, cold: -1},
		{name: "fp8-combine", ranks: 2, maxTokens: 5, hidden: 256, topk: 2, le: 3, weights: true, fp8Combine: true,
			microBatches: 1, iters: 2, hot: -1, cold: -1},
		{name: "one-rank", ranks: 1, maxTokens: 4, hidden: 16, topk: 2, le: 3, weights: true, microBatches: 2, iters: 2,
			hot: -1, cold: -1},
		{name: "eight-ranks", ranks: 8, maxTokens: 6, hidden: 64, topk: 8, le: 4, weights: true, split: true,
			microBatches: 2, iters: 2, minus1: 5, bad: 3, hot: -1, cold: 7},
		// Rows wider than one batch of the loops that keep several 16-byte
		// chunks in flight per lane (the expansion copy: 256 chunks a
		// batch; 528 here, the last batch partial), and many rounds a slice.
		{name: "wide", ranks: 2, maxTokens: 3, hidden: 4224, topk: 3, le: 2, weights: true, microBatches: 1, iters: 2,
			minus1: 10, hot: -1, cold: -1},
		{name: "wide-fp8", ranks: 2, maxTokens: 3, hidden: 4224, topk: 3, le: 2, format: lowlatency.FP8, weights: true,
			fp8Combine: true, microBatches: 1, iters: 1, minus1: 10, hot: -1, cold: -1},
		// Few tokens against many warps (the emulation runs it on 5
		// blocks): the combine send's units run over received tokens only
		// (a source with none between others, one with many: several units
		// a warp), and send steps leave idle blocks out of the arrival.
		{name: "few-tokens", ranks: 4, maxTokens: 16, hidden: 512, topk: 4, le: 2, tokens: []int{1, 0, 3, 16},
			weights: true, split: true, microBatches: 2, iters: 3, masks: []uint32{0, 1 << 2, 0}, minus1: 10, hot: -1,
			cold: -1},
		{name: "wide-rank-major", ranks: 2, maxTokens: 3, hidden: 4224, topk: 2, le: 2, rankMajor: true, weights: true,
			microBatches: 1, iters: 1, hot: -1, cold: -1},
	}
}

func hostDevices(t testing.TB, n int) []device.Device {
	devs := make([]device.Device, n)
	for i := range devs {
		d := device.OpenHost(i)
		devs[i] = d
		t.Cleanup(func() { _ = d.Close() })
	}
	return devs
}

func TestDispatchCombineMatchReferenceHost(t *testing.T) {
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			devs := hostDevices(t, c.ranks)
			c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
			g := newGroup(t, devs, c.config(), 20*time.Second, 0)
			runCase(t, g, c)
		})
	}
}
