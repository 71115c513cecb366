package intranode

import (
	"errors"
	"fmt"
	"math"

	"github.com/goep-dev/goep/internal/device"
)

// Workspace is one rank's view of a group's workspaces: what every kernel
// launch needs besides its own tensors. Whoever builds the workspaces (the
// EP Buffer, or NewRank here) fills it in.
type Workspace struct {
	Layout Layout
	Rank   int
	// Base is this rank's workspace (device memory), Size bytes of it. It
	// must be IPC-shared with (or peer-accessible from) every rank, and its
	// control block zero before the first launch.
	Base uintptr
	Size int
	// Peers is device memory holding u64[Ranks]: every rank's workspace as
	// mapped on this device; Peers[Rank] == Base.
	Peers uintptr
	// Watchdog is a goep_watchdog (channels: Communicator.Watchdog, or
	// NewRank's own) bounding every device-side wait; WaitID goes into the
	// timeout record.
	Watchdog uintptr
	WaitID   uint32
	// SpinBlocks caps the grid of every launch that waits on other ranks
	// (0: no cap beyond the GPU's SMs). Ranks that share a GPU must all be
	// resident at once; the builder sets it from channels.SpinBudget.
	SpinBlocks int
}

// Validate checks a workspace once, when it is built (the launchers trust
// it, as they trust their arguments: package ep validates every input once,
// before the Buffer calls here).
func (w *Workspace) Validate() error {
	if w == nil {
		return errors.New("intranode: nil workspace")
	}
	l := w.Layout
	switch {
	case l.Size == 0:
		return errors.New("intranode: workspace has no layout (use NewLayout)")
	case w.Rank < 0 || w.Rank >= l.Ranks:
		return fmt.Errorf("intranode: rank %d of %d", w.Rank, l.Ranks)
	case w.Size < l.Size:
		return fmt.Errorf("intranode: workspace of %d bytes is smaller than its layout (%d bytes)", w.Size, l.Size)
	}
	return checkPtrs(
		ptrCheck{"workspace", w.Base, regionAlign, true},
		ptrCheck{"peer table", w.Peers, 8, true},
		ptrCheck{"watchdog", w.Watchdog, 8, true},
	)
}

// Handle is what notify computes and cached dispatch and combine reuse, in
// device memory of this rank. Tokens is this rank's token count T of the
// dispatch that built it.
type Handle struct {
	Tokens     int
	SendPos    uintptr // int32[Tokens][Ranks]: position of t among this rank's tokens to d, or -1
	RankPrefix uintptr // int32[Ranks]: tokens received from sources 0..s (inclusive)
	RecvBase   uintptr // int32[Ranks]: where this rank's tokens start in rank d's receive region
	NumRecv    uintptr // int32[1]: tokens received
}

// DefaultHandle is a handle for tokens tokens in the workspace's own
// handle region.
func (w *Workspace) DefaultHandle(tokens int) Handle {
	if w == nil {
		return Handle{}
	}
	l := w.Layout
	return Handle{
		Tokens:     tokens,
		SendPos:    w.Base + uintptr(l.SendPos.Offset),
		RankPrefix: w.Base + uintptr(l.RankPrefix.Offset),
		RecvBase:   w.Base + uintptr(l.RecvBase.Offset),
		NumRecv:    w.Base + uintptr(l.NumRecv.Offset),
	}
}

// RecvViews are the dispatch outputs: views into this rank's receive
// region, valid from the end of a dispatch until the next dispatch (on any
// rank of the group). Row i of each belongs to received token i, ordered by
// source rank and then by token index at the source; Handle.RankPrefix
// gives the source boundaries.
type RecvViews struct {
	X        uintptr // BF16 [N][Hidden], or FP8 bytes [N][Hidden] after an FP8 dispatch
	Scales   uintptr // float32 [N][Hidden/128] after an FP8 dispatch
	SrcToken uintptr // int32 [N]: token index at the source
	TopK     uintptr // int64 [N][TopK]: local expert ids, -1 for experts on other ranks
	Weights  uintptr // float32 [N][TopK]: 0 where TopK is -1 (written when dispatch had weights)
}

// Recv returns the receive-region views.
func (w *Workspace) Recv() RecvViews {
	if w == nil {
		return RecvViews{}
	}
	l := w.Layout
	v := RecvViews{
		X:        w.Base + uintptr(l.RecvX.Offset),
		SrcToken: w.Base + uintptr(l.RecvSrcToken.Offset),
		TopK:     w.Base + uintptr(l.RecvTopK.Offset),
		Weights:  w.Base + uintptr(l.RecvWeights.Offset),
	}
	if l.FP8 {
		v.Scales = w.Base + uintptr(l.RecvScales.Offset)
	}
	return v
}

// CombineInputViews are this rank's combine input region: where an engine
// can write the rows (and weights) it will combine, so that Combine reads
// them in place (Layout.CombineX, Layout.CombineWeights).
type CombineInputViews struct {
	X       uintptr // BF16 [MaxRecv][Hidden]
	Weights uintptr // float32 [MaxRecv][TopK]
}

// CombineInput returns the combine input region.
func (w *Workspace) CombineInput() CombineInputViews {
	if w == nil {
		return CombineInputViews{}
	}
	l := w.Layout
	return CombineInputViews{X: w.Base + uintptr(l.CombineX.Offset), Weights: w.Base + uintptr(l.CombineWeights.Offset)}
}

// CopyMode selects how dispatch moves rows.
type CopyMode int

const (
	// CopyDefault is DefaultCopy.
	CopyDefault CopyMode = iota
	// CopyPlain: 16-byte loads and stores, up to 1024 threads a block,
	// 4 vectors a lane in flight (KernelDispatch).
	CopyPlain
	// CopyWide: 16-byte loads and stores, up to 512 threads a block, 8
	// vectors a lane a round and the next round's loads in flight during the
	// stores (KernelDispatchWide).
	CopyWide
	// CopyTMA: bulk loads into shared memory and bulk stores to the peers
	// (KernelDispatchTMA, NVRTC >= 12 and sm_90+; elsewhere the same kernel
	// runs the plain body).
	CopyTMA
)

// DefaultCopy is what CopyDefault means.
const DefaultCopy = CopyPlain

func (m CopyMode) String() string {
	switch m {
	case CopyDefault:
		return "default"
	case CopyPlain:
		return "plain"
	case CopyWide:
		return "wide"
	case CopyTMA:
		return "tma"
	}
	return fmt.Sprintf("copy mode %d", int(m))
}

// LaunchConfig sizes a dispatch or combine launch; the zero value is the
// default.
type LaunchConfig struct {
	// NumSMs caps the grid (one block per SM); 0 means DefaultSMs. The
	// grid is also capped by the device's SM count.
	NumSMs int
	// Threads per block: a multiple of 32 up to the kernel's maximum; 0
	// means the kernel's default. Launchers may use fewer when the work
	// does not fill the blocks.
	Threads int
	// Copy selects dispatch's copy path (ignored by combine and notify).
	// Threads valid for the plain path are capped to what the chosen path
	// takes (wide: 512, TMA: TMAMaxUsefulThreads).
	Copy CopyMode
}

// MaxExpertAlignment is the largest NotifyArgs.ExpertAlignment: the kernel
// rounds per-expert counts up in int32.
const MaxExpertAlignment = 1 << 24

// Launch defaults.
const (
	DefaultSMs                 = 24
	DefaultNotifyThreads       = 1024
	DefaultDispatchThread      = 1024
	DefaultDispatchWideThreads = 512
	DefaultDispatchTMAThreads  = 128
	DefaultCombineThreads      = 512
	DefaultCopyThreads         = 512
)

// TMA staging: stages buffers per warp, each of the largest multiple of
// tmaPieceAlign that fits tmaSmemBudget bytes of dynamic shared memory for
// the whole block (the kernels do not opt in to more than 48 KiB a block;
// the TMA kernel's static shared memory is about 2 KiB).
const (
	TMAStages      = 3
	tmaSmemBudget  = 44 << 10
	tmaPieceAlign  = 512
	tmaMaxPiece    = 16 << 10
	maxSlices      = 16
	combineUnroll  = 2 // GOEP_IN_COMBINE_UNROLL
	chunkBytes     = 16
	lanesPerWarp   = 32
	minSliceChunks = lanesPerWarp
)

// TMAMaxUsefulThreads caps a TMA dispatch's block (pieces of 1.5 KiB).
const TMAMaxUsefulThreads = 256

// TMAPiece is the staging piece size of a TMA dispatch with this many
// threads a block (0 if the buffers cannot fit).
func TMAPiece(threads int) int {
	var _ [TMAMaxStages - TMAStages]struct{} // TMAStages <= TMAMaxStages
	warps := threads / lanesPerWarp
	if warps < 1 {
		return 0
	}
	p := tmaSmemBudget / (warps * TMAStages) / tmaPieceAlign * tmaPieceAlign
	return min(p, tmaMaxPiece)
}

// slices is how many slices each of tokens rows is cut into so that about
// warps warps have a unit each, at least minChunks 16-byte chunks a slice
// and at most maxSlices.
func slices(tokens, warps, chunks, minChunks int) int {
	if tokens <= 0 {
		return 1
	}
	s := (warps + tokens - 1) / tokens
	s = min(s, max(1, chunks/minChunks), maxSlices)
	return max(s, 1)
}

func (c LaunchConfig) resolve(dev device.Device, spinBlocks, defThreads, maxThreads int) (blocks, threads int, err error) {
	threads = c.Threads
	if threads == 0 {
		threads = defThreads
	}
	if threads < 32 || threads > maxThreads || threads%32 != 0 {
		return 0, 0, fmt.Errorf("intranode: %d threads per block: want a multiple of 32 in 32..%d", threads, maxThreads)
	}
	blocks = c.NumSMs
	if blocks == 0 {
		blocks = DefaultSMs
	}
	if blocks < 1 {
		return 0, 0, fmt.Errorf("intranode: %d SMs", c.NumSMs)
	}
	if sms := dev.Info().SMs; sms > 0 && blocks > sms {
		blocks = sms
	}
	if spinBlocks > 0 && blocks > spinBlocks {
		blocks = spinBlocks
	}
	return blocks, threads, nil
}

// NotifyArgs are the inputs and extra outputs of a notify launch.
type NotifyArgs struct {
	// TopK is int64[Handle.Tokens][TopK] (-1 = no expert). Ids outside
	// [-1, Experts) cannot be checked on the host without a copy; the
	// kernels ignore them (as -1) and count them in Invalid.
	TopK uintptr
	// Handle receives the send positions, prefixes and received count.
	Handle Handle
	// ExpertAlignment rounds each local expert's received count up to a
	// multiple of it (<= 1: no rounding).
	ExpertAlignment int
	// RecvCount, when not 0, is an int32 (host-mapped, so the host can
	// poll it) that receives the received token count last, after the
	// expert counts. Set it to -1 before the launch.
	RecvCount uintptr
	// ExpertCounts, when not 0, is int32[LocalExperts] (host-mapped or
	// device memory): received (token, local expert) pairs per local
	// expert, rounded up to ExpertAlignment.
	ExpertCounts uintptr
	// Invalid, when not 0, receives an int32: top-k entries of this rank
	// outside [-1, Experts).
	Invalid uintptr
}

// Notify enqueues the notify kernel: every rank must launch it (same
// Workspace layout, any token counts). It computes the handle, exchanges
// counts with every peer (a cross-rank barrier inside the kernel) and
// writes the received count and per-expert counts.
func (w *Workspace) Notify(dev device.Device, s device.Stream, a NotifyArgs, cfg LaunchConfig) error {
	if dev == nil || w == nil {
		return errors.New("intranode: notify: nil device or workspace")
	}
	l := w.Layout
	threads := cfg.Threads
	if threads == 0 {
		threads = DefaultNotifyThreads
	}
	if threads < 32 || threads > NotifyMaxThreads || threads%32 != 0 {
		return fmt.Errorf("intranode: notify: %d threads: want a multiple of 32 in 32..%d", threads, NotifyMaxThreads)
	}
	// Every value packed into a 32-bit argument is range-checked: the
	// kernel rounds counts up in int32 ((n + a - 1) / a * a, n <= MaxRecv).
	if a.ExpertAlignment < 0 || a.ExpertAlignment > MaxExpertAlignment ||
		int64(l.MaxRecv())+int64(a.ExpertAlignment) > math.MaxInt32 {
		return fmt.Errorf("intranode: notify: expert alignment %d: want 0..%d (and counts rounded up must fit int32)", a.ExpertAlignment, MaxExpertAlignment)
	}
	if a.Handle.Tokens < 0 || a.Handle.Tokens > l.MaxTokens {
		return fmt.Errorf("intranode: notify: %d tokens: the layout holds 0..%d", a.Handle.Tokens, l.MaxTokens)
	}
	args := device.NewArgs(21).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(uint64(l.Counts.Offset)).U64(uint64(l.ExpertCounts.Offset)).
		Ptr(a.TopK).I32(int32(a.Handle.Tokens)).I32(int32(l.TopK)).I32(int32(l.Experts())).
		I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(a.ExpertAlignment)).
		Ptr(a.Handle.SendPos).Ptr(a.Handle.RankPrefix).Ptr(a.Handle.RecvBase).Ptr(a.Handle.NumRecv).
		Ptr(a.RecvCount).Ptr(a.ExpertCounts).Ptr(a.Invalid).Ptr(w.Watchdog).U32(w.WaitID).
		U64(shapeWord(KindNotify, false, false, l))
	if err := dev.Launch(KernelNotify, device.D1(1), device.D1(threads), 4*l.Experts(), s, args); err != nil {
		return fmt.Errorf("intranode: notify: %w", err)
	}
	return nil
}

// DispatchArgs are the inputs of a dispatch launch (cached or not: a
// non-cached dispatch is Notify then Dispatch with the same handle).
type DispatchArgs struct {
	// X is BF16 [Tokens][Hidden], or FP8 E4M3 bytes [Tokens][Hidden] when
	// FP8; 16-byte aligned.
	X   uintptr
	FP8 bool
	// Scales is float32 [Tokens][Hidden/128] (FP8 only), element (token,
	// c) at Scales + 4*(token*ScaleStrides[0] + c*ScaleStrides[1]); zero
	// strides mean row-major, {Hidden/128, 1}. Strides are positive.
	Scales       uintptr
	ScaleStrides [2]int64
	// TopK is int64 [Tokens][TopK], the routing the handle was built from.
	TopK uintptr
	// Weights is float32 [Tokens][TopK], optional.
	Weights uintptr
	Handle  Handle
}

// Dispatch enqueues the dispatch kernel: every rank must launch it. Each
// token row goes to its final place in every destination's receive region
// (Recv views), with its source token index, local expert ids, weights and
// FP8 scales. The kernel ends when this rank's receive region is complete.
func (w *Workspace) Dispatch(dev device.Device, s device.Stream, a DispatchArgs, cfg LaunchConfig) error {
	return w.dispatch(dev, s, a, cfg, false)
}

// NotifyDispatch is Notify then Dispatch (non-cached dispatch) on the same
// stream, with the same handle. The dispatch skips its entry wait: notify's
// barrier already proved that every rank finished the work before it (a
// rank's notify arrives only once its stream got there), so one flag round
// trip less than the two launches separately. Ranks may mix this with
// separate Notify and Dispatch calls.
func (w *Workspace) NotifyDispatch(dev device.Device, s device.Stream, n NotifyArgs, a DispatchArgs, cfg LaunchConfig) error {
	if n.Handle != a.Handle {
		return errors.New("intranode: notify+dispatch: notify and dispatch must use the same handle")
	}
	if err := w.Notify(dev, s, n, LaunchConfig{}); err != nil {
		return err
	}
	return w.dispatch(dev, s, a, cfg, true)
}

func (w *Workspace) dispatch(dev device.Device, s device.Stream, a DispatchArgs, cfg LaunchConfig, afterNotify bool) error {
	if dev == nil || w == nil {
		return errors.New("intranode: dispatch: nil device or workspace")
	}
	l := w.Layout
	if a.FP8 && !l.FP8 {
		return errors.New("intranode: dispatch: FP8 input, but the workspace layout has no FP8 scales region (Config.FP8)")
	}
	t := a.Handle.Tokens
	mode := cfg.Copy
	if mode == CopyDefault {
		mode = DefaultCopy
	}
	kernel, defThreads, maxThreads := KernelDispatch, DefaultDispatchThread, DispatchMaxThreads
	switch mode {
	case CopyPlain:
	case CopyWide:
		kernel, defThreads, maxThreads = KernelDispatchWide, DefaultDispatchWideThreads, DispatchWideMaxThreads
	case CopyTMA:
		kernel, defThreads, maxThreads = KernelDispatchTMA, DefaultDispatchTMAThreads, DispatchTMAMaxThreads
	default:
		return fmt.Errorf("intranode: dispatch: unknown %v", mode)
	}
	if mode != CopyPlain && cfg.Threads > maxThreads && cfg.Threads <= DispatchMaxThreads {
		cfg.Threads = maxThreads // a block size meant for the plain path
	}
	blocks, threads, err := cfg.resolve(dev, w.SpinBlocks, defThreads, maxThreads)
	if err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	if mode == CopyTMA {
		// A few warps keep the bulk-copy engine busy; more would shrink the
		// staging pieces (a config sized for the plain path, e.g. 1024
		// threads, still works).
		threads = min(threads, TMAMaxUsefulThreads)
	}
	rowBytes := l.RowBytes(a.FP8)
	chunks := rowBytes / chunkBytes
	// Units of (token, slice): enough slices that few tokens still give
	// every warp of the grid a unit; no more blocks than the units fill,
	// and no more threads than a block's units need.
	warps := threads / lanesPerWarp
	sl := slices(t, blocks*warps, chunks, minSliceChunks)
	if int64(t)*int64(sl) > math.MaxInt32 {
		return fmt.Errorf("intranode: dispatch: %d tokens x %d slices overflow 32-bit unit indices", t, sl)
	}
	units := max(1, t*sl)
	blocks = min(blocks, (units+warps-1)/warps)
	perBlock := ((t + blocks - 1) / blocks) * sl
	threads = min(threads, max(1, perBlock)*lanesPerWarp)
	scales := 0
	strides := a.ScaleStrides
	if a.FP8 {
		scales = l.ScalesPerRow()
		if strides == [2]int64{} {
			strides = [2]int64{int64(scales), 1}
		}
		if strides[0] < 1 || strides[1] < 1 {
			return fmt.Errorf("intranode: dispatch: scale strides %v: want positive element strides", strides)
		}
	}
	if t < 0 || t > l.MaxTokens {
		return fmt.Errorf("intranode: dispatch: %d tokens: the layout holds 0..%d", t, l.MaxTokens)
	}
	skip := int32(0)
	if afterNotify {
		skip = 1
	}
	args := device.NewArgs(31).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(uint64(l.RecvX.Offset)).U64(uint64(l.RecvScales.Offset)).
		U64(uint64(l.RecvSrcToken.Offset)).U64(uint64(l.RecvTopK.Offset)).U64(uint64(l.RecvWeights.Offset)).
		Ptr(a.X).Ptr(a.Scales).Ptr(a.TopK).Ptr(a.Weights).Ptr(a.Handle.SendPos).Ptr(a.Handle.RecvBase).
		I32(int32(t)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.LocalExperts)).
		I32(int32(rowBytes)).I32(int32(scales)).I32(int32(sl)).I32(skip)
	smem := 0
	if mode == CopyTMA {
		piece := TMAPiece(threads)
		if piece < tmaPieceAlign {
			return fmt.Errorf("intranode: dispatch: %d threads leave no room for TMA staging buffers", threads)
		}
		smem = threads / lanesPerWarp * TMAStages * piece
		args.I32(int32(piece)).I32(TMAStages)
	}
	args.Ptr(w.Watchdog).U32(w.WaitID).I64(strides[0]).I64(strides[1]).
		U64(shapeWord(KindDispatch, a.FP8, a.Weights != 0, l))
	if err := dev.Launch(kernel, device.D1(blocks), device.D1(threads), smem, s, args); err != nil {
		return fmt.Errorf("intranode: dispatch (%v): %w", mode, err)
	}
	return nil
}

// CombineArgs are the inputs and outputs of a combine launch.
type CombineArgs struct {
	// Y is BF16 [N][Hidden], one row per token this rank received in the
	// dispatch that built Handle, in receive order; 16-byte aligned. The
	// owners of the tokens read it over NVLink, so it should lie in this
	// rank's workspace: the combine input region (CombineInput().X), the
	// receive region (Recv().X itself: DeepEP combines recv_x), or
	// anywhere else inside the workspace with room for MaxRecv rows after
	// it. A Y outside the workspace works too, slower: Combine first copies
	// its N rows into the combine input region on the same stream.
	Y uintptr
	// Weights is float32 [N][TopK], optional; if one rank passes weights,
	// every rank must. The same placement rules as Y (CombineInput().Weights,
	// Recv().Weights, or staged by a copy).
	Weights uintptr
	// Bias0 and Bias1 are BF16 [Tokens][Hidden], optional, added after the
	// sum over ranks.
	Bias0, Bias1 uintptr
	// Out is BF16 [Tokens][Hidden]: this rank's tokens, summed in fp32 over
	// the ranks each reached (ascending rank order), plus the biases, then
	// rounded to nearest even.
	Out uintptr
	// OutWeights is float32 [Tokens][TopK] (needs Weights): the sum over
	// ranks of the weights they sent back.
	OutWeights uintptr
	// Handle is the handle of the dispatch whose rows Y holds.
	Handle Handle
	// Rows, when > 0, is N (the host knows it, e.g. Rank.RecvCountNow):
	// a Y or Weights outside the workspace is then staged with a
	// device-to-device copy of exactly N rows. When 0, the staging copy is a
	// small kernel that reads N from Handle.NumRecv (graph-safe, no host
	// count needed).
	Rows int
}

// Combine enqueues the combine kernel: every rank must launch it. It pulls
// the rows of this rank's tokens from every rank's combine input over
// NVLink and sums them; it ends once every rank has finished reading this
// rank's input, so the caller may overwrite Y (and Weights) as soon as its
// stream passes the combine.
func (w *Workspace) Combine(dev device.Device, s device.Stream, a CombineArgs, cfg LaunchConfig) error {
	if dev == nil || w == nil {
		return errors.New("intranode: combine: nil device or workspace")
	}
	l := w.Layout
	t := a.Handle.Tokens
	if t < 0 || t > l.MaxTokens {
		return fmt.Errorf("intranode: combine: %d tokens: the layout holds 0..%d", t, l.MaxTokens)
	}
	if a.Rows < 0 || a.Rows > l.MaxRecv() {
		return fmt.Errorf("intranode: combine: %d rows: the workspace holds 0..%d", a.Rows, l.MaxRecv())
	}
	blocks, threads, err := cfg.resolve(dev, w.SpinBlocks, DefaultCombineThreads, CombineMaxThreads)
	if err != nil {
		return fmt.Errorf("combine: %w", err)
	}
	warps := threads / lanesPerWarp
	sl := slices(t, blocks*warps, l.Hidden*2/chunkBytes, combineUnroll*lanesPerWarp)
	if int64(t)*int64(sl) > math.MaxInt32 {
		return fmt.Errorf("intranode: combine: %d tokens x %d slices overflow 32-bit unit indices", t, sl)
	}
	units := max(1, t*sl)
	blocks = min(blocks, (units+warps-1)/warps)
	threads = min(threads, ((units+blocks-1)/blocks)*lanesPerWarp)
	// Inputs outside the workspace: checked, then staged (nothing is
	// enqueued before every check passed).
	in := w.CombineInput()
	offY, inY, err := w.inputOffset("y", a.Y, 2*l.Hidden)
	if err != nil {
		return err
	}
	offW, inW := NoOffset, true
	if a.Weights != 0 {
		if offW, inW, err = w.inputOffset("weights", a.Weights, 4*l.TopK); err != nil {
			return err
		}
	}
	if !inY {
		if offY, err = w.stage(dev, s, "y", a.Y, in.X, 2*l.Hidden, a.Rows, a.Handle); err != nil {
			return err
		}
	}
	if !inW {
		if offW, err = w.stage(dev, s, "weights", a.Weights, in.Weights, 4*l.TopK, a.Rows, a.Handle); err != nil {
			return err
		}
	}
	args := device.NewArgs(19).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(offY).U64(offW).
		Ptr(a.Handle.RecvBase).Ptr(a.Handle.SendPos).Ptr(a.Bias0).Ptr(a.Bias1).Ptr(a.Out).Ptr(a.OutWeights).
		I32(int32(t)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.Hidden)).I32(int32(sl)).
		Ptr(w.Watchdog).U32(w.WaitID).U64(shapeWord(KindCombine, false, a.Weights != 0, l))
	if err := dev.Launch(KernelCombine, device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return fmt.Errorf("intranode: combine: %w", err)
	}
	return nil
}

// inputOffset says whether a combine input of rowBytes-byte rows at p lies
// in this rank's workspace, and where (an offset from Base). Inside, it
// must leave room for MaxRecv rows.
func (w *Workspace) inputOffset(what string, p uintptr, rowBytes int) (uint64, bool, error) {
	l := w.Layout
	span := uintptr(l.MaxRecv()) * uintptr(rowBytes)
	if p < w.Base || p >= w.Base+uintptr(w.Size) {
		return 0, false, nil
	}
	if p+span > w.Base+uintptr(w.Size) {
		return 0, false, fmt.Errorf("intranode: combine: %s at workspace offset %#x leaves no room for %d rows of %d bytes",
			what, p-w.Base, l.MaxRecv(), rowBytes)
	}
	return uint64(p - w.Base), true, nil
}

// stage copies a combine input outside the workspace, on s, to region
// (this rank's combine input region) and returns the region's offset:
// rows rows with a device-to-device copy when rows > 0, else by the copy
// kernel, which reads the received count from h.NumRecv.
func (w *Workspace) stage(dev device.Device, s device.Stream, what string, p, region uintptr, rowBytes, rows int, h Handle) (uint64, error) {
	l := w.Layout
	if rows > 0 {
		if err := dev.CopyAsync(region, p, rows*rowBytes, s); err != nil {
			return 0, fmt.Errorf("intranode: combine: stage %s: %w", what, err)
		}
		return uint64(region - w.Base), nil
	}
	// Every SM (the count is on the device), but no more threads than the
	// worst case has 16-byte vectors, 4 a thread.
	blocks := dev.Info().SMs
	if blocks <= 0 {
		blocks = DefaultSMs
	}
	vectors := (l.MaxRecv()*rowBytes + chunkBytes - 1) / chunkBytes
	threads := min(DefaultCopyThreads, (vectors+lanesPerWarp-1)/lanesPerWarp*lanesPerWarp)
	blocks = max(1, min(blocks, (vectors+4*threads-1)/(4*threads)))
	args := device.NewArgs(5).Ptr(p).Ptr(region).Ptr(h.NumRecv).I32(int32(l.MaxRecv())).U64(uint64(rowBytes))
	if err := dev.Launch(KernelCopyRows, device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return 0, fmt.Errorf("intranode: combine: stage %s: %w", what, err)
	}
	return uint64(region - w.Base), nil
}

type ptrCheck struct {
	name     string
	p        uintptr
	align    uintptr
	required bool
}

func checkPtrs(cs ...ptrCheck) error {
	for _, c := range cs {
		switch {
		case c.p == 0 && c.required:
			return fmt.Errorf("%s pointer is null", c.name)
		case c.p%c.align != 0:
			return fmt.Errorf("%s pointer %#x is not %d-byte aligned", c.name, c.p, c.align)
		}
	}
	return nil
}
