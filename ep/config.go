package ep

import (
	"fmt"
	"time"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/routing"
	"github.com/goep-dev/goep/intranode"
)

// Config sizes a Buffer and sets its launch parameters. Every rank passes
// the same MaxTokens, Hidden, TopK, Experts, FP8 and WorkspaceBytes
// (NewBuffer checks and names a rank that differs).
type Config struct {
	// MaxTokens is the most tokens one rank dispatches in one call; the
	// receive region holds Ranks*MaxTokens rows (the worst case).
	MaxTokens int
	// Hidden is the row length: a multiple of 8 (of 128 with FP8).
	Hidden int
	// TopK is the number of experts per token, 1..32.
	TopK int
	// Experts is the global expert count: a multiple of the rank count, at
	// most 4096.
	Experts int
	// FP8 makes room for FP8 dispatch (float32 scales per 128 elements).
	FP8 bool
	// Handles is how many dispatch handles may be alive at once (0: 4).
	// A non-cached dispatch takes a slot; when none is free it takes the
	// least recently used one that is not pinned, and the handle that had
	// it expires (using it is an error).
	Handles int
	// WorkspaceBytes, when not 0, is the NVLink workspace size, like
	// DeepEP's num_nvl_bytes; it must hold every region (SizeHints).
	WorkspaceBytes int
	// Timeout bounds every device-side wait (0: $GOEP_CHANNEL_TIMEOUT,
	// else 60 s). A wait that runs out names the rank it waited on and
	// makes the Buffer refuse calls until Close.
	Timeout time.Duration
	// Tag keeps apart Buffers built or closed at the same time over one
	// bootstrap (0..16777215).
	Tag int
	// Dispatch and Combine size the kernels' launches; zero fields take
	// DefaultLaunch(ranks, op).
	Dispatch, Combine LaunchConfig
	// Layout sizes the dispatch-layout kernel (zero: its defaults).
	Layout routing.LayoutConfig
}

// LaunchConfig sizes a dispatch or combine launch.
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

// CopyMode selects how dispatch moves rows (intranode.CopyMode).
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

// CopyModes lists the copy paths tuning sweeps.
var CopyModes = []CopyMode{CopyPlain, CopyWide, CopyTMA}

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
	t, ok := defaultLaunch[ranks]
	if !ok {
		t = defaultLaunch[8]
	}
	c, _ := t[op].fill(op)
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

// fill completes c with the kernels' defaults and checks it.
func (c LaunchConfig) fill(op Op) (LaunchConfig, error) {
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

// over is c with the non-zero fields of o on top.
func (c LaunchConfig) over(o LaunchConfig) LaunchConfig {
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

// resolve is c over the defaults for ranks, filled and checked.
func (c LaunchConfig) resolve(ranks int, op Op) (LaunchConfig, error) {
	t, ok := defaultLaunch[ranks]
	if !ok {
		t = defaultLaunch[8]
	}
	return t[op].over(c).fill(op)
}

func (c LaunchConfig) intranode() intranode.LaunchConfig {
	return intranode.LaunchConfig{NumSMs: c.SMs, Threads: c.Threads, Copy: c.Copy}
}

func (c Config) buffer() buffer.Config {
	return buffer.Config{MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts, FP8: c.FP8,
		Handles: c.Handles, WorkspaceBytes: c.WorkspaceBytes, Timeout: c.Timeout, Tag: c.Tag}
}

// SizeHint is what a Buffer takes on each rank: the NVLink workspace and
// its regions, handle slots, layout and combine outputs, host-mapped
// counters.
type SizeHint = buffer.SizeHint

// SizeHints computes what a Buffer of c takes on each of ranks ranks
// without allocating, and checks c (experts divisible by ranks, hidden a
// multiple of what the kernels need, the regions fitting WorkspaceBytes,
// launch parameters).
func SizeHints(c Config, ranks int) (SizeHint, error) {
	h, err := buffer.SizeHints(c.buffer(), ranks)
	if err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	if _, err := c.Dispatch.resolve(ranks, OpDispatch); err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	if _, err := c.Combine.resolve(ranks, OpCombine); err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	if _, err := routing.PlanLayout(routing.Shape{Tokens: c.MaxTokens, K: c.TopK, Experts: c.Experts, Ranks: ranks}, 0, c.Layout); err != nil {
		return h, fmt.Errorf("ep: %w", err)
	}
	return h, nil
}
