package lowlatency

import (
	"errors"
	"fmt"
	"math"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Kernel names in kernels/lowlatency.cu (module "lowlatency"); the host
// backend runs their Go twins (twins.go).
const (
	KernelDispatch = "goep_ll_dispatch"
	KernelCombine  = "goep_ll_combine"
	KernelSetMask  = "goep_ll_set_mask"
	// The same kernels compiled for the common case alone (one node,
	// expert-major, not elastic; dispatch in one format, combine with BF16
	// input): the general kernels' paths for the other cases compiled out.
	// Same parameters; Dispatch and Combine pick them unless
	// LaunchConfig.General. Measured 2.1-2.5 us faster per BF16 dispatch +
	// combine pair (EP2, H200, docs/PERFORMANCE.md session 10).
	KernelDispatchBF16  = "goep_ll_dispatch_bf16"
	KernelDispatchFP8   = "goep_ll_dispatch_fp8"
	KernelDispatchUE8M0 = "goep_ll_dispatch_ue8m0"
	KernelCombineCommon = "goep_ll_combine_fast"
)

// Kernels are every kernel a low-latency Buffer may launch (to preload).
var Kernels = []string{KernelDispatch, KernelCombine, KernelSetMask,
	KernelDispatchBF16, KernelDispatchFP8, KernelDispatchUE8M0, KernelCombineCommon}

func init() {
	kernels.Register(kernels.Module{Name: "lowlatency", File: "lowlatency.cu", Kernels: Kernels})
}

// Launch limits and defaults.
const (
	MaxThreads     = 512 // GOEP_LL_MAX_THREADS
	DefaultThreads = 512
	// DefaultSMs asks for every SM of the GPU (capped by its SM count and,
	// where ranks share it, by their spin budget): a decode step's dispatch
	// and combine have the GPU to themselves, as DeepEP's low-latency
	// kernels assume. 24 blocks left most of an H200 idle: EP4, 128 tokens,
	// hidden 7168, BF16 dispatch / combine 117 / 128 us on 24 SMs, 62 / 48 us
	// on 128 (4x H200, 2026-11-26, docs/PERFORMANCE.md).
	DefaultSMs = 1 << 10
	// hostDefaultSMs is the default grid where the device reports no SMs
	// (the host backend's twins).
	hostDefaultSMs = 24
	maxSlices      = 16
	lanes          = 32
)

// Phase selects the steps a launch runs.
type Phase int

const (
	// Send issues the rows and returns without waiting for peers' rows.
	Send Phase = 1
	// Recv waits for the peers' rows and completes the call.
	Recv Phase = 2
	// Both runs send then receive in one launch.
	Both = Send | Recv
)

// Workspace is one rank's view of a group's low-latency workspaces.
type Workspace struct {
	Layout Layout
	Rank   int
	// Base is this rank's workspace (Size bytes, IPC-shared or
	// peer-accessible, control block zero before the first launch).
	Base uintptr
	Size int
	// Peers is device memory holding u64[Ranks], every rank's workspace as
	// mapped here (0 for ranks on other nodes, which are not mapped).
	Peers uintptr
	// Ports is device memory holding goep_port_channel[Ranks]: the port
	// channel to each rank on another node (zero handles for this node's
	// ranks), whose default memories are this workspace (source) and the
	// peer's (destination), registered whole. Needed when the layout spans
	// nodes (Connect builds it), else 0.
	Ports uintptr
	// Watchdog bounds every device wait (goep_watchdog); WaitID goes into
	// timeout records.
	Watchdog uintptr
	WaitID   uint32
	// SpinBlocks caps every grid (every launch may wait on peers): ranks
	// sharing a GPU must be resident at once (channels.SpinBudget).
	SpinBlocks int
}

// Validate checks a workspace once, when it is built.
func (w *Workspace) Validate() error {
	if w == nil {
		return errors.New("lowlatency: nil workspace")
	}
	l := w.Layout
	switch {
	case l.Size == 0:
		return errors.New("lowlatency: workspace has no layout (use NewLayout)")
	case w.Rank < 0 || w.Rank >= l.Ranks:
		return fmt.Errorf("lowlatency: rank %d of %d", w.Rank, l.Ranks)
	case w.Size < l.Size:
		return fmt.Errorf("lowlatency: workspace of %d bytes is smaller than its layout (%d bytes)", w.Size, l.Size)
	case w.Base == 0 || w.Base%regionAlign != 0:
		return fmt.Errorf("lowlatency: workspace pointer %#x: want non-null, %d-byte aligned", w.Base, regionAlign)
	case w.Peers == 0 || w.Peers%8 != 0:
		return fmt.Errorf("lowlatency: peer table pointer %#x: want non-null, 8-byte aligned", w.Peers)
	case w.Watchdog == 0 || w.Watchdog%8 != 0:
		return fmt.Errorf("lowlatency: watchdog pointer %#x: want non-null, 8-byte aligned", w.Watchdog)
	case l.NodeCount() > 1 && (w.Ports == 0 || w.Ports%8 != 0):
		return fmt.Errorf("lowlatency: a group across %d nodes needs port channels (Workspace.Ports %#x: want non-null, 8-byte aligned)", l.NodeCount(), w.Ports)
	}
	return nil
}

// LaunchConfig sizes a launch; the zero value is the default.
type LaunchConfig struct {
	NumSMs  int // grid cap; 0: DefaultSMs, every SM (a default shrinks to SpinBlocks; a given grid above it is refused)
	Threads int // per block, multiple of 32 up to MaxThreads; 0: DefaultThreads
	// General runs the general kernels even where a specialised one
	// applies (tests of the general kernels' common path, A/B).
	General bool
}

func (w *Workspace) resolve(dev device.Device, c LaunchConfig) (blocks, threads int, err error) {
	threads = c.Threads
	if threads == 0 {
		threads = DefaultThreads
	}
	if threads < lanes || threads > MaxThreads || threads%lanes != 0 {
		return 0, 0, fmt.Errorf("%d threads per block: want a multiple of 32 in 32..%d", threads, MaxThreads)
	}
	blocks = c.NumSMs
	if blocks == 0 {
		blocks = DefaultSMs
		if dev.Info().SMs <= 0 {
			blocks = hostDefaultSMs
		}
		if w.SpinBlocks > 0 {
			blocks = min(blocks, w.SpinBlocks)
		}
	}
	if blocks < 1 {
		return 0, 0, fmt.Errorf("%d SMs", c.NumSMs)
	}
	if sms := dev.Info().SMs; sms > 0 && blocks > sms {
		blocks = sms
	}
	if w.SpinBlocks > 0 && blocks > w.SpinBlocks {
		// Every block of every rank sharing the GPU must be resident.
		return 0, 0, fmt.Errorf("%d blocks exceed the spin budget of %d blocks (ranks sharing a GPU must all be resident)",
			blocks, w.SpinBlocks)
	}
	return blocks, threads, nil
}

// slices cuts rows into slices of whole 32-chunk rounds so that about
// warps warps have work when there are few units.
func slices(units, warps, rounds int) int {
	if units <= 0 {
		return 1
	}
	s := (warps + units - 1) / units
	return max(1, min(s, rounds, maxSlices))
}

func (w *Workspace) set(set int) (*SetRegions, error) {
	if set < 0 || set >= Sets {
		return nil, fmt.Errorf("buffer set %d: want 0..%d", set, Sets-1)
	}
	return &w.Layout.Set[set], nil
}

// DispatchArgs are the inputs of a dispatch launch.
type DispatchArgs struct {
	// Set is the buffer set (0 or 1); consecutive calls alternate.
	Set int
	// X is BF16 [Tokens][Hidden], 16-byte aligned.
	X uintptr
	// TopK is [Tokens][TopK] int64 (IDs64) or int32 ids, -1 = none; ids
	// outside [-1, Experts) are ignored and counted (InvalidPtr).
	TopK  uintptr
	IDs64 bool
	// Weights is float32 [Tokens][TopK], optional (weights of 1); combine
	// applies them.
	Weights uintptr
	Tokens  int
	Format  Format
	// RankMajor leaves the rows in the staging layout [R][MaxTokens]
	// (RankMajorViews) instead of expanding them per expert.
	RankMajor bool
	Phase     Phase
	// Elastic masks a peer that does not arrive within the watchdog's
	// timeout instead of failing the call.
	Elastic bool
}

// Dispatch enqueues a dispatch step (or both) on s; every rank launches
// the same steps on the same set.
func (w *Workspace) Dispatch(dev device.Device, s device.Stream, a DispatchArgs, cfg LaunchConfig) error {
	if dev == nil || w == nil {
		return errors.New("lowlatency: dispatch: nil device or workspace")
	}
	l := w.Layout
	sr, err := w.set(a.Set)
	if err != nil {
		return fmt.Errorf("lowlatency: dispatch: %w", err)
	}
	switch {
	case a.Phase < Send || a.Phase > Both:
		return fmt.Errorf("lowlatency: dispatch: phase %d", a.Phase)
	case a.Tokens < 0 || a.Tokens > l.MaxTokens:
		return fmt.Errorf("lowlatency: dispatch: %d tokens: the workspace takes 0..%d", a.Tokens, l.MaxTokens)
	case a.Format < BF16 || a.Format > UE8M0:
		return fmt.Errorf("lowlatency: dispatch: unknown %v", a.Format)
	case a.Format.Quantized() && !l.FP8:
		return fmt.Errorf("lowlatency: dispatch: %v needs a workspace with FP8 scale regions (Config.FP8)", a.Format)
	case a.Phase&Send != 0 && a.Tokens > 0 && (a.X == 0 || a.X%16 != 0 || a.TopK == 0):
		return errors.New("lowlatency: dispatch: x must be non-null and 16-byte aligned, top-k ids non-null")
	}
	blocks, threads, err := w.resolve(dev, cfg)
	if err != nil {
		return fmt.Errorf("lowlatency: dispatch: %w", err)
	}
	warps := threads / lanes
	rounds := (l.Hidden/8 + lanes - 1) / lanes
	sl := slices(a.Tokens, blocks*warps, rounds)
	if int64(a.Tokens)*int64(sl) > math.MaxInt32 {
		return fmt.Errorf("lowlatency: dispatch: %d tokens x %d slices overflow 32-bit units", a.Tokens, sl)
	}
	args := device.NewArgs(42).Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).
		U64(uint64(sr.StageX.Offset)).U64(uint64(sr.StageS.Offset)).U64(uint64(sr.StageIDs.Offset)).U64(uint64(sr.StageW.Offset)).
		U64(uint64(sr.RecvX.Offset)).U64(uint64(sr.RecvS.Offset)).U64(uint64(sr.RecvSrc.Offset)).U64(uint64(sr.RecvRange.Offset)).
		U64(uint64(sr.RecvCount.Offset)).U64(uint64(sr.TabPos.Offset)).U64(uint64(sr.TabW.Offset)).U64(uint64(sr.TabT.Offset)).
		U64(uint64(sr.TabRow.Offset)).U64(uint64(sr.OwnMask.Offset)).
		Ptr(a.X).Ptr(a.TopK).I32(b2i(a.IDs64)).Ptr(a.Weights).
		I32(int32(a.Tokens)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.LocalExperts)).
		I32(int32(l.MaxTokens)).I32(int32(l.Hidden)).I32(int32(a.Format)).I32(b2i(a.RankMajor)).I32(int32(a.Set)).
		I32(int32(a.Phase)).I32(b2i(a.Elastic)).I32(int32(sl)).Ptr(w.Watchdog).U32(w.WaitID).
		Ptr(w.Ports).U32(l.NodeMask(w.Rank)).U64(uint64(sr.SendX.Offset)).U64(uint64(sr.SendS.Offset)).
		U64(uint64(sr.SendIDs.Offset)).U64(uint64(sr.SendW.Offset))
	if err := dev.Launch(w.dispatchKernel(a, cfg), device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return fmt.Errorf("lowlatency: dispatch: %w", err)
	}
	return nil
}

// CombineArgs are the inputs of a combine launch.
type CombineArgs struct {
	// Set is the buffer set of the dispatch being combined.
	Set int
	// Tokens is that dispatch's token count on this rank.
	Tokens int
	// Y is the expert outputs: BF16 [LocalExperts][Slots][Hidden] (or FP8
	// bytes with YScales f32 [LocalExperts][Slots][Hidden/128] when YFP8),
	// row le*Slots+i = expert le's output for its received row i. RankMajor:
	// BF16 [Ranks][MaxTokens][Hidden], row s*MaxTokens+t for token t of
	// source s. Any device memory of this rank (CombineBuffer is the
	// zero-copy place); 16-byte aligned.
	Y       uintptr
	YScales uintptr
	YFP8    bool
	// Out is BF16 [Tokens][Hidden], 16-byte aligned.
	Out       uintptr
	RankMajor bool
	Phase     Phase
	Elastic   bool
}

// Combine enqueues a combine step (or both) on s.
func (w *Workspace) Combine(dev device.Device, s device.Stream, a CombineArgs, cfg LaunchConfig) error {
	if dev == nil || w == nil {
		return errors.New("lowlatency: combine: nil device or workspace")
	}
	l := w.Layout
	sr, err := w.set(a.Set)
	if err != nil {
		return fmt.Errorf("lowlatency: combine: %w", err)
	}
	switch {
	case a.Phase < Send || a.Phase > Both:
		return fmt.Errorf("lowlatency: combine: phase %d", a.Phase)
	case a.Tokens < 0 || a.Tokens > l.MaxTokens:
		return fmt.Errorf("lowlatency: combine: %d tokens: the workspace takes 0..%d", a.Tokens, l.MaxTokens)
	case a.YFP8 && (!l.FP8 || a.RankMajor || a.YScales == 0):
		return errors.New("lowlatency: combine: FP8 input needs an expert-major layout, scales and a workspace with FP8 regions")
	case a.Phase&Send != 0 && (a.Y == 0 || a.Y%16 != 0):
		return errors.New("lowlatency: combine: y must be non-null and 16-byte aligned")
	case a.Phase&Recv != 0 && a.Tokens > 0 && (a.Out == 0 || a.Out%16 != 0):
		return errors.New("lowlatency: combine: out must be non-null and 16-byte aligned")
	}
	blocks, threads, err := w.resolve(dev, cfg)
	if err != nil {
		return fmt.Errorf("lowlatency: combine: %w", err)
	}
	warps := threads / lanes
	rounds := (l.Hidden/8 + lanes - 1) / lanes
	// Units: the send step walks every (source, token) slot, the receive
	// step this rank's tokens; slices fill the warps for the smaller one.
	sl := slices(a.Tokens, blocks*warps, rounds)
	if int64(l.Slots())*int64(sl) > math.MaxInt32 {
		return fmt.Errorf("lowlatency: combine: %d slots x %d slices overflow 32-bit units", l.Slots(), sl)
	}
	args := device.NewArgs(28).Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).
		U64(uint64(sr.TabPos.Offset)).U64(uint64(sr.TabW.Offset)).U64(uint64(sr.TabT.Offset)).U64(uint64(sr.OwnMask.Offset)).
		U64(uint64(sr.CStage.Offset)).Ptr(a.Y).Ptr(a.YScales).I32(b2i(a.YFP8)).Ptr(a.Out).
		I32(int32(a.Tokens)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.LocalExperts)).
		I32(int32(l.MaxTokens)).I32(int32(l.Hidden)).I32(b2i(a.RankMajor)).I32(int32(a.Set)).
		I32(int32(a.Phase)).I32(b2i(a.Elastic)).I32(int32(sl)).Ptr(w.Watchdog).U32(w.WaitID).
		Ptr(w.Ports).U32(l.NodeMask(w.Rank)).U64(uint64(sr.CSend.Offset))
	if err := dev.Launch(w.combineKernel(a, cfg), device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return fmt.Errorf("lowlatency: combine: %w", err)
	}
	return nil
}

// common reports whether a call is the case the specialised kernels were
// compiled for: one node (no port channels), expert-major, not elastic.
func (w *Workspace) common(rankMajor, elastic bool, cfg LaunchConfig) bool {
	return !cfg.General && !rankMajor && !elastic && w.Layout.NodeCount() == 1
}

// dispatchKernel is the kernel a dispatch launches.
func (w *Workspace) dispatchKernel(a DispatchArgs, cfg LaunchConfig) string {
	if !w.common(a.RankMajor, a.Elastic, cfg) {
		return KernelDispatch
	}
	switch a.Format {
	case FP8:
		return KernelDispatchFP8
	case UE8M0:
		return KernelDispatchUE8M0
	default:
		return KernelDispatchBF16
	}
}

// combineKernel is the kernel a combine launches.
func (w *Workspace) combineKernel(a CombineArgs, cfg LaunchConfig) string {
	if !w.common(a.RankMajor, a.Elastic, cfg) || a.YFP8 {
		return KernelCombine
	}
	return KernelCombineCommon
}

// MaskOp says how SetMask changes the mask.
type MaskOp int

const (
	MaskSet    MaskOp = 0 // the mask becomes value
	MaskAdd    MaskOp = 1 // ranks in value become masked
	MaskRemove MaskOp = 2 // ranks in value become active
)

// SetMask enqueues a mask update on s (stream-ordered, graph-capturable):
// bit r of value names rank r.
func (w *Workspace) SetMask(dev device.Device, s device.Stream, op MaskOp, value uint32) error {
	if dev == nil || w == nil {
		return errors.New("lowlatency: mask: nil device or workspace")
	}
	if op < MaskSet || op > MaskRemove {
		return fmt.Errorf("lowlatency: mask: op %d", op)
	}
	if value>>uint(w.Layout.Ranks) != 0 {
		return fmt.Errorf("lowlatency: mask %#x names ranks outside the world of %d", value, w.Layout.Ranks)
	}
	args := device.NewArgs(3).Ptr(w.MaskPtr()).U32(value).I32(int32(op))
	if err := dev.Launch(KernelSetMask, device.D1(1), device.D1(lanes), 0, s, args); err != nil {
		return fmt.Errorf("lowlatency: mask: %w", err)
	}
	return nil
}

// InvalidPtr is the device address of set's u32 count of top-k ids outside
// [-1, Experts) in the last completed dispatch on that set (ignored by the
// kernels, as -1).
func (w *Workspace) InvalidPtr(set int) uintptr {
	if w == nil {
		return 0
	}
	return w.Base + uintptr(w.Layout.Ctrl.Offset+CtrlInvalidOut+4*(set&1))
}

// MaskPtr is the device address of this rank's mask word (u32, bit r set =
// rank r masked; kernels may add ranks that time out in elastic calls).
func (w *Workspace) MaskPtr() uintptr {
	if w == nil {
		return 0
	}
	return w.Base + uintptr(w.Layout.Ctrl.Offset+CtrlMask)
}

// RecvViews are a set's expert-major dispatch outputs (valid until the
// next dispatch receive on the same set).
type RecvViews struct {
	X           uintptr // [LocalExperts][Slots] rows: BF16 (2*Hidden bytes) or FP8 (Hidden bytes)
	Scales      uintptr // FP8: f32 [LocalExperts][Slots][Hidden/128]; UE8M0: u32 [LocalExperts][Slots][PackedScalesPerRow]
	SrcInfo     uintptr // i32 [LocalExperts][Slots]: token index at the source
	LayoutRange uintptr // i64 [LocalExperts][Ranks]: begin | count<<32 of each source's rows
	Count       uintptr // i32 [LocalExperts]: rows of each local expert
}

// Recv returns set's expert-major views.
func (w *Workspace) Recv(set int) RecvViews {
	if w == nil {
		return RecvViews{}
	}
	sr := &w.Layout.Set[set&1]
	at := func(r Region) uintptr { return w.Base + uintptr(r.Offset) }
	v := RecvViews{X: at(sr.RecvX), SrcInfo: at(sr.RecvSrc), LayoutRange: at(sr.RecvRange), Count: at(sr.RecvCount)}
	if w.Layout.FP8 {
		v.Scales = at(sr.RecvS)
	}
	return v
}

// RankMajorViews are a set's rank-major dispatch outputs (valid until the
// combine of the same set: peers write them again after it).
type RankMajorViews struct {
	X       uintptr // [Ranks][MaxTokens] rows of 2*Hidden bytes (FP8: the first Hidden bytes)
	Scales  uintptr // f32 [Ranks][MaxTokens][Hidden/128] (FP8 and UE8M0 alike)
	IDs     uintptr // i32 [Ranks][MaxTokens][TopK]: local expert ids, -1 elsewhere
	Weights uintptr // f32 [Ranks][MaxTokens][TopK]
	Tokens  uintptr // i32 [Ranks]: tokens of each source (rows t < Tokens[s] hold ids)
}

// RankMajor returns set's rank-major views.
func (w *Workspace) RankMajor(set int) RankMajorViews {
	if w == nil {
		return RankMajorViews{}
	}
	sr := &w.Layout.Set[set&1]
	at := func(r Region) uintptr { return w.Base + uintptr(r.Offset) }
	v := RankMajorViews{X: at(sr.StageX), IDs: at(sr.StageIDs), Weights: at(sr.StageW), Tokens: at(sr.TabT)}
	if w.Layout.FP8 {
		v.Scales = at(sr.StageS)
	}
	return v
}

// CombineBuffer is set's zero-copy combine input: BF16
// [LocalExperts][Slots][Hidden] (X) and f32 scales for an FP8 input (S).
type CombineBuffer struct{ X, S uintptr }

// CombineBuffer returns set's combine input region.
func (w *Workspace) CombineBuffer(set int) CombineBuffer {
	if w == nil {
		return CombineBuffer{}
	}
	sr := &w.Layout.Set[set&1]
	v := CombineBuffer{X: w.Base + uintptr(sr.CombineX.Offset)}
	if w.Layout.FP8 {
		v.S = w.Base + uintptr(sr.CombineS.Offset)
	}
	return v
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
