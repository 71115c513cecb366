package buffer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// Buffer is one rank's EP buffer: the memory every dispatch and combine of
// a group of ranks on one node works in, built collectively over a
// bootstrap and a channels.Communicator:
//
//   - the NVLink workspace (intranode.Layout), registered with the
//     communicator and exchanged with every peer (CUDA IPC between
//     processes, peer access between goroutine ranks), and the peer table
//     on the GPU that kernels index by rank;
//   - handle slots: the device part of dispatch handles;
//   - the dispatch-layout kernel's outputs and workspace, and a default
//     combine output;
//   - memory semaphores with every peer for the device barrier (Barrier),
//     and the communicator's watchdog, which bounds every device-side wait;
//   - pinned host-mapped counters the kernels write and the host polls;
//   - scratch for int32 top-k ids widened to int64;
//   - a stream of its own and the events it hands out.
//
// The Buffer picks its mode (Mode) once, in New, and runs every call of
// that mode (calls.go); package ep validates the arguments and turns the
// outcomes into tensors. Methods are safe for concurrent use, but the
// collective ones (New, Dispatch, Combine, Barrier, Close) must be called
// in the same order on every rank.
type Buffer struct {
	mode  Mode
	cfg   Config
	hint  SizeHint
	rank  int
	ranks int
	user  device.Device // the caller's device
	dev   *accounting   // what everything here allocates through
	ctx   *cuda.Context // nil on the host backend
	bs    bootstrap.Bootstrap
	comm  *channels.Communicator

	ws       device.Buffer
	table    device.Buffer
	slots    device.Buffer
	layout   device.Buffer
	combine  device.Buffer
	barrier  device.Buffer
	ids      device.Buffer
	mapped   device.HostMapped
	sems     *channels.DeviceArray
	stream   device.Stream
	waitID   uint32
	work     intranode.Workspace
	inter    *interState // the internode mode's state (nil in intranode)
	slotPlan handleSlot
	outPlan  layoutPlace

	// Launches: resolved defaults, and this rank's share of its GPU.
	dispatchLaunch, combineLaunch LaunchConfig
	spinBlocks, sharedGPU         int

	// calls is held (read) by every call for its whole run and taken by
	// Close before it frees anything, so nothing frees memory a call is
	// still reading.
	calls sync.RWMutex

	mu     sync.Mutex // guards the fields below, and mapped reads
	events []*Event
	pool   *eventPool
	closed bool
	broken error
}

// Bootstrap tags of the Buffer's own messages (config check, close
// barrier): below the communicator's tag space (1<<40), one range per
// Config.Tag.
const (
	tagBase   = 1 << 39
	tagConfig = 1
	tagReady  = 2
	tagClose  = 3
	// tagBarrier and tagClosed: the internode mode's host barrier, and its
	// meeting after the Notify is closed.
	tagBarrier = 4
	tagClosed  = 5
)

func (b *Buffer) tag(kind int) int { return tagBase | b.cfg.Tag<<8 | kind }

// StageBarrier is the stage of the device barrier's waits in timeout
// records (the intranode kernels use 1..5).
const StageBarrier = 100

// New builds rank bs.Rank()'s Buffer on dev: every rank of the bootstrap
// calls it at the same time with the same Config. It allocates and
// exchanges everything up front; no call on the Buffer allocates device
// memory afterwards. dev and bs stay the caller's: Close does not close
// them.
func New(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, cfg Config) (_ *Buffer, err error) {
	if bs == nil || dev == nil || ctx == nil {
		return nil, errors.New("buffer: New needs a context, a bootstrap and a device")
	}
	if err := ctx.Err(); err != nil {
		return nil, ctxError(fmt.Sprintf("buffer: rank %d: new", bs.Rank()), err)
	}
	hint, err := SizeHints(cfg, bs.Size())
	if err != nil {
		return nil, fmt.Errorf("buffer: rank %d: %w", bs.Rank(), err)
	}
	// The mode is picked below, once the communicator knows the nodes.
	b := &Buffer{mode: Intranode, cfg: cfg, hint: hint, rank: bs.Rank(), ranks: bs.Size(), user: dev, dev: newAccounting(dev), bs: bs,
		ctx: cudaContext(dev)}
	if dev.Info().Kind == device.CUDA && b.ctx == nil {
		return nil, fmt.Errorf("buffer: rank %d: a CUDA device must have Context() (a wrapping Device must forward it)", b.rank)
	}
	ic := hint.Layout.Config
	b.slotPlan, b.outPlan = slotLayout(ic), layoutOutputs(ic)
	defer func() {
		if err != nil {
			err = errors.Join(err, b.free())
		}
	}()
	if b.pool, err = newEventPool(b.ctx, cfg.events()); err != nil {
		return nil, b.errorf("%w", err)
	}
	if err := b.checkConfigs(ctx); err != nil {
		return nil, err
	}
	if b.comm, err = channels.NewCommunicator(bs, b.dev.forComm(), channels.Config{Timeouts: channels.Timeouts{Wait: cfg.Timeout},
		Network: channels.NetworkConfig{VirtualNodes: cfg.VirtualNodes}}); err != nil {
		return nil, b.errorf("%w", err)
	}
	// One place picks the mode: one node (a host, or no virtual split) runs
	// intranode, several run internode.
	topo, err := b.topology(ctx)
	if err != nil {
		return nil, err
	}
	if topo.Nodes > 1 {
		b.mode = Internode
		if b.hint, err = internodeSizeHints(cfg, topo); err != nil {
			return nil, b.errorf("%w", err)
		}
		ic := intranode.Config{Ranks: b.ranks, MaxTokens: cfg.MaxTokens, Hidden: cfg.Hidden, TopK: cfg.TopK, LocalExperts: cfg.Experts / b.ranks, FP8: cfg.FP8}
		b.slotPlan, b.outPlan = slotLayout(ic), layoutOutputs(ic)
	} else if hint.Nodes > 1 {
		return nil, b.errorf("the configuration asks for %d virtual nodes, the communicator found one node", hint.Nodes)
	}
	b.waitID = b.comm.NewWaitID(fmt.Sprintf("ep buffer %d %s kernels", cfg.Tag, b.mode))
	if err := b.placeLaunches(ctx); err != nil {
		return nil, err
	}
	if b.mode == Internode {
		if err := b.newInternode(ctx, topo); err != nil {
			return nil, err
		}
		if _, err := b.exchangeAll(ctx, tagReady, nil); err != nil {
			return nil, b.errorf("meeting the peers: %w", timeoutError(err))
		}
		return b, nil
	}
	if err := b.preload(); err != nil {
		return nil, err
	}
	if err := b.allocate(); err != nil {
		return nil, err
	}
	if err := b.exchange(ctx); err != nil {
		return nil, err
	}
	// Nobody launches into a peer's workspace before every rank has it.
	if _, err := b.exchangeAll(ctx, tagReady, nil); err != nil {
		return nil, b.errorf("meeting the peers: %w", timeoutError(err))
	}
	return b, nil
}

func (b *Buffer) errorf(format string, a ...any) error {
	return fmt.Errorf("buffer: rank %d: "+format, append([]any{b.rank}, a...)...)
}

// checkConfigs compares this rank's shared configuration with every
// peer's (sameConfig).
func (b *Buffer) checkConfigs(ctx context.Context) error {
	c := b.cfg
	mine := fmt.Sprintf("tokens=%d hidden=%d topk=%d experts=%d fp8=%v workspace=%d tag=%d nodes=%dx%d",
		c.MaxTokens, c.Hidden, c.TopK, c.Experts, c.FP8, b.hint.Workspace, c.Tag, b.hint.Nodes, b.hint.RanksPerNode)
	if err := sameConfig(ctx, b.bs, b.rank, b.ranks, b.tag(tagConfig), "Buffer config", mine); err != nil {
		return b.errorf("%w", err)
	}
	return nil
}

// placeLaunches learns which ranks share this rank's GPU and resolves the
// launch configurations within this rank's share of it.
func (b *Buffer) placeLaunches(ctx context.Context) error {
	pl, err := b.comm.Placement(ctx)
	if err != nil {
		return b.errorf("%w", err)
	}
	b.spinBlocks, b.sharedGPU = pl.SpinBlocks, len(pl.SharedGPU)
	if b.dispatchLaunch, err = b.cfg.Dispatch.resolveWithin(b.ranks, OpDispatch, b.spinBlocks); err != nil {
		return b.errorf("%w", err)
	}
	if b.combineLaunch, err = b.cfg.Combine.resolveWithin(b.ranks, OpCombine, b.spinBlocks); err != nil {
		return b.errorf("%w", err)
	}
	if n := b.ranks - 1; b.spinBlocks > 0 && n > b.spinBlocks {
		return b.errorf("the device barrier waits with one block per peer (%d), more than this rank's share of its GPU (%d blocks)", n, b.spinBlocks)
	}
	return nil
}

// preload loads every kernel a call may launch before the ranks meet for
// the last time in New: a first launch must never load code while a peer's
// kernel spins waiting for this rank (ranks sharing a GPU share its
// context, and a module load waits for the kernels running there).
func (b *Buffer) preload() error {
	if err := b.dev.Preload(intranode.KernelNotify, routing.KernelWidenIDs, routing.KernelLayoutInt64,
		devapi.KernelChanSemSignal); err != nil {
		return b.errorf("%w", err)
	}
	// The TMA dispatch is its own module, so that a toolchain that rejects
	// its bulk-copy PTX costs that variant only: a failure shows at its
	// launch, for a caller who asked for it.
	_ = b.dev.Preload(intranode.KernelDispatchTMA)
	return nil
}

// exchangeAll sends msg to every peer under the Buffer's tag and returns
// theirs (nil at this rank's index), sending to all before receiving.
func (b *Buffer) exchangeAll(ctx context.Context, kind int, msg []byte) ([][]byte, error) {
	return exchangeAll(ctx, b.bs, b.rank, b.ranks, b.tag(kind), msg)
}

// allocate makes every allocation and zeroes what must start zeroed.
func (b *Buffer) allocate() (err error) {
	d, h := b.dev, b.hint
	alloc := func(what string, dst *device.Buffer, n int) {
		if err == nil && n > 0 {
			if *dst, err = d.Alloc(n); err != nil {
				err = b.errorf("%s (%d bytes): %w", what, n, err)
			}
		}
	}
	alloc("NVLink workspace", &b.ws, h.Workspace)
	alloc("peer table", &b.table, h.PeerTable)
	alloc("handle slots", &b.slots, h.Handles)
	alloc("layout outputs", &b.layout, h.LayoutOutputs)
	alloc("combine outputs", &b.combine, h.CombineOutputs)
	alloc("barrier scratch", &b.barrier, h.Barrier)
	alloc("top-k id scratch", &b.ids, h.IDScratch)
	if err != nil {
		return err
	}
	if b.mapped, err = d.AllocHostMapped(h.HostMapped); err != nil {
		return b.errorf("host-mapped counters: %w", err)
	}
	clear(b.mapped.Host) // pinned memory comes uninitialised
	b.storeMapped(mappedRecvCount, -1)
	// The kernels never clear the workspace's control block, and the
	// layout kernel leaves its workspace zeroed after every launch: both
	// must start at zero.
	l := h.Layout
	if err := d.CopyIn(b.ws.Ptr+uintptr(l.Ctrl.Offset), make([]byte, l.Ctrl.Size)); err != nil {
		return b.errorf("zero the control block: %w", err)
	}
	if err := d.CopyIn(b.layout.Ptr+uintptr(b.outPlan.workspace), make([]byte, routing.LayoutWorkspaceBytes)); err != nil {
		return b.errorf("zero the layout workspace: %w", err)
	}
	if b.stream, err = d.NewStream(); err != nil {
		return b.errorf("stream: %w", err)
	}
	return nil
}

// exchange registers the workspace with the communicator, opens every
// peer's, uploads the peer table and builds the barrier's semaphores.
func (b *Buffer) exchange(ctx context.Context) error {
	peers, err := exchangeWorkspaces(ctx, b.comm, b.dev, b.ws, b.table, b.rank, b.ranks, b.cfg.Tag, b.hint.Layout.Size)
	if err != nil {
		return b.errorf("%w", err)
	}
	b.work = intranode.Workspace{Layout: b.hint.Layout, Rank: b.rank, Base: b.ws.Ptr, Size: b.ws.Size,
		Peers: b.table.Ptr, Watchdog: b.comm.Watchdog(), WaitID: b.waitID, SpinBlocks: b.spinBlocks}
	if err := b.work.Validate(); err != nil {
		return b.errorf("%w", err)
	}
	if len(peers) == 0 {
		return nil
	}
	conns, err := b.comm.ConnectAll(ctx, peers, b.cfg.Tag)
	if err != nil {
		return b.errorf("connect: %w", err)
	}
	sems, err := b.comm.NewMemorySemaphores(ctx, conns)
	if err != nil {
		return b.errorf("semaphores: %w", err)
	}
	list := make([]channels.Semaphore, len(sems))
	for i, s := range sems {
		list[i] = s
	}
	if b.sems, err = b.comm.UploadSemaphores(list); err != nil {
		return b.errorf("semaphores: %w", err)
	}
	return nil
}

// Mode is the protocol a Buffer runs its calls with.
type Mode string

// Modes. Low-latency decode is its own Buffer (LowLatency).
const (
	// Intranode: every rank of the group on one node, over NVLink (or
	// host memory on the host backend).
	Intranode Mode = "intranode"
	// Internode: ranks on several nodes (hosts, or virtual nodes of one
	// host: Config.VirtualNodes, $GOEP_VIRTUAL_NODES), package internode's
	// protocol: network between nodes, NVLink forwarding inside. Host
	// backend only until its GPU kernels land.
	Internode Mode = "internode"
)

// Mode is the protocol this Buffer runs (chosen by New from the group).
// Accessors are safe on a nil *Buffer (zero values) and after Close.
func (b *Buffer) Mode() Mode {
	if b == nil {
		return ""
	}
	return b.mode
}

// Rank is this rank; Ranks the group size.
func (b *Buffer) Rank() int {
	if b == nil {
		return 0
	}
	return b.rank
}

// Ranks is the number of ranks in the group.
func (b *Buffer) Ranks() int {
	if b == nil {
		return 0
	}
	return b.ranks
}

// Config is the configuration the Buffer was built with.
func (b *Buffer) Config() Config {
	if b == nil {
		return Config{}
	}
	return b.cfg
}

// SizeHint is what the Buffer was sized with.
func (b *Buffer) SizeHint() SizeHint {
	if b == nil {
		return SizeHint{}
	}
	return b.hint
}

// Device is the caller's device.
func (b *Buffer) Device() device.Device {
	if b == nil {
		return nil
	}
	return b.user
}

// Stream is the Buffer's own stream (nil once closed).
func (b *Buffer) Stream() device.Stream {
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

// Memory reports what the Buffer holds now on this rank, its communicator
// included (nothing once closed).
func (b *Buffer) Memory() Memory {
	if b == nil || b.dev == nil {
		return Memory{}
	}
	return b.dev.live()
}

// HandleSlots is the number of handle slots.
func (b *Buffer) HandleSlots() int {
	if b == nil {
		return 0
	}
	return b.cfg.handles()
}

// Events reports the pool of Done events: how many are held by results
// the engine has not released, the pool's size, and how many held events
// were recycled because the ring wrapped (each one an engine bug that
// Event methods report as ErrEventRecycled).
func (b *Buffer) Events() (held, size int, wraps uint64) {
	if b == nil || b.pool == nil {
		return 0, 0, 0
	}
	return b.pool.stats()
}

func (b *Buffer) mappedI32(off int) *atomic.Int32 {
	return (*atomic.Int32)(unsafe.Pointer(&b.mapped.Host[off]))
}

func (b *Buffer) storeMapped(off int, v int32) { b.mappedI32(off).Store(v) }

// loadMapped reads a host-mapped counter, 0 once closed: it holds b.mu,
// which Close takes before freeing, so a reader on another goroutine never
// touches freed memory.
func (b *Buffer) loadMapped(off int) int32 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.mapped.Host) < off+4 {
		return 0
	}
	return b.mappedI32(off).Load()
}

// NotifyInvalid reads the invalid-id count the last notify wrote (complete
// once its stream has passed it); LayoutInvalid the layout kernel's. Both
// are 0 once closed.
func (b *Buffer) NotifyInvalid() int { return int(b.loadMapped(mappedNotifyInvalid)) }

// LayoutInvalid reads the invalid-id count of the last layout launch.
func (b *Buffer) LayoutInvalid() int { return int(b.loadMapped(mappedLayoutInvalid)) }

// expertCounts reads the host-mapped per-local-expert counts of the last
// notify that wrote them.
func (b *Buffer) expertCounts() []int {
	out := make([]int, b.hint.Layout.LocalExperts)
	for i := range out {
		out[i] = int(b.mappedI32(mappedExpertCounts + 4*i).Load())
	}
	return out
}

// busyPoll is how long waitRecvCount polls without sleeping.
const busyPoll = 5 * time.Millisecond

// waitRecvCount polls the host-mapped received count until the notify
// kernel writes it (what DeepEP's host does before it sizes outputs). It
// gives up on ctx, on a device-side timeout of this rank (the watchdog's
// record), or when nothing arrives within the wait timeout plus a second
// (the stream never reached the kernel); each makes the Buffer unusable.
// The caller holds b.calls, so the counters stay mapped.
func (b *Buffer) waitRecvCount(ctx context.Context, what string) (int, error) {
	p := b.mappedI32(mappedRecvCount)
	if n := p.Load(); n >= 0 {
		return int(n), nil
	}
	limit := b.comm.Timeouts().Wait + time.Second
	start := time.Now()
	for i := 0; ; i++ {
		if n := p.Load(); n >= 0 {
			return int(n), nil
		}
		if err := b.Check(); err != nil {
			return 0, err
		}
		if err := ctx.Err(); err != nil {
			return 0, b.Fail(ctxError(fmt.Sprintf("buffer: rank %d: %s: waiting for the received count", b.rank, what), err))
		}
		if time.Since(start) > limit {
			return 0, b.Fail(b.errorf("%s: the received count did not arrive within %s (is the stream blocked?): %w", what, limit, channels.ErrTimeout))
		}
		// Busy-poll (yielding) while the count is expected soon, as DeepEP's
		// host does: a timer sleep overshoots by tens of microseconds or more,
		// which is the whole budget of a small dispatch. Past that, sleep.
		if time.Since(start) < busyPoll {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// NewEvent creates an event on the Buffer's device, closed with the
// Buffer unless closed before.
func (b *Buffer) NewEvent() (*Event, error) {
	if b == nil {
		return nil, errNil
	}
	if err := b.Usable(); err != nil {
		return nil, err
	}
	e, err := newEvent(b.ctx)
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed { // closed meanwhile: nobody would close e
		return nil, errors.Join(b.errorf("%w", channels.ErrClosed), e.Close())
	}
	b.events = append(b.events, e)
	return e, nil
}

// CallEvent is a new call's Done event from the Buffer's pool (see
// Event): bound to that call until the engine releases it or the pool's
// ring wraps (Config.Events).
func (b *Buffer) CallEvent() (*Event, error) {
	if b == nil {
		return nil, errNil
	}
	if err := b.Usable(); err != nil {
		return nil, err
	}
	e, err := b.pool.get()
	if err != nil {
		return nil, b.errorf("%w", err)
	}
	return e, nil
}

// IsCapturing reports whether s is being captured into a CUDA graph
// (never on the host backend).
func (b *Buffer) IsCapturing(s device.Stream) (bool, error) {
	if b == nil {
		return false, errNil
	}
	if b.ctx == nil {
		return false, nil
	}
	if err := b.Usable(); err != nil {
		return false, err
	}
	var h uintptr
	if s != nil {
		h = s.Handle()
	}
	st, err := cuda.WrapStream(b.ctx, h).CaptureStatus()
	if err != nil {
		return false, b.errorf("capture status: %w", err)
	}
	return st != cuda.CaptureStatusNone, nil
}

// Barrier enqueues a device-side barrier on s over the memory semaphores:
// work issued on s after it starts only once every rank's stream has
// reached its own Barrier. Its waits are bounded like the kernels'; a
// timeout names the rank that never arrived (Check).
func (b *Buffer) Barrier(s device.Stream) error {
	if b == nil {
		return errNil
	}
	b.calls.RLock()
	defer b.calls.RUnlock()
	if err := b.Usable(); err != nil {
		return err
	}
	if b.mode == Internode {
		return b.barrierInternode(s)
	}
	if b.sems == nil {
		return nil
	}
	n := b.sems.Len()
	stride := uint32(b.sems.Stride())
	sig := device.NewArgs(5).Ptr(b.sems.Ptr()).U32(stride).U32(0).U32(1).U32(0)
	if err := b.dev.Launch(devapi.KernelChanSemSignal, device.D1(n), device.D1(32), 0, s, sig); err != nil {
		return b.Fail(b.errorf("barrier signal: %w", err))
	}
	wait := device.NewArgs(7).Ptr(b.sems.Ptr()).U32(stride).U32(0).U32(1).U32(0).U32(StageBarrier).Ptr(b.barrier.Ptr)
	if err := b.dev.Launch(devapi.KernelChanSemWait, device.D1(n), device.D1(32), 0, s, wait); err != nil {
		return b.Fail(b.errorf("barrier wait: %w", err))
	}
	return nil
}

// ErrMismatch: ranks made different calls (kind, dtype, weights, or
// order); every rank gets a *intranode.MismatchError naming the peer and
// the fields, and the Buffer refuses calls until Close.
var ErrMismatch = intranode.ErrMismatch

// errNil is what methods on a nil *Buffer return.
var errNil = errors.New("buffer: nil Buffer")

// Usable returns nil while the Buffer may be used: not closed, and no
// device-side wait of it has timed out (see Check) nor Fail been called.
func (b *Buffer) Usable() error { return b.Check() }

// Check reports a device-side timeout of this rank's kernels (read from
// the host-mapped record: cheap, may be called while kernels run) or an
// earlier failure; from then on every call returns the same error until
// Close. A timeout error wraps *channels.TimeoutError (errors.As) and names
// the stage and the rank waited on.
func (b *Buffer) Check() error {
	if b == nil {
		return errNil
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
		b.broken = b.describe(err)
		return b.broken
	}
	return nil
}

// describe names the stage of a timeout.
func (b *Buffer) describe(err error) error {
	var te *channels.TimeoutError
	if !errors.As(err, &te) {
		return b.errorf("unusable: %w", err)
	}
	if te.ID == b.waitID && te.Stage == intranode.StageMismatch {
		// Not a timeout: a peer's call fingerprint differed. Every rank of
		// the call sees it (see intranode/fingerprint.go); the protocol
		// state is unknown, so the Buffer stays broken until Close.
		me := intranode.NewMismatchError(b.rank, te.Peer, "intranode", te.Expected, te.Observed)
		return b.errorf("the ranks' calls do not match; the buffer is unusable until Close: %w", me)
	}
	stage := fmt.Sprintf("stage %d", te.Stage)
	switch {
	case te.ID == b.waitID:
		stage = "intranode " + intranode.StageName(te.Stage)
	case te.Stage == StageBarrier:
		stage = "device barrier"
	case b.mode == Internode:
		stage = fmt.Sprintf("internode stage %d", te.Stage)
	}
	return b.errorf("%s timed out waiting on rank %d; the buffer is unusable until Close: %w", stage, te.Peer, err)
}

// Fail makes the Buffer refuse further calls with err (a launch that failed
// after its peers' kernels started leaves the protocol state unknown) and
// returns it; an earlier failure wins.
func (b *Buffer) Fail(err error) error {
	if b == nil {
		return errors.Join(errNil, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return firstFailure(&b.broken, b.closed, err)
}

// Close waits for the Buffer's stream, meets every rank (so that no peer
// still uses this rank's memory: each rank must have synchronised the
// streams it used the Buffer on), then frees everything: workspace, peer
// mappings, slots, counters, events, stream and the communicator. It checks
// that every allocation was freed. The bootstrap and device stay open.
// Close after a failure still meets the peers, bounded by ctx and the
// bootstrap's timeout (a timeout wraps channels.ErrTimeout), and frees
// everything whatever the outcome. It first waits for a call in progress
// on another goroutine; accessors called meanwhile or later return zero
// values and calls return ErrClosed. Closing twice, or a nil Buffer, is a
// no-op.
func (b *Buffer) Close(ctx context.Context) error {
	if b == nil || b.dev == nil { // nil, or not made by New: nothing to free
		return nil
	}
	if ctx == nil {
		ctx = context.Background() // Close must free whatever it is given
	}
	if markClosed(&b.mu, &b.closed) {
		return nil
	}
	b.calls.Lock() // no call is running from here on
	defer b.calls.Unlock()
	var errs []error
	if err := b.stream.Synchronize(); err != nil {
		errs = append(errs, b.errorf("close: stream: %w", err))
	}
	if _, err := b.exchangeAll(ctx, tagClose, nil); err != nil {
		errs = append(errs, b.errorf("close: meeting the peers: %w", timeoutError(err)))
	}
	if b.inter != nil {
		// The Notify's Close drains its proxy, meets every rank and only
		// then frees (no peer's put is in flight toward it); its drain
		// needs the peers' connections: nobody closes its communicator
		// before every rank has closed its Notify.
		errs = append(errs, b.closeInternode())
		if _, err := b.exchangeAll(ctx, tagClosed, nil); err != nil {
			errs = append(errs, b.errorf("close: meeting the peers after the internode close: %w", timeoutError(err)))
		}
	}
	errs = append(errs, b.free())
	return errors.Join(errs...)
}

// free releases everything allocated so far (New's cleanup and Close).
func (b *Buffer) free() error {
	var errs []error
	b.mu.Lock()
	events := b.events
	b.events = nil
	stream := b.stream
	b.stream = nil
	b.mu.Unlock()
	for _, e := range events {
		errs = append(errs, e.Close())
	}
	if b.pool != nil {
		errs = append(errs, b.pool.close())
	}
	if stream != nil {
		errs = append(errs, stream.Close())
	}
	for _, p := range []*device.Buffer{&b.ws, &b.table, &b.slots, &b.layout, &b.combine, &b.barrier, &b.ids} {
		if p.Ptr != 0 {
			errs = append(errs, b.dev.Free(*p))
			*p = device.Buffer{}
		}
	}
	b.mu.Lock()
	mapped := b.mapped
	b.mapped = device.HostMapped{}
	b.mu.Unlock()
	if mapped.Dev != 0 {
		errs = append(errs, b.dev.FreeHostMapped(mapped))
	}
	errs = append(errs, b.closeInternode()) // New's cleanup: Close has done it
	if b.comm != nil {
		errs = append(errs, b.comm.Close()) // peers' mappings, semaphores, watchdog
	}
	if m := b.dev.live(); m.Allocations != 0 || m.HostAllocations != 0 {
		errs = append(errs, b.errorf("close: %d device allocations (%d bytes) and %d host-mapped (%d bytes) still held",
			m.Allocations, m.Device, m.HostAllocations, m.HostMapped))
	}
	return errors.Join(errs...)
}

// timeoutErr marks an error as a timeout for errors.Is(err,
// channels.ErrTimeout) too: bootstrap timeouts and context deadlines are
// timeouts to an engine, like a device-side wait that ran out.
type timeoutErr struct{ err error }

func (e *timeoutErr) Error() string   { return e.err.Error() }
func (e *timeoutErr) Unwrap() []error { return []error{e.err, channels.ErrTimeout} }

// timeoutError wraps err so that it also matches channels.ErrTimeout when
// it is a bootstrap timeout or a context deadline (nil stays nil).
func timeoutError(err error) error {
	if err == nil || errors.Is(err, channels.ErrTimeout) {
		return err
	}
	if errors.Is(err, bootstrap.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return &timeoutErr{err}
	}
	return err
}

// ctxError is what a call whose context ended returns: what it was doing
// and ctx's error, a timeout (channels.ErrTimeout too) on a deadline.
func ctxError(what string, err error) error {
	return timeoutError(fmt.Errorf("%s: %w", what, err))
}

// CtxError is ctxError for package ep: a call refused because its context
// had already ended.
func CtxError(what string, err error) error { return ctxError(what, err) }
