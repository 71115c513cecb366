package intranode

import (
	"errors"
	"fmt"

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
}

func (w *Workspace) validate() error {
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
	l := w.Layout
	return Handle{
		Tokens:     tokens,
		SendPos:    w.Base + uintptr(l.SendPos.Offset),
		RankPrefix: w.Base + uintptr(l.RankPrefix.Offset),
		RecvBase:   w.Base + uintptr(l.RecvBase.Offset),
		NumRecv:    w.Base + uintptr(l.NumRecv.Offset),
	}
}

func (h Handle) validate(l Layout) error {
	if h.Tokens < 0 || h.Tokens > l.MaxTokens {
		return fmt.Errorf("intranode: %d tokens: the workspace holds 0..%d per rank", h.Tokens, l.MaxTokens)
	}
	return checkPtrs(
		ptrCheck{"handle send positions", h.SendPos, 4, h.Tokens > 0},
		ptrCheck{"handle rank prefix", h.RankPrefix, 4, true},
		ptrCheck{"handle recv base", h.RecvBase, 4, true},
		ptrCheck{"handle recv count", h.NumRecv, 4, true},
	)
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

// LaunchConfig sizes a dispatch or combine launch; the zero value is the
// default.
type LaunchConfig struct {
	// NumSMs caps the grid (one block per SM); 0 means DefaultSMs. The
	// grid is also capped by the device's SM count, because combine needs
	// all its blocks resident at once.
	NumSMs int
	// Threads per block: a multiple of 32 up to the kernel's maximum; 0
	// means the kernel's default.
	Threads int
}

// Launch defaults.
const (
	DefaultSMs            = 24
	DefaultNotifyThreads  = 1024
	DefaultDispatchThread = 1024
	DefaultCombineThreads = 512
)

func (c LaunchConfig) resolve(dev device.Device, defThreads, maxThreads int) (blocks, threads int, err error) {
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
	if dev == nil {
		return errors.New("intranode: notify: nil device")
	}
	l := w.Layout
	if err := w.validate(); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	if err := a.Handle.validate(l); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	if a.ExpertAlignment < 0 {
		return fmt.Errorf("intranode: notify: expert alignment %d", a.ExpertAlignment)
	}
	if err := checkPtrs(
		ptrCheck{"top-k ids", a.TopK, 8, a.Handle.Tokens > 0},
		ptrCheck{"recv count", a.RecvCount, 4, false},
		ptrCheck{"expert counts", a.ExpertCounts, 4, false},
		ptrCheck{"invalid count", a.Invalid, 4, false},
	); err != nil {
		return fmt.Errorf("intranode: notify: %w", err)
	}
	threads := cfg.Threads
	if threads == 0 {
		threads = DefaultNotifyThreads
	}
	if threads < 32 || threads > NotifyMaxThreads || threads%32 != 0 {
		return fmt.Errorf("intranode: notify: %d threads: want a multiple of 32 in 32..%d", threads, NotifyMaxThreads)
	}
	args := device.NewArgs(20).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(uint64(l.Counts.Offset)).U64(uint64(l.ExpertCounts.Offset)).
		Ptr(a.TopK).I32(int32(a.Handle.Tokens)).I32(int32(l.TopK)).I32(int32(l.Experts())).
		I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(a.ExpertAlignment)).
		Ptr(a.Handle.SendPos).Ptr(a.Handle.RankPrefix).Ptr(a.Handle.RecvBase).Ptr(a.Handle.NumRecv).
		Ptr(a.RecvCount).Ptr(a.ExpertCounts).Ptr(a.Invalid).Ptr(w.Watchdog).U32(w.WaitID)
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
	// Scales is float32 [Tokens][Hidden/128] (FP8 only).
	Scales uintptr
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
	if dev == nil {
		return errors.New("intranode: dispatch: nil device")
	}
	l := w.Layout
	if err := w.validate(); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	if err := a.Handle.validate(l); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	if a.FP8 && !l.FP8 {
		return errors.New("intranode: dispatch: FP8 input, but the workspace layout has no FP8 scales region (Config.FP8)")
	}
	t := a.Handle.Tokens
	if err := checkPtrs(
		ptrCheck{"x", a.X, 16, t > 0},
		ptrCheck{"scales", a.Scales, 4, a.FP8 && t > 0},
		ptrCheck{"top-k ids", a.TopK, 8, t > 0},
		ptrCheck{"top-k weights", a.Weights, 4, false},
	); err != nil {
		return fmt.Errorf("intranode: dispatch: %w", err)
	}
	if !a.FP8 && a.Scales != 0 {
		return errors.New("intranode: dispatch: scales given for a BF16 dispatch")
	}
	blocks, threads, err := cfg.resolve(dev, DefaultDispatchThread, DispatchMaxThreads)
	if err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	// One warp per token at a time: no more blocks than the tokens fill.
	blocks = min(blocks, max(1, (t+threads/32-1)/(threads/32)))
	scales := 0
	if a.FP8 {
		scales = l.ScalesPerRow()
	}
	args := device.NewArgs(22).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(uint64(l.RecvX.Offset)).U64(uint64(l.RecvScales.Offset)).
		U64(uint64(l.RecvSrcToken.Offset)).U64(uint64(l.RecvTopK.Offset)).U64(uint64(l.RecvWeights.Offset)).
		Ptr(a.X).Ptr(a.Scales).Ptr(a.TopK).Ptr(a.Weights).Ptr(a.Handle.SendPos).Ptr(a.Handle.RecvBase).
		I32(int32(t)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.LocalExperts)).
		I32(int32(l.RowBytes(a.FP8))).I32(int32(scales)).Ptr(w.Watchdog).U32(w.WaitID)
	if err := dev.Launch(KernelDispatch, device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return fmt.Errorf("intranode: dispatch: %w", err)
	}
	return nil
}

// CombineArgs are the inputs and outputs of a combine launch.
type CombineArgs struct {
	// Y is BF16 [N][Hidden], one row per token this rank received in the
	// dispatch that built Handle, in receive order (it may be Recv().X
	// itself); 16-byte aligned.
	Y uintptr
	// Weights is float32 [N][TopK], optional; if one rank passes weights,
	// every rank must.
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
}

// Combine enqueues the combine kernel: every rank must launch it.
func (w *Workspace) Combine(dev device.Device, s device.Stream, a CombineArgs, cfg LaunchConfig) error {
	if dev == nil {
		return errors.New("intranode: combine: nil device")
	}
	l := w.Layout
	if err := w.validate(); err != nil {
		return fmt.Errorf("combine: %w", err)
	}
	if err := a.Handle.validate(l); err != nil {
		return fmt.Errorf("combine: %w", err)
	}
	t := a.Handle.Tokens
	if err := checkPtrs(
		// Y may be empty (this rank received nothing): the kernel reads
		// N = RankPrefix[R-1] rows, so a null Y is refused anyway.
		ptrCheck{"y", a.Y, 16, true},
		ptrCheck{"weights", a.Weights, 4, false},
		ptrCheck{"bias0", a.Bias0, 16, false},
		ptrCheck{"bias1", a.Bias1, 16, false},
		ptrCheck{"out", a.Out, 16, t > 0},
		ptrCheck{"out weights", a.OutWeights, 4, false},
	); err != nil {
		return fmt.Errorf("intranode: combine: %w", err)
	}
	if a.OutWeights != 0 && a.Weights == 0 {
		return errors.New("intranode: combine: combined weights asked for, but no weights given")
	}
	blocks, threads, err := cfg.resolve(dev, DefaultCombineThreads, CombineMaxThreads)
	if err != nil {
		return fmt.Errorf("combine: %w", err)
	}
	args := device.NewArgs(20).
		Ptr(w.Peers).U64(uint64(l.Ctrl.Offset)).U64(uint64(l.CombineX.Offset)).U64(uint64(l.CombineWeights.Offset)).
		U64(uint64(l.MaxTokens)).
		Ptr(a.Y).Ptr(a.Weights).Ptr(a.Handle.RankPrefix).Ptr(a.Handle.SendPos).Ptr(a.Bias0).Ptr(a.Bias1).
		Ptr(a.Out).Ptr(a.OutWeights).
		I32(int32(t)).I32(int32(l.TopK)).I32(int32(l.Ranks)).I32(int32(w.Rank)).I32(int32(l.Hidden)).
		Ptr(w.Watchdog).U32(w.WaitID)
	if err := dev.Launch(KernelCombine, device.D1(blocks), device.D1(threads), 0, s, args); err != nil {
		return fmt.Errorf("intranode: combine: %w", err)
	}
	return nil
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
