package buffer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/lowlatency"
)

// LowLatencyMode is the mode of a LowLatency buffer.
const LowLatencyMode Mode = "lowlatency"

// LowLatencyConfig configures a LowLatency buffer; every rank passes the
// same one.
type LowLatencyConfig struct {
	// MaxTokens is the most tokens a rank dispatches in one call.
	MaxTokens, Hidden, TopK, Experts int
	// FP8 reserves the scale regions (FP8/UE8M0 dispatch, FP8 combine input).
	FP8 bool
	// Nodes the group spans: 0 takes the communicator's nodes (hosts, or
	// VirtualNodes); a count must match them. Ranks of a node store into
	// each other's workspaces; rows for the other nodes go over port
	// channels (package lowlatency). Size hints count Nodes, else
	// VirtualNodes, else one node.
	Nodes int
	// VirtualNodes splits the ranks of one host into this many nodes of
	// consecutive ranks, the other nodes reached only over the network
	// transport (channels.NetworkConfig.VirtualNodes; 0: $GOEP_VIRTUAL_NODES,
	// else none), as the normal Buffer's Config.VirtualNodes.
	VirtualNodes int
	// NumSMs caps grids (0: lowlatency.DefaultSMs, every SM, shrunk to this
	// rank's share of its GPU; a configured grid above the share is refused);
	// Threads per block (0: the default).
	NumSMs, Threads int
	// Timeout bounds every device-side wait (0: the communicator's default).
	Timeout time.Duration
	// Tag separates this buffer's bootstrap messages from other users'.
	Tag int
}

// Layout is the lowlatency config this maps to, for ranks ranks.
func (c LowLatencyConfig) layoutConfig(ranks int) (lowlatency.Config, error) {
	if ranks < 1 || c.Experts%ranks != 0 {
		return lowlatency.Config{}, fmt.Errorf("buffer: low latency: %d experts do not split over %d ranks", c.Experts, ranks)
	}
	nodes := c.Nodes
	if nodes == 0 {
		nodes = c.VirtualNodes
	}
	return lowlatency.Config{Ranks: ranks, MaxTokens: c.MaxTokens, Hidden: c.Hidden, TopK: c.TopK,
		LocalExperts: c.Experts / ranks, FP8: c.FP8, Nodes: nodes}, nil
}

// LowLatencySizeHint is the workspace bytes a LowLatency buffer allocates
// per rank (the workspace of both buffer sets; across nodes with the send
// regions).
func LowLatencySizeHint(c LowLatencyConfig, ranks int) (int, error) {
	lc, err := c.layoutConfig(ranks)
	if err != nil {
		return 0, err
	}
	return lowlatency.SizeHint(lc)
}

// LowLatency is one rank's low-latency (decode) buffer: two alternating
// buffer sets in one NVLink workspace shared with every peer, launched
// without any host synchronisation (lowlatency package). It runs calls;
// package ep validates them and keeps the handles.
type LowLatency struct {
	cfg   LowLatencyConfig
	rank  int
	ranks int
	user  device.Device
	dev   *accounting
	ctx   *cuda.Context
	bs    bootstrap.Bootstrap
	comm  *channels.Communicator

	ws     device.Buffer
	conn   *lowlatency.Connection
	stream device.Stream
	work   lowlatency.Workspace
	launch lowlatency.LaunchConfig
	waitID uint32

	mu     sync.Mutex
	events []*Event
	closed bool
	broken error
}

// NewLowLatency builds rank bs.Rank()'s low-latency buffer; every rank
// calls it at once with the same config.
func NewLowLatency(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, cfg LowLatencyConfig) (_ *LowLatency, err error) {
	if bs == nil || dev == nil {
		return nil, errors.New("buffer: NewLowLatency needs a bootstrap and a device")
	}
	lc, err := cfg.layoutConfig(bs.Size())
	if err != nil {
		return nil, fmt.Errorf("buffer: rank %d: %w", bs.Rank(), err)
	}
	if cfg.VirtualNodes < 0 {
		return nil, fmt.Errorf("buffer: rank %d: low latency: virtual nodes %d: want 0 or a count that divides %d ranks", bs.Rank(), cfg.VirtualNodes, bs.Size())
	}
	// The one-node layout checks everything but the split, which the
	// communicator's topology gives below.
	lc.Nodes = 0
	l, err := lowlatency.NewLayout(lc)
	if err != nil {
		return nil, fmt.Errorf("buffer: rank %d: %w", bs.Rank(), err)
	}
	b := &LowLatency{cfg: cfg, rank: bs.Rank(), ranks: bs.Size(), user: dev, dev: newAccounting(dev), ctx: cudaContext(dev), bs: bs}
	if dev.Info().Kind == device.CUDA && b.ctx == nil {
		return nil, b.errorf("a CUDA device must have Context() (a wrapping Device must forward it)")
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.free())
		}
	}()
	mine := fmt.Sprintf("lowlatency tokens=%d hidden=%d topk=%d experts=%d fp8=%v nodes=%d virtual-nodes=%d tag=%d",
		cfg.MaxTokens, cfg.Hidden, cfg.TopK, cfg.Experts, cfg.FP8, cfg.Nodes, cfg.VirtualNodes, cfg.Tag)
	if err := sameConfig(ctx, bs, b.rank, b.ranks, b.tag(tagConfig), "config", mine); err != nil {
		return nil, b.errorf("%w", err)
	}
	if b.comm, err = channels.NewCommunicator(bs, b.dev, channels.Config{Timeouts: channels.Timeouts{Wait: cfg.Timeout},
		Network: channels.NetworkConfig{VirtualNodes: cfg.VirtualNodes}}); err != nil {
		return nil, b.errorf("%w", err)
	}
	// The nodes (hosts, or virtual nodes) decide the transport to each
	// peer: one call path, the kernels take direct stores inside a node
	// and port channels across.
	ct, err := b.comm.Topology(ctx)
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	topo, err := internode.FromNodeOf(ct.NodeOf)
	if err != nil {
		return nil, b.errorf("nodes of the group: %w", err)
	}
	if cfg.Nodes != 0 && cfg.Nodes != topo.Nodes {
		return nil, b.errorf("the configuration says %d nodes, the communicator found %v", cfg.Nodes, topo)
	}
	if topo.Nodes > 1 {
		lc.Nodes = topo.Nodes
		if l, err = lowlatency.NewLayout(lc); err != nil {
			return nil, b.errorf("%v: %w", topo, err)
		}
	}
	b.waitID = b.comm.NewWaitID(fmt.Sprintf("ep low-latency buffer %d kernels", cfg.Tag))
	pl, err := b.comm.Placement(ctx)
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	// Every low-latency launch may wait on peers: all ranks sharing a GPU
	// must be resident at once. A default grid shrinks to the share; a
	// configured one above it is refused (by the launchers).
	// A zero NumSMs stays zero: the launchers pick lowlatency.DefaultSMs
	// (every SM, or the host backend's small grid) within the share.
	b.launch = lowlatency.LaunchConfig{NumSMs: cfg.NumSMs, Threads: cfg.Threads}
	if pl.SpinBlocks > 0 && b.launch.NumSMs > pl.SpinBlocks {
		return nil, b.errorf("low latency grid of %d blocks exceeds this rank's share of its GPU (%d blocks)", b.launch.NumSMs, pl.SpinBlocks)
	}
	if err := b.dev.Preload(lowlatency.Kernels...); err != nil {
		return nil, b.errorf("%w", err)
	}
	if b.ws, err = b.dev.Alloc(l.Size); err != nil {
		return nil, b.errorf("low latency workspace (%d bytes): %w", l.Size, err)
	}
	if err := b.dev.CopyIn(b.ws.Ptr+uintptr(l.Ctrl.Offset), make([]byte, l.Ctrl.Size)); err != nil {
		return nil, b.errorf("zero the control block: %w", err)
	}
	if b.stream, err = b.dev.NewStream(); err != nil {
		return nil, b.errorf("stream: %w", err)
	}
	// Tags: the buffer's tag space (b.tag) is for bootstrap meetings; the
	// workspace and port-channel exchanges are the communicator's, paired
	// by tag and tag+1 as the normal Buffer's exchange uses cfg.Tag.
	if b.conn, b.work, err = lowlatency.Connect(ctx, b.comm, b.ws, l, cfg.Tag); err != nil {
		return nil, b.errorf("%w", err)
	}
	b.work.WaitID, b.work.SpinBlocks = b.waitID, pl.SpinBlocks
	if err := b.work.Validate(); err != nil {
		return nil, b.errorf("%w", err)
	}
	if _, err := b.exchangeAll(ctx, tagReady, nil); err != nil {
		return nil, b.errorf("meeting the peers: %w", err)
	}
	return b, nil
}

func (b *LowLatency) errorf(format string, a ...any) error {
	return fmt.Errorf("buffer: rank %d: low latency: "+format, append([]any{b.rank}, a...)...)
}

func (b *LowLatency) tag(kind int) int { return tagBase | b.cfg.Tag<<8 | 0x80 | kind }

func (b *LowLatency) exchangeAll(ctx context.Context, kind int, msg []byte) ([][]byte, error) {
	return exchangeAll(ctx, b.bs, b.rank, b.ranks, b.tag(kind), msg)
}

// Rank, Ranks, Mode, Device, Stream, Workspace describe the buffer (zero
// values on a nil *LowLatency; Stream is nil once closed).
func (b *LowLatency) Rank() int {
	if b == nil {
		return 0
	}
	return b.rank
}

func (b *LowLatency) Ranks() int {
	if b == nil {
		return 0
	}
	return b.ranks
}

func (b *LowLatency) Mode() Mode { return LowLatencyMode }

func (b *LowLatency) Device() device.Device {
	if b == nil {
		return nil
	}
	return b.user
}

// Stream reads under the lock: Close marks the buffer closed under it
// before free drops the stream, so a concurrent reader never sees a
// closed stream.
func (b *LowLatency) Stream() device.Stream {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	return b.stream
}

// Memory is what the buffer holds now (zero on a nil *LowLatency).
func (b *LowLatency) Memory() Memory {
	if b == nil || b.dev == nil {
		return Memory{}
	}
	return b.dev.live()
}

// LLDispatch is one dispatch step's arguments (validated by package ep;
// formats and phases as in package lowlatency: Format 0 BF16, 1 FP8,
// 2 UE8M0; Phase 1 send, 2 receive, 3 both).
type LLDispatch struct {
	Set                   int
	X, TopK, Weights      uintptr
	IDs64                 bool
	Tokens, Format, Phase int
	RankMajor, Elastic    bool
}

// LLCombine is one combine step's arguments.
type LLCombine struct {
	Set, Tokens, Phase       int
	Y, YScales, Out          uintptr
	YFP8, RankMajor, Elastic bool
}

// Dispatch enqueues a dispatch step.
func (b *LowLatency) Dispatch(s device.Stream, a LLDispatch) error {
	if err := b.Check(); err != nil {
		return err
	}
	la := lowlatency.DispatchArgs{Set: a.Set, X: a.X, TopK: a.TopK, IDs64: a.IDs64, Weights: a.Weights, Tokens: a.Tokens,
		Format: lowlatency.Format(a.Format), RankMajor: a.RankMajor, Phase: lowlatency.Phase(a.Phase), Elastic: a.Elastic}
	if err := b.work.Dispatch(b.dev, s, la, b.launch); err != nil {
		return b.Fail(b.errorf("%w", err))
	}
	return nil
}

// Combine enqueues a combine step.
func (b *LowLatency) Combine(s device.Stream, a LLCombine) error {
	if err := b.Check(); err != nil {
		return err
	}
	la := lowlatency.CombineArgs{Set: a.Set, Tokens: a.Tokens, Y: a.Y, YScales: a.YScales, YFP8: a.YFP8, Out: a.Out,
		RankMajor: a.RankMajor, Phase: lowlatency.Phase(a.Phase), Elastic: a.Elastic}
	if err := b.work.Combine(b.dev, s, la, b.launch); err != nil {
		return b.Fail(b.errorf("%w", err))
	}
	return nil
}

// LLViews are a set's outputs (device addresses; shapes in package
// lowlatency: RecvViews, RankMajorViews, CombineBuffer).
type LLViews struct {
	X, Scales, SrcInfo, LayoutRange, Count          uintptr // expert-major
	RMX, RMScales, RMIDs, RMWeights, RMTokens       uintptr // rank-major
	CombineX, CombineS                              uintptr // zero-copy combine input
	Mask                                            uintptr // u32 mask word
	Invalid                                         uintptr // u32: ids outside [-1, E) in the set's last dispatch
	LocalExperts, Slots, PackedScales, ScalesPerRow int
}

// Views returns set's outputs.
func (b *LowLatency) Views(set int) LLViews {
	if b == nil {
		return LLViews{}
	}
	w := &b.work
	r, m, c := w.Recv(set), w.RankMajor(set), w.CombineBuffer(set)
	l := w.Layout
	return LLViews{X: r.X, Scales: r.Scales, SrcInfo: r.SrcInfo, LayoutRange: r.LayoutRange, Count: r.Count,
		RMX: m.X, RMScales: m.Scales, RMIDs: m.IDs, RMWeights: m.Weights, RMTokens: m.Tokens,
		CombineX: c.X, CombineS: c.S, Mask: w.MaskPtr(), Invalid: w.InvalidPtr(set),
		LocalExperts: l.LocalExperts, Slots: l.Slots(), PackedScales: l.PackedScalesPerRow(), ScalesPerRow: l.ScalesPerRow()}
}

// SetMask enqueues a mask update on s: op 0 sets the mask to value, 1
// masks the ranks in value, 2 unmasks them.
func (b *LowLatency) SetMask(s device.Stream, op int, value uint32) error {
	if err := b.Check(); err != nil {
		return err
	}
	if err := b.work.SetMask(b.dev, s, lowlatency.MaskOp(op), value); err != nil {
		return b.errorf("%w", err)
	}
	return nil
}

// MaskNow reads the mask word (the caller synchronises the stream first).
func (b *LowLatency) MaskNow() (uint32, error) {
	if err := b.Check(); err != nil {
		return 0, err
	}
	var w [4]byte
	if err := b.dev.CopyOut(w[:], b.work.MaskPtr()); err != nil {
		return 0, b.errorf("read the mask: %w", err)
	}
	return binary.LittleEndian.Uint32(w[:]), nil
}

// PhaseTrace reads this rank's phase-trace region (lowlatency.TraceBytes;
// lowlatency.ParseTrace decodes it): per-block stamps of the last dispatch
// and combine, written only by kernels built with GOEP_LL_TRACE=1 (zero
// otherwise). Synchronous: the caller synchronises the calls' stream first.
func (b *LowLatency) PhaseTrace() ([]byte, error) {
	if err := b.Check(); err != nil {
		return nil, err
	}
	raw := make([]byte, lowlatency.TraceBytes)
	if err := b.dev.CopyOut(raw, b.work.TracePtr()); err != nil {
		return nil, b.errorf("read the phase trace: %w", err)
	}
	return raw, nil
}

// CopyOut is a synchronous device-to-host copy (counts on request).
func (b *LowLatency) CopyOut(dst []byte, src uintptr) error {
	if b == nil || b.dev == nil {
		return errors.New("buffer: nil low-latency buffer")
	}
	return b.dev.CopyOut(dst, src)
}

// NewEvent creates an event closed with the buffer.
func (b *LowLatency) NewEvent() (*Event, error) {
	if err := b.Check(); err != nil {
		return nil, err
	}
	e, err := newEvent(b.ctx)
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	b.mu.Lock()
	b.events = append(b.events, e)
	b.mu.Unlock()
	return e, nil
}

// Check returns nil while the buffer is usable, else why not (a device
// timeout names the stage and the rank waited on).
func (b *LowLatency) Check() error {
	if b == nil {
		return errors.New("buffer: nil low-latency buffer")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.errorf("%w", channels.ErrClosed)
	}
	if b.broken != nil {
		return b.broken
	}
	if err := b.comm.Check(); err != nil {
		var te *channels.TimeoutError
		if errors.As(err, &te) && te.ID == b.waitID {
			b.broken = b.errorf("%s timed out waiting on rank %d; the buffer is unusable until Close: %w",
				lowlatency.StageName(te.Stage), te.Peer, err)
		} else {
			b.broken = b.errorf("unusable: %w", err)
		}
		return b.broken
	}
	return nil
}

// Fail makes the buffer unusable with err (the first error wins).
func (b *LowLatency) Fail(err error) error {
	if b == nil {
		return errors.Join(errors.New("buffer: nil low-latency buffer"), err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return firstFailure(&b.broken, b.closed, err)
}

// Close synchronises the buffer's stream, meets every rank and frees
// everything. Collective; callers synchronise their own streams first.
func (b *LowLatency) Close(ctx context.Context) error {
	if b == nil || b.dev == nil { // nil, or not made by NewLowLatency: nothing to free
		return nil
	}
	if markClosed(&b.mu, &b.closed) {
		return nil
	}
	var errs []error
	if err := b.stream.Synchronize(); err != nil {
		errs = append(errs, b.errorf("close: stream: %w", err))
	}
	// Across nodes the proxy may still carry this rank's last puts and
	// counter adds into peers' workspaces: it drains before the meeting,
	// after which every rank may free its workspace.
	conn := b.conn
	if err := conn.Close(); err != nil {
		errs = append(errs, b.errorf("close: port channels: %w", err))
	}
	b.conn = nil
	if _, err := b.exchangeAll(ctx, tagClose, nil); err != nil {
		errs = append(errs, b.errorf("close: meeting the peers: %w", err))
	}
	// Then withdrawn from the network transport: a put that arrives
	// after all (a peer that missed the meeting) is refused, not written
	// into the freed workspace. Kept (a leak) if one is still being applied.
	if err := conn.Withdraw(); err != nil {
		errs = append(errs, b.errorf("close: %w (the workspace is not freed)", err))
		b.ws = device.Buffer{}
	}
	errs = append(errs, b.free())
	return errors.Join(errs...)
}

func (b *LowLatency) free() error {
	var errs []error
	b.mu.Lock()
	events := b.events
	b.events = nil
	b.mu.Unlock()
	for _, e := range events {
		errs = append(errs, e.Close())
	}
	if b.stream != nil {
		errs = append(errs, b.stream.Close())
		b.stream = nil
	}
	if b.conn != nil {
		errs = append(errs, b.conn.Close())
		b.conn = nil
	}
	if b.ws.Ptr != 0 {
		errs = append(errs, b.dev.Free(b.ws))
		b.ws = device.Buffer{}
	}
	if b.comm != nil {
		errs = append(errs, b.comm.Close())
		b.comm = nil
	}
	if m := b.dev.live(); m.Allocations != 0 || m.HostAllocations != 0 {
		errs = append(errs, b.errorf("close: %d device allocations (%d bytes) and %d host-mapped still held",
			m.Allocations, m.Device, m.HostAllocations))
	}
	return errors.Join(errs...)
}
