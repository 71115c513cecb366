package lowlatency

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// Limits of the kernels (kernels/lowlatency.cu).
const (
	// MaxRanks bounds the group: destination and rank masks are 32 bits.
	MaxRanks = 32
	// MaxRanksPerNode bounds a node to one NVLink domain (ranks of a node
	// store into each other's workspaces).
	MaxRanksPerNode = 8
	MaxTopK         = 32   // one lane per top-k slot
	MaxExperts      = 4096 // local expert ids and flat rows fit 32 bits easily below this
	// BF16 rows move as 16-byte vectors.
	HiddenMultiple = 8
	// FP8 scales cover 128 elements each.
	FP8Block = 128
	// Sets is the number of alternating buffer sets.
	Sets = 2
)

// Format is the element format of dispatched rows.
type Format int

const (
	// BF16 rows are sent as they are.
	BF16 Format = iota
	// FP8 casts each row to E4M3 inside the kernel with one f32 scale per
	// 128 elements: scale = max(amax, 1e-4) / 448.
	FP8
	// UE8M0 is FP8 with each scale rounded up to a power of two (DeepGEMM's
	// UE8M0 scales), delivered packed: four exponent bytes a 32-bit word.
	UE8M0
)

func (f Format) String() string {
	switch f {
	case BF16:
		return "bf16"
	case FP8:
		return "fp8"
	case UE8M0:
		return "ue8m0"
	}
	return fmt.Sprintf("format %d", int(f))
}

// Quantized says whether rows of f are FP8 bytes.
func (f Format) Quantized() bool { return f == FP8 || f == UE8M0 }

// Config sizes one low-latency workspace; every rank of a group uses the
// same Config.
type Config struct {
	Ranks        int // 1..MaxRanks
	MaxTokens    int // most tokens any rank dispatches in one call
	Hidden       int // multiple of HiddenMultiple (FP8/UE8M0 need a multiple of FP8Block)
	TopK         int // 1..MaxTopK
	LocalExperts int // experts per rank
	// FP8 reserves the scale regions (needed by FP8 and UE8M0 dispatch and
	// by FP8 combine input).
	FP8 bool
	// Nodes the group spans (0 means 1): nodes of Ranks/Nodes consecutive
	// ranks (rank r on node r / RanksPerNode()). Ranks of one node store
	// into each other's workspaces; rows for a rank on another node go
	// into this rank's send regions and over a port channel, one put per
	// region and destination a call (Workspace.Ports).
	Nodes int
}

// NodeCount is Nodes, at least 1.
func (c Config) NodeCount() int { return max(c.Nodes, 1) }

// RanksPerNode is the ranks of each node.
func (c Config) RanksPerNode() int { return c.Ranks / c.NodeCount() }

// NodeMask is the ranks on rank's node (bit r = rank r): reached by direct
// stores; every other rank through a port channel.
func (c Config) NodeMask(rank int) uint32 {
	p := c.RanksPerNode()
	if p < 1 || rank < 0 || rank >= c.Ranks {
		return 0
	}
	first := rank / p * p
	return uint32((uint64(1)<<uint(p) - 1) << uint(first))
}

// Experts is the global expert count.
func (c Config) Experts() int { return c.Ranks * c.LocalExperts }

// Slots is the rows per local expert in the expert-major layout: every
// rank may send every token.
func (c Config) Slots() int { return c.Ranks * c.MaxTokens }

// ScalesPerRow is Hidden/128 (FP8).
func (c Config) ScalesPerRow() int { return c.Hidden / FP8Block }

// PackedScalesPerRow is the 32-bit words of UE8M0 exponents a row:
// ceil(Hidden/128 / 4).
func (c Config) PackedScalesPerRow() int { return (c.ScalesPerRow() + 3) / 4 }

// RowBytes is a received row's size in format f: 2*Hidden (BF16) or Hidden.
func (c Config) RowBytes(f Format) int {
	if f.Quantized() {
		return c.Hidden
	}
	return 2 * c.Hidden
}

// Validate checks c against the kernels' limits.
func (c Config) Validate() error {
	switch {
	case c.Ranks < 1 || c.Ranks > MaxRanks:
		return fmt.Errorf("lowlatency: %d ranks: the kernels take 1..%d", c.Ranks, MaxRanks)
	case c.Nodes < 0 || c.Ranks%c.NodeCount() != 0:
		return fmt.Errorf("lowlatency: %d ranks do not split into %d nodes", c.Ranks, c.Nodes)
	case c.RanksPerNode() > MaxRanksPerNode:
		return fmt.Errorf("lowlatency: %d ranks per node: at most %d (one NVLink domain)", c.RanksPerNode(), MaxRanksPerNode)
	case c.MaxTokens < 1:
		return fmt.Errorf("lowlatency: max tokens %d: want >= 1", c.MaxTokens)
	case c.Hidden < HiddenMultiple || c.Hidden%HiddenMultiple != 0:
		return fmt.Errorf("lowlatency: hidden %d: want a positive multiple of %d", c.Hidden, HiddenMultiple)
	case c.FP8 && c.Hidden%FP8Block != 0:
		return fmt.Errorf("lowlatency: FP8 needs hidden %% %d == 0, got %d", FP8Block, c.Hidden)
	case c.TopK < 1 || c.TopK > MaxTopK:
		return fmt.Errorf("lowlatency: top-k %d: want 1..%d", c.TopK, MaxTopK)
	case c.LocalExperts < 1:
		return fmt.Errorf("lowlatency: %d local experts: want >= 1", c.LocalExperts)
	case c.Experts() > MaxExperts:
		return fmt.Errorf("lowlatency: %d experts: at most %d", c.Experts(), MaxExperts)
	}
	// Flat rows (local expert x slot) and token indices are int32 on the
	// device.
	if int64(c.LocalExperts)*int64(c.Slots()) > math.MaxInt32 {
		return fmt.Errorf("lowlatency: %d local experts x %d ranks x %d tokens overflow 32-bit row indices",
			c.LocalExperts, c.Ranks, c.MaxTokens)
	}
	return nil
}

// Region is a byte range of a workspace.
type Region struct{ Offset, Size int }

// End is the first byte after r.
func (r Region) End() int { return r.Offset + r.Size }

func (r Region) String() string { return fmt.Sprintf("[%#x, %#x)", r.Offset, r.End()) }

// SetRegions are the regions of one buffer set. Senders write only the
// staging regions (Stage*) of their peers and CStage; everything else is
// written by the rank itself.
type SetRegions struct {
	// Dispatch staging, written by the sources: StageX [R][MaxTokens] rows
	// of 2*Hidden bytes (FP8 rows use the first Hidden), StageS f32
	// [R][MaxTokens][Hidden/128], StageIDs i32 [R][MaxTokens][TopK] (local
	// expert ids at this rank, -1 elsewhere), StageW f32
	// [R][MaxTokens][TopK]. Row (s, t) is token t of source s: one row per
	// destination rank whatever the number of its experts there.
	StageX, StageS, StageIDs, StageW Region
	// Expert-major receive outputs: RecvX [LocalExperts][Slots] rows
	// (2*Hidden bytes BF16, Hidden bytes FP8, dense), RecvS f32
	// [LocalExperts][Slots][Hidden/128] or, UE8M0, u32
	// [LocalExperts][Slots][PackedScalesPerRow], RecvSrc i32
	// [LocalExperts][Slots] (token index at the source), RecvRange i64
	// [LocalExperts][R] (begin | count<<32), RecvCount i32 [LocalExperts].
	RecvX, RecvS, RecvSrc, RecvRange, RecvCount Region
	// Local tables the receive step writes for combine: TabPos i32
	// [R][MaxTokens][TopK] (flat expert-major row le*Slots+pos of each local
	// top-k entry, -1 for entries elsewhere; rank-major: 0), TabW f32
	// [R][MaxTokens][TopK], TabT i32 [R] (tokens of each source, 0 when
	// masked), TabRow i32 [LocalExperts][Slots] (s*MaxTokens+t of each row).
	TabPos, TabW, TabT, TabRow Region
	// OwnMask u32 [MaxTokens]: destination ranks of each own token (the
	// dispatch's send step writes it; combine reads it).
	OwnMask Region
	// Combine staging, written by the expert ranks: CStage BF16
	// [R][MaxTokens][Hidden], row (d, t) = rank d's weighted partial sum of
	// this rank's token t.
	CStage Region
	// CombineX is the zero-copy combine input: BF16 [LocalExperts][Slots]
	// [Hidden] (or rank-major [R][MaxTokens][Hidden]); experts may write
	// their outputs here. CombineS f32 [LocalExperts][Slots][Hidden/128]
	// holds scales of an FP8 combine input.
	CombineX, CombineS Region
	// Send regions, only when the group spans nodes (empty otherwise):
	// rows for ranks on other nodes, indexed by destination, in the
	// staging regions' row formats: SendX [R][MaxTokens] rows of 2*Hidden
	// bytes, SendS f32 [R][MaxTokens][Hidden/128], SendIDs i32 and SendW
	// f32 [R][MaxTokens][TopK]; CSend BF16 [R][MaxTokens][Hidden], the
	// combine partials for each owner. One put moves rows 0..T-1 of
	// destination d's block into d's staging block of this rank, which has
	// the same shape.
	SendX, SendS, SendIDs, SendW, CSend Region
}

// Layout places every region of a workspace. Offsets are the same in every
// rank's workspace.
type Layout struct {
	Config
	// Ctrl is the control block (CtrlBytes, zeroed once).
	Ctrl Region
	Set  [Sets]SetRegions
	// Size is the workspace size in bytes.
	Size int
}

const regionAlign = 256

// NewLayout computes the workspace layout for c.
func NewLayout(c Config) (Layout, error) {
	if err := c.Validate(); err != nil {
		return Layout{}, err
	}
	l := Layout{Config: c}
	off := 0
	var overflow bool
	place := func(parts ...int) Region {
		size := 1
		for _, p := range parts {
			hi, lo := bits.Mul64(uint64(size), uint64(p))
			if hi != 0 || lo > math.MaxInt64/4 {
				overflow = true
				return Region{}
			}
			size = int(lo)
		}
		r := Region{Offset: off, Size: size}
		off += (size + regionAlign - 1) / regionAlign * regionAlign
		if off > math.MaxInt64/4 {
			overflow = true
		}
		return r
	}
	r, t, k, h, le, slots := c.Ranks, c.MaxTokens, c.TopK, c.Hidden, c.LocalExperts, c.Slots()
	ns := 0
	if c.FP8 {
		ns = c.ScalesPerRow()
	}
	l.Ctrl = place(CtrlBytes)
	for b := range l.Set {
		s := &l.Set[b]
		s.StageX = place(r, t, 2*h)
		s.StageS = place(r, t, ns, 4)
		s.StageIDs = place(r, t, k, 4)
		s.StageW = place(r, t, k, 4)
		s.RecvX = place(le, slots, 2*h)
		s.RecvS = place(le, slots, ns, 4)
		s.RecvSrc = place(le, slots, 4)
		s.RecvRange = place(le, r, 8)
		s.RecvCount = place(le, 4)
		s.TabPos = place(r, t, k, 4)
		s.TabW = place(r, t, k, 4)
		s.TabT = place(r, 4)
		s.TabRow = place(le, slots, 4)
		s.OwnMask = place(t, 4)
		s.CStage = place(r, t, 2*h)
		s.CombineX = place(le, slots, 2*h)
		s.CombineS = place(le, slots, ns, 4)
		rr := 0 // rows of the send regions
		if c.NodeCount() > 1 {
			rr = r
		}
		s.SendX = place(rr, t, 2*h)
		s.SendS = place(rr, t, ns, 4)
		s.SendIDs = place(rr, t, k, 4)
		s.SendW = place(rr, t, k, 4)
		s.CSend = place(rr, t, 2*h)
	}
	if overflow {
		return Layout{}, errors.New("lowlatency: workspace size overflows")
	}
	if c.NodeCount() > 1 && off > MaxPortBytes {
		// Port-channel triggers carry 32-bit offsets into the registered
		// workspace.
		return Layout{}, fmt.Errorf("lowlatency: a workspace of %d bytes across nodes: port channels reach at most %d bytes", off, MaxPortBytes)
	}
	l.Size = off
	return l, nil
}

// SizeHint is the workspace size for c (what a Buffer must allocate per
// rank), or an error when c is invalid.
func SizeHint(c Config) (int, error) {
	l, err := NewLayout(c)
	if err != nil {
		return 0, err
	}
	return l.Size, nil
}

// The control block (kernels/lowlatency.cu). Zero when the workspace is
// first used; kernels never clear it. b is the buffer set.
const (
	CtrlDispEpoch    = 0   // u64[2]: dispatches completed on set b (this rank)
	CtrlCombEpoch    = 16  // u64[2]: combines completed on set b
	CtrlDispDone     = 32  // u32[2]: blocks of the running dispatch receive that finished
	CtrlCombDone     = 40  // u32[2]
	CtrlMask         = 48  // u32: bit r set = rank r masked
	CtrlOwnT         = 52  // i32[2]: tokens of this rank's last dispatch on set b
	CtrlDispGate     = 64  // u64[2]: epoch whose arrivals block 0 of the receive has seen
	CtrlDispEff      = 80  // u32[2]: mask the receive of set b used
	CtrlCombGate     = 88  // u64[2]
	CtrlCombEff      = 104 // u32[2]
	CtrlInvalidAcc   = 112 // u32[2]: top-k ids outside [-1, E) counted by the running dispatch's send step
	CtrlInvalidOut   = 120 // u32[2]: the count of the last completed dispatch on set b
	CtrlDispSendDone = 128 // u32[2]: blocks of the running dispatch send that finished (across nodes)
	CtrlCombSendDone = 136 // u32[2]
	CtrlDispArrive   = 256 // u64[2][32]: arrival shares from source s
	CtrlDispFreed    = 768 // u64[2][32]: "done reading your rows" shares from destination d
	CtrlCombArrive   = 1280
	CtrlCombFreed    = 1792
	CtrlNTok         = 2304 // i32[2][32]: tokens of source s's dispatch on set b
	CtrlSendNTok     = 2560 // i32[2][32]: the token count this rank puts into rank d's CtrlNTok (across nodes)
	// CtrlTrace is the phase trace (trace.go; written only by kernels
	// built with GOEP_LL_TRACE=1, zero otherwise): u64
	// [2 kernels][TraceBlocks][TraceSlots]. In the control block so that
	// it is zeroed with it and the kernels address it from off_ctrl.
	CtrlTrace = 3072
	CtrlBytes = CtrlTrace + TraceBytes

	// ArrivalUnit is what one launch adds, over its blocks, to a counter.
	ArrivalUnit = 1 << 20

	// MaxPortBytes bounds a workspace reached through port channels.
	MaxPortBytes = 1 << 32
)

// Offsets in the control block (b: set, r: rank).
func ctrlU64(base, b, r int) int { return base + 8*MaxRanks*b + 8*r }

// DispArriveOffset is arrive[b][src] of dispatch.
func DispArriveOffset(b, src int) int { return ctrlU64(CtrlDispArrive, b, src) }

// DispFreedOffset is freed[b][dst] of dispatch.
func DispFreedOffset(b, dst int) int { return ctrlU64(CtrlDispFreed, b, dst) }

// CombArriveOffset is arrive[b][src] of combine.
func CombArriveOffset(b, src int) int { return ctrlU64(CtrlCombArrive, b, src) }

// CombFreedOffset is freed[b][dst] of combine.
func CombFreedOffset(b, dst int) int { return ctrlU64(CtrlCombFreed, b, dst) }

// NTokOffset is ntok[b][src].
func NTokOffset(b, src int) int { return CtrlNTok + 4*MaxRanks*b + 4*src }

// SendNTokOffset is the count this rank puts into rank d's ntok[b][rank].
func SendNTokOffset(b, d int) int { return CtrlSendNTok + 4*MaxRanks*b + 4*d }

// Stages named in timeout records.
const (
	StageDispatchFreed   = 1 // dispatch send: waiting for a destination to finish reading this set's previous rows
	StageDispatchArrival = 2 // dispatch receive: waiting for a source's rows
	StageDispatchGate    = 3 // dispatch receive: a block waiting for block 0's arrival check
	StageCombineFreed    = 4
	StageCombineArrival  = 5
	StageCombineGate     = 6
	StagePortPush        = 7 // across nodes: a port-channel trigger waiting for room in the proxy's FIFO
)

// StageName says what a stage waited for.
func StageName(stage uint32) string {
	names := [...]string{"dispatch send (peer still reading the set's previous rows)", "dispatch receive (rows from a source)",
		"dispatch receive gate", "combine send (peer still reading the set's previous partials)",
		"combine receive (partials from an expert rank)", "combine receive gate",
		"port channel push (the proxy's FIFO stayed full)"}
	if stage >= 1 && int(stage) <= len(names) {
		return names[stage-1]
	}
	return fmt.Sprintf("unknown stage %d", stage)
}
