package intranode

import (
	"fmt"
	"math"

	"github.com/goep-dev/goep/kernels"
)

// Kernel names in kernels/intranode.cu (module "intranode"); the host
// backend runs their Go twins (twins.go).
const (
	KernelNotify   = "goep_intranode_notify"
	KernelDispatch = "goep_intranode_dispatch"
	KernelCombine  = "goep_intranode_combine"
	// KernelDispatchWide is dispatch built for 512-thread blocks: twice the
	// 16-byte loads in flight per lane, and the next round's loads issued
	// before this round's stores (LaunchConfig.Copy = CopyWide).
	KernelDispatchWide = "goep_intranode_dispatch_wide"
	// KernelDispatchTMA is dispatch through the bulk-copy engine (module
	// "intranode_tma"; LaunchConfig.Copy = CopyTMA). Built with NVRTC < 12
	// it runs the plain body.
	KernelDispatchTMA = "goep_intranode_dispatch_tma"
	// KernelCopyRows stages a combine input that lies outside the workspace
	// into the combine input region, sized on the device by the handle's
	// received count.
	KernelCopyRows = "goep_intranode_copy_rows"
)

func init() {
	kernels.Register(kernels.Module{Name: "intranode", File: "intranode.cu",
		Kernels: []string{KernelNotify, KernelDispatch, KernelDispatchWide, KernelCombine, KernelCopyRows}})
	// The TMA variant is a module of its own, so that a toolchain that
	// rejects its bulk-copy PTX costs that variant only.
	kernels.Register(kernels.Module{Name: "intranode_tma", File: "intranode_tma.cu", Kernels: []string{KernelDispatchTMA}})
}

// Limits of the v1 kernels (kernels/intranode.cuh, intranode.cu).
const (
	MaxRanks   = 8    // one NVLink domain; destination masks are 8 bits
	MaxTopK    = 32   // one lane per top-k slot
	MaxExperts = 4096 // notify counts experts in shared memory
	// MaxHidden bounds the row length (elements): row bytes are int32 on
	// the device, and every region size (rows x MaxRecv, MaxRecv < 2^31)
	// then fits an int64 with room to spare.
	MaxHidden = 1 << 24
	// BF16 rows move as 16-byte vectors: hidden must be a multiple of 8.
	HiddenMultiple = 8
	// FP8 scales cover 128 elements each: FP8 hidden must be a multiple of 128.
	FP8Block = 128

	NotifyMaxThreads       = 1024
	DispatchMaxThreads     = 1024
	DispatchWideMaxThreads = 512
	DispatchTMAMaxThreads  = 1024
	CombineMaxThreads      = 512
	CopyMaxThreads         = 512
	// TMAMaxStages bounds the staging buffers per warp of the TMA dispatch.
	TMAMaxStages = 4
)

// The control block at the start of every workspace (intranode.cuh). It must
// be zero when the workspace is first used; kernels never clear it.
const (
	CtrlEpoch      = 0   // u64[kind]: launches completed (this rank only)
	CtrlArrive     = 128 // u64[kind][src] at CtrlArrive + kind*CtrlKindStride
	CtrlEntered    = 512 // u64[kind][src] at CtrlEntered + kind*CtrlKindStride
	CtrlKindStride = 128
	// CtrlCombineInput holds, per source rank src at CtrlCombineInput +
	// src*CtrlCombineInputStride, {u64 y offset, u64 weights offset}: where
	// src's combine input lies in src's own workspace (NoOffset: no
	// weights), written by src before its combine entry flag.
	CtrlCombineInput       = 896
	CtrlCombineInputStride = 16
	// CtrlPublished holds, per source rank src at CtrlPublished + 16*src,
	// src's published call fingerprint as an LL16 packet {fp low, n, fp
	// high, n} flagged with the low 32 bits of src's launch number: written
	// by the device kernels only off the fast path (fingerprint.go).
	CtrlPublished = 1024
	CtrlBytes     = 1152

	KindNotify   = 0
	KindDispatch = 1
	KindCombine  = 2

	// ArrivalUnit is what one rank's launch adds, in total over its blocks,
	// to each peer's arrive[kind][rank].
	ArrivalUnit = 1 << 20
)

// NoOffset in a combine input descriptor: no weights.
const NoOffset = ^uint64(0)

// EpochOffset is the byte offset of epoch[kind] in the control block.
func EpochOffset(kind int) int { return CtrlEpoch + 8*kind }

// ArriveOffset is the byte offset of arrive[kind][src] in the control block.
func ArriveOffset(kind, src int) int { return CtrlArrive + kind*CtrlKindStride + 8*src }

// EnteredOffset is the byte offset of entered[kind][src] in the control block.
func EnteredOffset(kind, src int) int { return CtrlEntered + kind*CtrlKindStride + 8*src }

// CombineInputOffset is the byte offset of source src's combine input
// descriptor {y offset, weights offset} in the control block.
func CombineInputOffset(src int) int { return CtrlCombineInput + CtrlCombineInputStride*src }

// Stages named in timeout records (goep_timeout_record.stage).
const (
	StageNotifyBarrier   = 1 // notify: waiting for a peer's counts
	StageDispatchEntry   = 2 // dispatch: waiting for a peer to enter the same dispatch
	StageDispatchArrival = 3 // dispatch: waiting for a peer's rows to arrive
	StageCombineEntry    = 4 // combine: waiting for a peer to enter the same combine (its input ready)
	StageCombineArrival  = 5 // combine: waiting for a peer to finish reading this rank's input
	// StageMismatch in a watchdog record is not a timeout: a peer's call
	// fingerprint differed (Expected = own, Observed = the peer's; see
	// fingerprint.go).
	StageMismatch         = 6
	firstStage, lastStage = StageNotifyBarrier, StageMismatch
)

// StageName says what a stage waited for.
func StageName(stage uint32) string {
	names := [...]string{"notify barrier", "dispatch entry", "dispatch arrival", "combine entry",
		"combine arrival (peers reading this rank's input)", "call fingerprint check"}
	if stage >= firstStage && stage <= lastStage {
		return names[stage-1]
	}
	return fmt.Sprintf("unknown stage %d", stage)
}

// Config sizes one workspace. Every rank of a group uses the same Config.
type Config struct {
	Ranks        int  // 1..MaxRanks
	MaxTokens    int  // most tokens any rank dispatches in one call
	Hidden       int  // multiple of HiddenMultiple (FP8: of FP8Block)
	TopK         int  // 1..MaxTopK
	LocalExperts int  // experts per rank; Ranks*LocalExperts <= MaxExperts
	FP8          bool // reserve the FP8 scales region
}

// Experts is the global expert count.
func (c Config) Experts() int { return c.Ranks * c.LocalExperts }

// MaxRecv is the most rows a rank can receive: every rank sends it every
// token.
func (c Config) MaxRecv() int { return c.Ranks * c.MaxTokens }

// Validate checks c against the kernels' limits.
func (c Config) Validate() error {
	switch {
	case c.Ranks < 1 || c.Ranks > MaxRanks:
		return fmt.Errorf("intranode: %d ranks: intranode kernels take 1..%d", c.Ranks, MaxRanks)
	case c.MaxTokens < 1:
		return fmt.Errorf("intranode: max tokens %d: want >= 1", c.MaxTokens)
	case c.Hidden > MaxHidden:
		return fmt.Errorf("intranode: hidden %d: at most %d", c.Hidden, MaxHidden)
	case c.Hidden < HiddenMultiple || c.Hidden%HiddenMultiple != 0:
		return fmt.Errorf("intranode: hidden %d: want a positive multiple of %d (rows move as 16-byte vectors)", c.Hidden, HiddenMultiple)
	case c.FP8 && c.Hidden%FP8Block != 0:
		return fmt.Errorf("intranode: FP8 needs hidden %% %d == 0, got %d", FP8Block, c.Hidden)
	case c.TopK < 1 || c.TopK > MaxTopK:
		return fmt.Errorf("intranode: top-k %d: want 1..%d", c.TopK, MaxTopK)
	case c.LocalExperts < 1:
		return fmt.Errorf("intranode: %d local experts: want >= 1", c.LocalExperts)
	case c.Experts() > MaxExperts:
		return fmt.Errorf("intranode: %d experts: the notify kernel takes at most %d", c.Experts(), MaxExperts)
	}
	// Row indices and counts are int32 on the device.
	if int64(c.MaxRecv()) > math.MaxInt32 || int64(c.MaxTokens)*int64(c.Ranks) > math.MaxInt32 {
		return fmt.Errorf("intranode: %d ranks x %d tokens overflow 32-bit row indices", c.Ranks, c.MaxTokens)
	}
	return nil
}

// Region is a byte range of a workspace.
type Region struct{ Offset, Size int }

// End is the first byte after r.
func (r Region) End() int { return r.Offset + r.Size }

func (r Region) String() string { return fmt.Sprintf("[%#x, %#x)", r.Offset, r.End()) }

// Layout places every region of a workspace, sized for the worst case (a
// rank receives every token of every rank). Offsets are the same in every
// rank's workspace, so a kernel reaches region X of peer d at
// peers[d] + X.Offset.
type Layout struct {
	Config

	// Control block: epochs, arrival counters, entry flags. Zero it once
	// when the workspace is created.
	Ctrl Region
	// Count exchange of notify, two parities: Counts is int32[2][R][R]
	// (row s: what rank s sends to each rank), ExpertCounts is
	// int32[2][R][LocalExperts] (entries of source s for each local expert).
	Counts, ExpertCounts Region

	// Receive region (dispatch output, valid until the next dispatch):
	// RecvX holds BF16 rows [MaxRecv][Hidden] (2*Hidden bytes each) or FP8
	// rows [MaxRecv][Hidden] (Hidden bytes each, packed); RecvScales
	// float32[MaxRecv][Hidden/128] (FP8 only, else empty); RecvSrcToken
	// int32[MaxRecv]; RecvTopK int64[MaxRecv][TopK]; RecvWeights
	// float32[MaxRecv][TopK].
	RecvX, RecvScales, RecvSrcToken, RecvTopK, RecvWeights Region

	// Combine input region (Workspace.CombineInput): CombineX holds BF16
	// rows [MaxRecv][Hidden], CombineWeights float32 [MaxRecv][TopK]. A
	// rank's combine input must lie in its workspace, because the owners of
	// the tokens read it over NVLink; an engine writes its expert outputs
	// here (or into RecvX, in place), and Combine stages an input that lies
	// elsewhere into this region first.
	CombineX, CombineWeights Region

	// A handle's device part, for callers that keep one handle per
	// workspace (Workspace.DefaultHandle): SendPos int32[MaxTokens][Ranks],
	// RankPrefix int32[Ranks], RecvBase int32[Ranks], NumRecv int32[1].
	SendPos, RankPrefix, RecvBase, NumRecv Region

	// Size is the workspace size in bytes.
	Size int
}

// Alignment of every region (16 would do for the kernels; 256 keeps rows of
// different regions off shared cache lines and matches allocator alignment).
const regionAlign = 256

// NewLayout computes the workspace layout for c.
func NewLayout(c Config) (Layout, error) {
	if err := c.Validate(); err != nil {
		return Layout{}, err
	}
	l := Layout{Config: c}
	off := 0
	place := func(size int) Region {
		r := Region{Offset: off, Size: size}
		off += (size + regionAlign - 1) / regionAlign * regionAlign
		return r
	}
	r, n, k, h := c.Ranks, c.MaxRecv(), c.TopK, c.Hidden
	l.Ctrl = place(CtrlBytes)
	l.Counts = place(4 * 2 * r * r)
	l.ExpertCounts = place(4 * 2 * r * c.LocalExperts)
	l.RecvX = place(2 * h * n)
	if c.FP8 {
		l.RecvScales = place(4 * (h / FP8Block) * n)
	} else {
		l.RecvScales = Region{Offset: off}
	}
	l.RecvSrcToken = place(4 * n)
	l.RecvTopK = place(8 * k * n)
	l.RecvWeights = place(4 * k * n)
	l.CombineX = place(2 * h * n)
	l.CombineWeights = place(4 * k * n)
	l.SendPos = place(4 * c.MaxTokens * r)
	l.RankPrefix = place(4 * r)
	l.RecvBase = place(4 * r)
	l.NumRecv = place(4)
	l.Size = off
	return l, nil
}

// Regions lists the regions by name, in address order.
func (l Layout) Regions() []NamedRegion {
	return []NamedRegion{
		{"ctrl", l.Ctrl}, {"counts", l.Counts}, {"expert counts", l.ExpertCounts},
		{"recv x", l.RecvX}, {"recv scales", l.RecvScales}, {"recv src token", l.RecvSrcToken},
		{"recv topk", l.RecvTopK}, {"recv weights", l.RecvWeights},
		{"combine input x", l.CombineX}, {"combine input weights", l.CombineWeights},
		{"send pos", l.SendPos}, {"rank prefix", l.RankPrefix}, {"recv base", l.RecvBase}, {"num recv", l.NumRecv},
	}
}

// NamedRegion is a region with its name.
type NamedRegion struct {
	Name string
	Region
}

// ScalesPerRow is Hidden/128 for FP8 rows.
func (c Config) ScalesPerRow() int { return c.Hidden / FP8Block }

// RowBytes is the size of one received row: 2*Hidden (BF16) or Hidden (FP8).
func (c Config) RowBytes(fp8 bool) int {
	if fp8 {
		return c.Hidden
	}
	return 2 * c.Hidden
}
