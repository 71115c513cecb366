package ep

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/channels/bootstrap"
)

// Low-latency (decode) mode: LowLatencyBuffer.
//
// What inference engines expect of an EP backend when they decode with
// small batches, CUDA graphs and two micro-batches overlapped (DeepEP's
// low-latency mode, vLLM's prepare/finalize with the BatchedExperts layout
// [E, max_tokens, K], SGLang's dispatch_a/dispatch_b with masked_m):
//
//   - fixed shapes: the received rows are [local experts, ranks x
//     MaxTokens, Hidden] whatever the routing, with per-expert counts on the
//     device (masked_m); no call synchronises with the host, so every call
//     can be captured in a CUDA graph and replayed;
//   - two alternating buffer sets: consecutive calls need no cleaning, and
//     the outputs of one micro-batch stay valid while the other dispatches;
//   - split send/receive: with ReturnRecv a call returns once its sends
//     are issued, and Recv completes it later (compute overlaps meanwhile);
//   - rank masks: masked ranks receive nothing and are not waited for;
//     with Elastic a rank that times out is masked instead of failing.
//
//	ll, _ := ep.NewLowLatencyBuffer(ctx, bs, dev, ep.LowLatencyConfig{MaxTokens: 128, Hidden: 7168, TopK: 8, Experts: 256})
//	d, _ := ll.Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids, TopKWeights: w, Stream: s})
//	// experts read d.RecvX [E/R, R*128, 7168] (d.Count rows each) and write
//	// their outputs into ll.NextCombineBuffer(d.Handle)
//	_, _ = ll.Combine(ep.LLCombineArgs{Handle: d.Handle, Y: ll.NextCombineBuffer(d.Handle), Out: out, Stream: s})
//
// Weights go with the dispatch (the expert ranks apply them, summing a
// token's experts of one rank before sending one row back). Inside one
// node only (NVLink); across nodes is refused until it is built.

// LLFormat is the format of dispatched rows.
type LLFormat int

const (
	LLBF16  LLFormat = 0 // rows as they are
	LLFP8   LLFormat = 1 // E4M3, cast in the kernel, f32 scale per 128 elements
	LLUE8M0 LLFormat = 2 // E4M3 with power-of-two scales, packed 4 a word (DeepGEMM)
)

func (f LLFormat) String() string {
	switch f {
	case LLBF16:
		return "bf16"
	case LLFP8:
		return "fp8"
	case LLUE8M0:
		return "ue8m0"
	}
	return fmt.Sprintf("format %d", int(f))
}

// LowLatencyConfig configures a LowLatencyBuffer; every rank passes the same.
type LowLatencyConfig struct {
	MaxTokens int // most tokens a rank dispatches in one call
	Hidden    int // multiple of 8 (FP8: of 128)
	TopK      int // 1..32
	Experts   int // a multiple of the rank count
	// FP8 reserves the scale regions (FP8/UE8M0 dispatch, FP8 combine input).
	FP8 bool
	// Nodes the group spans: 0 takes the nodes the ranks are on (hosts, or
	// VirtualNodes); a count must match them. Inside a node rows move by
	// direct stores, across nodes over port channels (one put per
	// destination and region a call); the calls are the same.
	Nodes int
	// VirtualNodes splits the ranks of one host into this many nodes of
	// consecutive ranks that reach each other only over the network
	// transport (0: $GOEP_VIRTUAL_NODES, else none), as Config.VirtualNodes.
	VirtualNodes int
	// NumSMs caps every grid (0: the default, shrunk to this rank's share of
	// its GPU); Threads per block (0: the default).
	NumSMs, Threads int
	// Timeout bounds every device-side wait (0: the default).
	Timeout time.Duration
	// Tag separates buffers built over the same bootstrap.
	Tag int
}

func (c LowLatencyConfig) buffer() buffer.LowLatencyConfig {
	return buffer.LowLatencyConfig{MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK, Experts: c.Experts, FP8: c.FP8,
		Nodes: c.Nodes, VirtualNodes: c.VirtualNodes, NumSMs: c.NumSMs, Threads: c.Threads, Timeout: c.Timeout, Tag: c.Tag}
}

// LowLatencySizeHint is the device memory a LowLatencyBuffer allocates per
// rank for ranks ranks (both buffer sets).
func LowLatencySizeHint(c LowLatencyConfig, ranks int) (int, error) {
	return buffer.LowLatencySizeHint(c.buffer(), ranks)
}

// LowLatencyBuffer is one rank's low-latency buffer. Calls are collective
// (every rank makes the same calls in the same order) and safe for
// concurrent use (serialised).
type LowLatencyBuffer struct {
	b     *buffer.LowLatency
	cfg   LowLatencyConfig
	rank  int
	ranks int

	mu   sync.Mutex
	next int // the set the next dispatch uses
	sets [2]llSet
	done *Event
}

// The life of a buffer set: a dispatch sends (sending) and receives
// (received); its combine sends (combining) and receives (idle again).
type llState int

const (
	llIdle llState = iota
	llSending
	llReceived
	llCombining
)

type llSet struct {
	state  llState
	gen    uint64
	handle *LLHandle
}

// LLHandle names one dispatch: the set it used and its shape. A later
// dispatch on the same set expires it.
type LLHandle struct {
	buf       *LowLatencyBuffer
	set       int
	gen       uint64
	tokens    int
	format    LLFormat
	rankMajor bool
}

// Set is the buffer set (0 or 1) the dispatch used.
func (h *LLHandle) Set() int {
	if h == nil {
		return 0
	}
	return h.set
}

// Tokens is the dispatch's token count on this rank.
func (h *LLHandle) Tokens() int {
	if h == nil {
		return 0
	}
	return h.tokens
}

// NewLowLatencyBuffer builds rank bs.Rank()'s buffer; every rank calls it
// at once with the same config.
func NewLowLatencyBuffer(ctx context.Context, bs bootstrap.Bootstrap, dev Device, cfg LowLatencyConfig) (*LowLatencyBuffer, error) {
	if bs == nil || dev == nil {
		return nil, errors.New("ep: NewLowLatencyBuffer needs a bootstrap and a device")
	}
	if _, err := LowLatencySizeHint(cfg, bs.Size()); err != nil {
		return nil, &argError{fmt.Errorf("ep: rank %d: %w", bs.Rank(), err)}
	}
	b, err := buffer.NewLowLatency(ctx, bs, dev, cfg.buffer())
	if err != nil {
		return nil, err
	}
	l := &LowLatencyBuffer{b: b, cfg: cfg, rank: b.Rank(), ranks: b.Ranks()}
	if l.done, err = b.NewEvent(); err != nil {
		return nil, errors.Join(err, b.Close(ctx))
	}
	return l, nil
}

func (l *LowLatencyBuffer) invalid(op, format string, a ...any) error {
	return &argError{fmt.Errorf("ep: rank %d: low latency %s: "+format, append([]any{l.rank, op}, a...)...)}
}

// Rank, Ranks, Config, Device, Stream, LocalExperts and Slots describe the
// buffer (zero values on a nil buffer).
func (l *LowLatencyBuffer) Rank() int {
	if l == nil {
		return 0
	}
	return l.rank
}

func (l *LowLatencyBuffer) Ranks() int {
	if l == nil {
		return 0
	}
	return l.ranks
}

func (l *LowLatencyBuffer) Config() LowLatencyConfig {
	if l == nil {
		return LowLatencyConfig{}
	}
	return l.cfg
}

func (l *LowLatencyBuffer) Device() Device {
	if l == nil {
		return nil
	}
	return l.b.Device()
}

func (l *LowLatencyBuffer) Stream() Stream {
	if l == nil {
		return nil
	}
	return l.b.Stream()
}

func (l *LowLatencyBuffer) LocalExperts() int {
	if l == nil || l.ranks == 0 {
		return 0
	}
	return l.cfg.Experts / l.ranks
}

// Slots is the rows per local expert: Ranks x MaxTokens.
func (l *LowLatencyBuffer) Slots() int {
	if l == nil {
		return 0
	}
	return l.ranks * l.cfg.MaxTokens
}

// NewEvent creates an event for After and Done, closed with the buffer.
func (l *LowLatencyBuffer) NewEvent() (*Event, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	return l.b.NewEvent()
}

// Check returns nil while the buffer is usable, else why not.
func (l *LowLatencyBuffer) Check() error {
	if l == nil {
		return errors.New("ep: nil low-latency buffer")
	}
	return l.b.Check()
}

// LLDispatchArgs are a low-latency dispatch's arguments.
type LLDispatchArgs struct {
	X           Tensor // BF16 [T, Hidden], T <= MaxTokens, 16-byte aligned
	TopKIdx     Tensor // I64 or I32 [T, TopK]; -1 = none (ids outside [-1, Experts) are ignored and counted: LLDispatchResult.Invalid, InvalidIDs)
	TopKWeights Tensor // F32 [T, TopK], optional (weights of 1); applied by Combine
	Format      LLFormat
	// RankMajor leaves the rows per source rank ([R, MaxTokens] with local
	// expert ids per row) instead of expanding them per expert.
	RankMajor bool
	// ReturnRecv issues the sends and returns; LowLatencyBuffer.Recv
	// completes the dispatch later (the outputs are valid after it).
	ReturnRecv bool
	// Elastic masks a peer that does not arrive in time instead of failing.
	Elastic bool
	Stream  Stream // nil: the buffer's stream
	After   *Event // the stream waits for it first
	Done    *Event // recorded after the call's work (nil: the buffer's own)
}

// LLDispatchResult are a dispatch's outputs: views into the buffer set,
// valid (after the receive) until the next dispatch on the same set.
type LLDispatchResult struct {
	Handle *LLHandle
	// Expert-major: RecvX [LocalExperts, Slots, Hidden] BF16 or FP8E4M3;
	// RecvScales F32 [LocalExperts, Slots, Hidden/128] (FP8) or I32
	// [LocalExperts, Slots, ceil(Hidden/512)] (UE8M0, packed exponents);
	// Count I32 [LocalExperts] rows of each expert (on the device: HostCounts
	// copies it); SrcInfo I32 [LocalExperts, Slots] token index at the
	// source; LayoutRange I64 [LocalExperts, Ranks] begin | count<<32.
	RecvX, RecvScales, Count, SrcInfo, LayoutRange Tensor
	// Rank-major: RecvX U8 [Ranks, MaxTokens, 2*Hidden] (FP8 rows in the
	// first Hidden bytes), RecvScales F32 [Ranks, MaxTokens, Hidden/128],
	// RecvTopKIdx I32 [Ranks, MaxTokens, TopK] local expert ids (-1
	// elsewhere), RecvWeights F32, SourceTokens I32 [Ranks].
	RecvTopKIdx, RecvWeights, SourceTokens Tensor
	// Mask is the I32 [1] mask word (bit r: rank r masked), on the device.
	Mask Tensor
	// Invalid is the I32 [1] count of this rank's top-k ids outside [-1,
	// Experts) in this dispatch (treated as -1), on the device: written by
	// the receive step, so an engine may read it in stream order (in a
	// graph too) without a host synchronisation; InvalidIDs reads it on
	// the host. Valid until the next dispatch on the same set.
	Invalid Tensor
	// Done is recorded after the call's work (after the sends only, with
	// ReturnRecv).
	Done *Event
}

func (l *LowLatencyBuffer) begin(op string, s Stream, after *Event) (Stream, error) {
	if l == nil || l.b == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	if err := l.b.Check(); err != nil {
		return nil, err
	}
	if s == nil {
		s = l.b.Stream()
	}
	if after != nil {
		if err := after.Wait(s); err != nil {
			return nil, fmt.Errorf("ep: rank %d: low latency %s: waiting for the After event: %w", l.rank, op, err)
		}
	}
	return s, nil
}

func (l *LowLatencyBuffer) finish(op string, s Stream, done *Event) (*Event, error) {
	if done == nil {
		done = l.done
	}
	if err := done.Record(s); err != nil {
		return nil, l.b.Fail(fmt.Errorf("ep: rank %d: low latency %s: recording the Done event: %w", l.rank, op, err))
	}
	if err := l.b.Check(); err != nil {
		return nil, err
	}
	return done, nil
}

// Dispatch enqueues a dispatch on the next buffer set (sets alternate).
func (l *LowLatencyBuffer) Dispatch(a LLDispatchArgs) (*LLDispatchResult, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.cfg
	t := a.X.Rows()
	if t > c.MaxTokens {
		return nil, l.invalid("dispatch", "%d tokens above the configured maximum %d", t, c.MaxTokens)
	}
	if err := (check{name: "x", dtypes: []DType{BF16}, dims: []int{t, c.Hidden}, align: 16}).validate(a.X); err != nil {
		return nil, l.invalid("dispatch", "%v", err)
	}
	if err := (check{name: "topk_idx", dtypes: []DType{I64, I32}, dims: []int{t, c.TopK}, align: 8}).validate(a.TopKIdx); err != nil {
		return nil, l.invalid("dispatch", "%v", err)
	}
	if a.TopKWeights.Present() {
		if err := (check{name: "topk_weights", dtypes: []DType{F32}, dims: []int{t, c.TopK}, align: 4}).validate(a.TopKWeights); err != nil {
			return nil, l.invalid("dispatch", "%v", err)
		}
	}
	switch {
	case a.Format < LLBF16 || a.Format > LLUE8M0:
		return nil, l.invalid("dispatch", "unknown %v", a.Format)
	case a.Format != LLBF16 && !c.FP8:
		return nil, l.invalid("dispatch", "%v needs a buffer configured with FP8", a.Format)
	}
	set := l.next
	st := &l.sets[set]
	if st.state == llSending || st.state == llCombining {
		return nil, l.invalid("dispatch", "buffer set %d is still in flight (its previous call's receive was not issued)", set)
	}
	s, err := l.begin("dispatch", a.Stream, a.After)
	if err != nil {
		return nil, err
	}
	phase := 3
	if a.ReturnRecv {
		phase = 1
	}
	d := buffer.LLDispatch{Set: set, X: a.X.Ptr, TopK: a.TopKIdx.Ptr, IDs64: a.TopKIdx.DType == I64, Weights: a.TopKWeights.Ptr,
		Tokens: t, Format: int(a.Format), Phase: phase, RankMajor: a.RankMajor, Elastic: a.Elastic}
	if err := l.b.Dispatch(s, d); err != nil {
		return nil, err
	}
	// The set now belongs to this dispatch: the previous handle expires.
	st.gen++
	h := &LLHandle{buf: l, set: set, gen: st.gen, tokens: t, format: a.Format, rankMajor: a.RankMajor}
	st.handle, st.state = h, llReceived
	if a.ReturnRecv {
		st.state = llSending
	}
	l.next = 1 - set
	done, err := l.finish("dispatch", s, a.Done)
	if err != nil {
		return nil, err
	}
	res := l.views(h)
	res.Done = done
	return res, nil
}

func (l *LowLatencyBuffer) views(h *LLHandle) *LLDispatchResult {
	c := l.cfg
	v := l.b.Views(h.set)
	le, slots, r := v.LocalExperts, v.Slots, l.ranks
	res := &LLDispatchResult{Handle: h, Mask: NewTensor(v.Mask, I32, 1), Invalid: NewTensor(v.Invalid, I32, 1)}
	if h.rankMajor {
		res.RecvX = NewTensor(v.RMX, U8, r, c.MaxTokens, 2*c.Hidden)
		if h.format != LLBF16 {
			res.RecvScales = NewTensor(v.RMScales, F32, r, c.MaxTokens, v.ScalesPerRow)
		}
		res.RecvTopKIdx = NewTensor(v.RMIDs, I32, r, c.MaxTokens, c.TopK)
		res.RecvWeights = NewTensor(v.RMWeights, F32, r, c.MaxTokens, c.TopK)
		res.SourceTokens = NewTensor(v.RMTokens, I32, r)
		return res
	}
	switch h.format {
	case LLBF16:
		res.RecvX = NewTensor(v.X, BF16, le, slots, c.Hidden)
	case LLFP8:
		res.RecvX = NewTensor(v.X, FP8E4M3, le, slots, c.Hidden)
		res.RecvScales = NewTensor(v.Scales, F32, le, slots, v.ScalesPerRow)
	case LLUE8M0:
		res.RecvX = NewTensor(v.X, FP8E4M3, le, slots, c.Hidden)
		res.RecvScales = NewTensor(v.Scales, I32, le, slots, v.PackedScales)
	}
	res.Count = NewTensor(v.Count, I32, le)
	res.SrcInfo = NewTensor(v.SrcInfo, I32, le, slots)
	res.LayoutRange = NewTensor(v.LayoutRange, I64, le, r)
	return res
}

func (l *LowLatencyBuffer) handleState(op string, h *LLHandle) (*llSet, error) {
	switch {
	case h == nil:
		return nil, l.invalid(op, "nil handle")
	case h.buf != l:
		return nil, &argError{fmt.Errorf("ep: rank %d: low latency %s: %w", l.rank, op, ErrForeignHandle)}
	}
	st := &l.sets[h.set]
	if st.gen != h.gen {
		return nil, &argError{fmt.Errorf("ep: rank %d: low latency %s: a later dispatch reused buffer set %d: %w", l.rank, op, h.set, ErrExpiredHandle)}
	}
	return st, nil
}

// Recv completes a dispatch issued with ReturnRecv (the receive step), on
// s after after; it records done (nil: the buffer's own event).
func (l *LowLatencyBuffer) Recv(h *LLHandle, s Stream, after, done *Event) (*Event, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.handleState("recv", h)
	if err != nil {
		return nil, err
	}
	if st.state != llSending {
		return nil, l.invalid("recv", "the dispatch of buffer set %d has no receive pending", h.set)
	}
	if s, err = l.begin("recv", s, after); err != nil {
		return nil, err
	}
	d := buffer.LLDispatch{Set: h.set, Tokens: h.tokens, Format: int(h.format), Phase: 2, RankMajor: h.rankMajor}
	if err := l.b.Dispatch(s, d); err != nil {
		return nil, err
	}
	st.state = llReceived
	return l.finish("recv", s, done)
}

// HostCounts copies the
// per-local-expert counts of h's dispatch to the host: the caller must
// have synchronised the stream the dispatch ran on (this is the one host
// read of counts, on request).
func (l *LowLatencyBuffer) HostCounts(h *LLHandle) ([]int, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.handleState("counts", h)
	if err != nil {
		return nil, err
	}
	if st.state == llSending || h.rankMajor {
		return nil, l.invalid("counts", "no expert-major counts (receive pending or rank-major)")
	}
	v := l.b.Views(h.set)
	raw := make([]byte, 4*v.LocalExperts)
	if err := l.b.CopyOut(raw, v.Count); err != nil {
		return nil, fmt.Errorf("ep: rank %d: low latency counts: %w", l.rank, err)
	}
	out := make([]int, v.LocalExperts)
	for i := range out {
		out[i] = int(int32(binary.LittleEndian.Uint32(raw[4*i:])))
	}
	return out, nil
}

// InvalidIDs reports the top-k ids outside [-1, Experts) of h's dispatch on
// this rank (the kernels ignore them, as -1, and count them on the device:
// LLDispatchResult.Invalid) as an *InvalidIDsError, as Buffer.InvalidIDs
// does for the high-throughput path; nil when none. Synchronous (the one
// host read of the count, on request): call it after the dispatch's
// receive completed.
func (l *LowLatencyBuffer) InvalidIDs(h *LLHandle) error {
	if l == nil {
		return errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.handleState("invalid ids", h)
	if err != nil {
		return err
	}
	if st.state == llSending {
		return l.invalid("invalid ids", "the dispatch of buffer set %d has no receive yet", h.set)
	}
	var raw [4]byte
	if err := l.b.CopyOut(raw[:], l.b.Views(h.set).Invalid); err != nil {
		return fmt.Errorf("ep: rank %d: low latency invalid ids: %w", l.rank, err)
	}
	if n := int(binary.LittleEndian.Uint32(raw[:])); n > 0 {
		return &InvalidIDsError{Rank: l.rank, Op: "low latency dispatch", Count: n, Experts: l.cfg.Experts}
	}
	return nil
}

// NextCombineBuffer is where experts may write their outputs for h's
// combine (the zero-copy input: BF16 [LocalExperts, Slots, Hidden], or
// [Ranks, MaxTokens, Hidden] rank-major), in h's buffer set.
func (l *LowLatencyBuffer) NextCombineBuffer(h *LLHandle) (Tensor, error) {
	if l == nil {
		return Tensor{}, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.handleState("combine buffer", h); err != nil {
		return Tensor{}, err
	}
	v := l.b.Views(h.set)
	if h.rankMajor {
		return NewTensor(v.CombineX, BF16, l.ranks, l.cfg.MaxTokens, l.cfg.Hidden), nil
	}
	return NewTensor(v.CombineX, BF16, v.LocalExperts, v.Slots, l.cfg.Hidden), nil
}

// LLCombineArgs are a low-latency combine's arguments.
type LLCombineArgs struct {
	Handle *LLHandle
	// Y is BF16 [LocalExperts, Slots, Hidden] (or FP8E4M3 with YScales F32
	// [LocalExperts, Slots, Hidden/128]); rank-major BF16 [Ranks, MaxTokens,
	// Hidden], rows already weighted by the engine.
	Y, YScales Tensor
	Out        Tensor // BF16 [T, Hidden] of the dispatch's T
	ReturnRecv bool
	Elastic    bool
	Stream     Stream
	After      *Event
	Done       *Event
}

// Combine enqueues h's combine: out[t] = sum over t's experts of weight *
// expert output (weights from the dispatch).
func (l *LowLatencyBuffer) Combine(a LLCombineArgs) (*Event, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := a.Handle
	st, err := l.handleState("combine", h)
	if err != nil {
		return nil, err
	}
	if st.state != llReceived {
		return nil, l.invalid("combine", "the dispatch of buffer set %d is not received (call Recv first) or already combined", h.set)
	}
	c := l.cfg
	le, slots := l.LocalExperts(), l.Slots()
	fp8 := a.Y.DType == FP8E4M3
	ycheck := check{name: "y", dtypes: []DType{BF16, FP8E4M3}, dims: []int{le, slots, c.Hidden}, align: 16}
	if h.rankMajor {
		ycheck = check{name: "y", dtypes: []DType{BF16}, dims: []int{l.ranks, c.MaxTokens, c.Hidden}, align: 16}
	}
	if err := ycheck.validate(a.Y); err != nil {
		return nil, l.invalid("combine", "%v (the layout of the dispatch)", err)
	}
	if fp8 {
		if !c.FP8 {
			return nil, l.invalid("combine", "FP8 input needs a buffer configured with FP8")
		}
		if err := (check{name: "y_scales", dtypes: []DType{F32}, dims: []int{le, slots, c.Hidden / 128}, align: 4}).validate(a.YScales); err != nil {
			return nil, l.invalid("combine", "%v", err)
		}
	}
	if err := (check{name: "out", dtypes: []DType{BF16}, dims: []int{h.tokens, c.Hidden}, align: 16}).validate(a.Out); err != nil {
		return nil, l.invalid("combine", "%v (the dispatch had %d tokens)", err, h.tokens)
	}
	s, err := l.begin("combine", a.Stream, a.After)
	if err != nil {
		return nil, err
	}
	phase := 3
	if a.ReturnRecv {
		phase = 1
	}
	cc := buffer.LLCombine{Set: h.set, Tokens: h.tokens, Phase: phase, Y: a.Y.Ptr, YScales: a.YScales.Ptr, Out: a.Out.Ptr,
		YFP8: fp8, RankMajor: h.rankMajor, Elastic: a.Elastic}
	if err := l.b.Combine(s, cc); err != nil {
		return nil, err
	}
	st.state = llIdle
	if a.ReturnRecv {
		st.state = llCombining
		st.handle = h
	}
	return l.finish("combine", s, a.Done)
}

// CombineRecv completes a combine issued with ReturnRecv, writing out
// (the same Out as the combine's).
func (l *LowLatencyBuffer) CombineRecv(h *LLHandle, out Tensor, s Stream, after, done *Event) (*Event, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.handleState("combine recv", h)
	if err != nil {
		return nil, err
	}
	if st.state != llCombining {
		return nil, l.invalid("combine recv", "the combine of buffer set %d has no receive pending", h.set)
	}
	if err := (check{name: "out", dtypes: []DType{BF16}, dims: []int{h.tokens, l.cfg.Hidden}, align: 16}).validate(out); err != nil {
		return nil, l.invalid("combine recv", "%v", err)
	}
	if s, err = l.begin("combine recv", s, after); err != nil {
		return nil, err
	}
	cc := buffer.LLCombine{Set: h.set, Tokens: h.tokens, Phase: 2, Out: out.Ptr, RankMajor: h.rankMajor}
	if err := l.b.Combine(s, cc); err != nil {
		return nil, err
	}
	st.state = llIdle
	return l.finish("combine recv", s, done)
}

func (l *LowLatencyBuffer) maskBits(op string, ranks []int) (uint32, error) {
	m := uint32(0)
	for _, r := range ranks {
		if r < 0 || r >= l.ranks {
			return 0, l.invalid(op, "rank %d outside the world of %d ranks", r, l.ranks)
		}
		m |= 1 << uint(r)
	}
	return m, nil
}

// UpdateMask masks ranks (stream-ordered on s, nil: the buffer's stream):
// they receive nothing and are not waited for.
func (l *LowLatencyBuffer) UpdateMask(s Stream, ranks ...int) error {
	return l.mask("mask", s, 1, ranks)
}

// Unmask makes ranks active again (every rank must have made the same
// calls meanwhile: counters keep counting for masked ranks).
func (l *LowLatencyBuffer) Unmask(s Stream, ranks ...int) error { return l.mask("unmask", s, 2, ranks) }

// ClearMask makes every rank active.
func (l *LowLatencyBuffer) ClearMask(s Stream) error { return l.mask("clear mask", s, 0, nil) }

func (l *LowLatencyBuffer) mask(op string, s Stream, kind int, ranks []int) error {
	if l == nil {
		return errors.New("ep: nil low-latency buffer")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	bits, err := l.maskBits(op, ranks)
	if err != nil {
		return err
	}
	if s, err = l.begin(op, s, nil); err != nil {
		return err
	}
	return l.b.SetMask(s, kind, bits)
}

// MaskedRanks reads the mask (including ranks that elastic calls masked
// after a timeout). Synchronous: synchronise the streams of earlier calls
// first.
func (l *LowLatencyBuffer) MaskedRanks() ([]int, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	m, err := l.b.MaskNow()
	if err != nil {
		return nil, err
	}
	var out []int
	for r := 0; r < l.ranks; r++ {
		if m>>uint(r)&1 != 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// PhaseTrace is a diagnostic for measurement builds: this rank's raw
// in-kernel phase trace of the last dispatch and combine (per block, the
// GPU's global timer at each phase point; lowlatency.ParseTrace decodes
// it), written only when the kernels were compiled with GOEP_LL_TRACE=1
// (`ep-bench lowlatency --trace`); all zero otherwise. Synchronous:
// synchronise the calls' stream first.
func (l *LowLatencyBuffer) PhaseTrace() ([]byte, error) {
	if l == nil {
		return nil, errors.New("ep: nil low-latency buffer")
	}
	return l.b.PhaseTrace()
}

// Close synchronises the buffer's stream, meets every rank and frees the
// buffer. Collective.
func (l *LowLatencyBuffer) Close(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.sets {
		l.sets[i].gen++ // every handle expires
		l.sets[i].state = llIdle
	}
	return l.b.Close(ctx)
}
