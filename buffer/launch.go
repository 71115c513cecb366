package buffer

import (
	"fmt"

	"github.com/goep-dev/goep/intranode"
)

// LaunchConfig sizes a dispatch or combine launch of the Buffer's mode.
type LaunchConfig struct {
	// SMs is the number of blocks, one per SM (capped at the GPU's SM
	// count); 0 means the default.
	SMs int
	// Threads per block, a multiple of 32 up to the kernel's maximum
	// (dispatch: 1024 plain and TMA, 512 wide; combine: 512); 0 means the
	// kernel's default for the copy mode.
	Threads int
	// Copy is dispatch's copy path (combine ignores it); CopyDefault means
	// the table's, else the kernels' default.
	Copy CopyMode
}

// CopyMode selects how dispatch moves rows.
type CopyMode = intranode.CopyMode

// Copy paths of dispatch.
const (
	CopyDefault = intranode.CopyDefault
	// CopyPlain: 16-byte loads and stores, up to 1024 threads a block.
	CopyPlain = intranode.CopyPlain
	// CopyWide: 16-byte loads and stores with twice the loads in flight,
	// up to 512 threads a block.
	CopyWide = intranode.CopyWide
	// CopyTMA: bulk copies through shared memory (Hopper with NVRTC 12+;
	// elsewhere the same kernel runs the plain body).
	CopyTMA = intranode.CopyTMA
)

// FP8Block is the number of FP8 elements that share one float32 scale.
const FP8Block = intranode.FP8Block

// Op names an operation in launch defaults and tuning results.
type Op string

// Operations.
const (
	OpDispatch Op = "dispatch"
	OpCombine  Op = "combine"
)

// defaultLaunch holds the launch defaults per rank count, from
// `ep-bench launch -n N -- intranode --tokens 4096 --fp8 --tune` on H200s
// (docs/PERFORMANCE.md, 2026-11-21): the fastest BF16 configuration with at
// most 24 SMs (DeepEP's budget; 32 SMs gain under 3% at 4 ranks), except
// combine on 2 ranks, which is 24% faster with 32 SMs (347 -> 263 us) and
// worth them. 8 ranks keeps DeepEP's 24 SMs until an 8-GPU sweep runs.
var defaultLaunch = map[int]map[Op]LaunchConfig{
	2: {OpDispatch: {SMs: 20, Threads: 256, Copy: CopyPlain}, OpCombine: {SMs: 32, Threads: 512}},
	4: {OpDispatch: {SMs: 24, Threads: 512, Copy: CopyPlain}, OpCombine: {SMs: 24, Threads: 512}},
	8: {OpDispatch: {SMs: 24}, OpCombine: {SMs: 24}},
}

// DefaultLaunch is the launch configuration of op for a group of ranks
// ranks, every field filled in (rank counts without a table entry take the
// 8-rank one).
func DefaultLaunch(ranks int, op Op) LaunchConfig {
	c, _ := LaunchConfig{}.Resolve(ranks, op)
	return c
}

// threadLimits are the default and largest block sizes of op's kernel.
func threadLimits(op Op, mode CopyMode) (def, most int) {
	if op == OpCombine {
		return intranode.DefaultCombineThreads, intranode.CombineMaxThreads
	}
	switch mode {
	case CopyWide:
		return intranode.DefaultDispatchWideThreads, intranode.DispatchWideMaxThreads
	case CopyTMA:
		return intranode.DefaultDispatchTMAThreads, intranode.DispatchTMAMaxThreads
	}
	return intranode.DefaultDispatchThread, intranode.DispatchMaxThreads
}

// Fill completes c with the kernels' defaults and checks it.
func (c LaunchConfig) Fill(op Op) (LaunchConfig, error) {
	if c.SMs == 0 {
		c.SMs = intranode.DefaultSMs
	}
	if op == OpCombine {
		c.Copy = CopyDefault
	} else if c.Copy == CopyDefault {
		c.Copy = intranode.DefaultCopy
	}
	def, most := threadLimits(op, c.Copy)
	if c.Threads == 0 {
		c.Threads = def
	}
	switch {
	case op != OpDispatch && op != OpCombine:
		return c, fmt.Errorf("launch: unknown operation %q", op)
	case c.SMs < 1:
		return c, fmt.Errorf("%s launch: %d SMs", op, c.SMs)
	case c.Copy != CopyDefault && c.Copy != CopyPlain && c.Copy != CopyWide && c.Copy != CopyTMA:
		return c, fmt.Errorf("%s launch: unknown %v", op, c.Copy)
	case c.Threads < 32 || c.Threads > most || c.Threads%32 != 0:
		return c, fmt.Errorf("%s launch (%v copy): %d threads per block: want a multiple of 32 in 32..%d", op, c.Copy, c.Threads, most)
	case op == OpDispatch && c.Copy == CopyTMA && intranode.TMAPiece(c.Threads) < 512:
		return c, fmt.Errorf("%s launch (tma copy): %d threads per block leave no room for the staging buffers", op, c.Threads)
	}
	return c, nil
}

// Over is c with the non-zero fields of o on top.
func (c LaunchConfig) Over(o LaunchConfig) LaunchConfig {
	if o.SMs != 0 {
		c.SMs = o.SMs
	}
	if o.Copy != CopyDefault {
		c.Copy = o.Copy
		c.Threads = 0 // the new mode's default unless o says
	}
	if o.Threads != 0 {
		c.Threads = o.Threads
	}
	return c
}

// Resolve is c over the defaults for ranks, filled and checked.
func (c LaunchConfig) Resolve(ranks int, op Op) (LaunchConfig, error) {
	return c.resolveWithin(ranks, op, 0)
}

// resolveWithin is Resolve on a GPU where each rank's spinning launches
// may use at most budget blocks (0: no limit): the defaults shrink to fit,
// an explicit SMs above it is refused.
func (c LaunchConfig) resolveWithin(ranks int, op Op, budget int) (LaunchConfig, error) {
	t, ok := defaultLaunch[ranks]
	if !ok {
		t = defaultLaunch[8]
	}
	if budget > 0 && c.SMs > budget {
		return c, fmt.Errorf("%s launch: %d SMs, but this rank's share of its GPU is %d blocks (ranks sharing a GPU must all be resident at once)", op, c.SMs, budget)
	}
	r, err := t[op].Over(c).Fill(op)
	if err == nil && budget > 0 {
		r.SMs = min(r.SMs, budget)
	}
	return r, err
}

// LaunchFor is the launch configuration a call of op with the override o
// (nil: none) uses: o's non-zero fields over the Buffer's (Config's over
// the defaults, within this rank's share of a shared GPU), every field
// filled in.
func (b *Buffer) LaunchFor(op Op, o *LaunchConfig) (LaunchConfig, error) {
	if b == nil {
		return LaunchConfig{}, errNil
	}
	def := b.dispatchLaunch
	if op == OpCombine {
		def = b.combineLaunch
	}
	if o == nil {
		return def, nil
	}
	if b.spinBlocks > 0 && o.SMs > b.spinBlocks {
		return def, fmt.Errorf("%s launch: %d SMs, but this rank's share of its GPU is %d blocks (%d ranks share it; all must be resident at once)",
			op, o.SMs, b.spinBlocks, b.sharedGPU)
	}
	return def.Over(*o).Fill(op)
}

func (c LaunchConfig) intranode() intranode.LaunchConfig {
	return intranode.LaunchConfig{NumSMs: c.SMs, Threads: c.Threads, Copy: c.Copy}
}
