package routing

import (
	"errors"
	"fmt"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Kernel names in kernels/layout.cu (module "layout"); the host backend runs
// their Go twins (layout_twin.go).
const (
	KernelLayoutInt64 = "goep_layout_i64"
	KernelLayoutInt32 = "goep_layout_i32"
)

func init() {
	kernels.Register(kernels.Module{Name: "layout", File: "layout.cu", Kernels: []string{KernelLayoutInt64, KernelLayoutInt32}})
}

// LayoutWorkspaceBytes is the size of the layout kernel's workspace: a
// ticket counter and one accumulator per expert, per rank and for the invalid
// count, for the largest shape. See LayoutOutput.Workspace.
const LayoutWorkspaceBytes = 4 * (1 + MaxExperts + MaxRanks + 1)

// LayoutInput is a routing in device memory.
type LayoutInput struct {
	TopK  uintptr // topk_idx[Tokens, K], row-major; may be 0 when Tokens == 0
	Int32 bool    // elements are int32 (default int64, as torch.topk returns)
	Shape
}

// LayoutOutput is where the layout kernel writes, all in device memory. The
// kernel overwrites every element (no zeroing needed) and uses no host
// memset, so a launch can be captured into a graph and replayed.
type LayoutOutput struct {
	TokensPerRank   uintptr // int32[Ranks]
	TokensPerExpert uintptr // int32[Experts]
	IsTokenInRank   uintptr // uint8[Tokens*Ranks], 0 or 1; may be 0 when Tokens == 0
	// Invalid, when not 0, receives an int32: the number of topk_idx
	// entries outside [-1, Experts). The kernel ignores such entries (it
	// never faults on them); host code validates host routings before
	// they reach a device, so a non-zero count means corrupted input.
	Invalid uintptr
	// Workspace is LayoutWorkspaceBytes of device memory, zeroed once when
	// allocated (NewLayoutWorkspace). Every launch leaves it zeroed again:
	// the blocks add their counts into it and the last block to finish
	// moves the totals out and clears it. One workspace serves one launch
	// at a time: launches that may overlap (different streams) need their
	// own.
	Workspace uintptr
}

// LayoutConfig tunes the launch; the zero value is the default.
type LayoutConfig struct {
	// Threads per block: a multiple of 32 up to 1024; 0 means 256. Each
	// thread takes one token at a time.
	Threads int
	// MaxBlocks caps the grid; 0 means the device's SM count (132 on the
	// host backend). Blocks loop over token tiles when T needs more.
	MaxBlocks int
}

// LaunchShape is the grid the layout kernel runs with.
type LaunchShape struct {
	Blocks, Threads int
	SharedBytes     int // dynamic shared memory: one int32 per expert, per rank, and the invalid count
}

func (l LaunchShape) String() string { return fmt.Sprintf("%dx%d", l.Blocks, l.Threads) }

const (
	defaultLayoutThreads = 256
	defaultSMs           = 132 // H100/H200 SXM
)

// PlanLayout picks the launch shape for s on a device with sms SMs (0 when
// unknown): one token per thread, as many blocks as the tokens need up to
// the SM count, and at least one block so that T == 0 still writes zero
// counts.
func PlanLayout(s Shape, sms int, cfg LayoutConfig) (LaunchShape, error) {
	threads := cfg.Threads
	if threads == 0 {
		threads = defaultLayoutThreads
	}
	if threads < 32 || threads > 1024 || threads%32 != 0 {
		return LaunchShape{}, fmt.Errorf("layout: %d threads per block: want a multiple of 32 in 32..1024", threads)
	}
	maxBlocks := cfg.MaxBlocks
	if maxBlocks == 0 {
		maxBlocks = sms
	}
	if maxBlocks <= 0 {
		maxBlocks = defaultSMs
	}
	blocks := min(max((s.Tokens+threads-1)/threads, 1), maxBlocks)
	return LaunchShape{Blocks: blocks, Threads: threads, SharedBytes: 4 * (s.Experts + s.Ranks + 1)}, nil
}

// LaunchLayout validates the shapes and pointers and enqueues the layout
// kernel on s (nil: the device's default stream). It does not read topk_idx
// on the host: out-of-range ids are counted in out.Invalid, not reported
// here.
func LaunchLayout(dev device.Device, s device.Stream, in LayoutInput, out LayoutOutput, cfg LayoutConfig) error {
	if dev == nil {
		return errors.New("layout: nil device")
	}
	if err := in.Shape.Validate(); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	if err := checkPointers(in, out); err != nil {
		return fmt.Errorf("layout %v: %w", in.Shape, err)
	}
	plan, err := PlanLayout(in.Shape, dev.Info().SMs, cfg)
	if err != nil {
		return err
	}
	kernel := KernelLayoutInt64
	if in.Int32 {
		kernel = KernelLayoutInt32
	}
	args := device.NewArgs(10).Ptr(in.TopK).
		I32(int32(in.Tokens)).I32(int32(in.K)).I32(int32(in.Experts)).I32(int32(in.Ranks)).
		Ptr(out.TokensPerRank).Ptr(out.TokensPerExpert).Ptr(out.IsTokenInRank).Ptr(out.Invalid).Ptr(out.Workspace)
	if err := dev.Launch(kernel, device.D1(plan.Blocks), device.D1(plan.Threads), plan.SharedBytes, s, args); err != nil {
		return fmt.Errorf("layout %v: %w", in.Shape, err)
	}
	return nil
}

// checkPointers refuses null or misaligned pointers before they reach a
// kernel, where they would fault.
func checkPointers(in LayoutInput, out LayoutOutput) error {
	elem := uintptr(8)
	if in.Int32 {
		elem = 4
	}
	type ptr struct {
		name     string
		p, align uintptr
		required bool
	}
	for _, c := range []ptr{
		{"topk_idx", in.TopK, elem, in.Tokens > 0},
		{"tokens per rank", out.TokensPerRank, 4, true},
		{"tokens per expert", out.TokensPerExpert, 4, true},
		{"is_token_in_rank", out.IsTokenInRank, 1, in.Tokens > 0},
		{"invalid count", out.Invalid, 4, false},
		{"workspace", out.Workspace, 4, true},
	} {
		switch {
		case c.p == 0 && c.required:
			return fmt.Errorf("%s pointer is null", c.name)
		case c.p%c.align != 0:
			return fmt.Errorf("%s pointer %#x is not %d-byte aligned", c.name, c.p, c.align)
		}
	}
	return nil
}

// NewLayoutWorkspace allocates a zeroed layout workspace on dev; free it
// with dev.Free.
func NewLayoutWorkspace(dev device.Device) (device.Buffer, error) {
	b, err := dev.Alloc(LayoutWorkspaceBytes)
	if err != nil {
		return device.Buffer{}, fmt.Errorf("layout workspace: %w", err)
	}
	if err := dev.CopyIn(b.Ptr, make([]byte, LayoutWorkspaceBytes)); err != nil {
		_ = dev.Free(b)
		return device.Buffer{}, fmt.Errorf("layout workspace: zero: %w", err)
	}
	return b, nil
}
