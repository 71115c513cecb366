package ep

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/channels/bootstrap"
)

// Event marks a point in a stream: a CUevent on the CUDA backend (Handle),
// nothing on the host backend. Calls take one in After (the stream waits
// for it first) and return one in Done. Buffer.NewEvent makes one; WrapEvent
// wraps an engine's own CUevent. A call given no Done returns an event of
// the Buffer's pool bound to that call: Release it when nothing will wait
// on it any more; held past Config.Events later calls, it is recycled and
// its methods return ErrEventRecycled. SynchronizeContext blocks the host
// until the event's work is done or ctx ends. Every method is safe on a
// nil *Event and after its Buffer closed (an error, or 0 from Handle).
type Event = buffer.Event

// WrapEvent makes an engine's own CUevent (a cudaEvent_t on dev's GPU)
// usable as After, Done or anywhere an *Event goes: the call's stream waits
// on it with cuStreamWaitEvent, never blocking the host, and Done records
// it. The Event does not own the CUevent (Close does not destroy it; the
// engine keeps it alive while calls that wait on it are being issued) and
// belongs to no Buffer. On the host backend it is a marker that orders
// nothing (host streams run work as it is issued) and handle is ignored.
func WrapEvent(dev Device, handle uintptr) (*Event, error) { return buffer.WrapEvent(dev, handle) }

// Memory is what a Buffer holds on its rank, allocation by allocation.
type Memory = buffer.Memory

// Buffer is one rank's expert-parallel communication buffer on a node: the
// NVLink workspace shared with every other rank of the group, handle
// slots, counters, a stream and a pool of Done events (see package
// buffer). Every rank of the group builds its Buffer at the same time
// (NewBuffer) and then issues the same collective calls (Layout is local;
// Dispatch, Combine and Barrier are collective) in the same order.
//
// Goroutines: a Buffer's methods may be called from any goroutine and are
// serialised by the Buffer, but the collective calls of one Buffer must be
// issued in one order on every rank, so issue them from one goroutine per
// rank. Several Buffers (two micro-batches) are independent: each may be
// driven by its own goroutine, their kernels may run at once on different
// streams, and their Tags must differ when they are built or closed
// concurrently. Check, Memory, InvalidIDs and the accessors may be called
// at any time, even while another goroutine is in a call or in Close.
//
// Every method is safe on a nil *Buffer and after Close: calls return an
// error (ErrClosed after Close), accessors their zero value.
type Buffer struct {
	b     *buffer.Buffer
	cfg   Config
	rank  int
	ranks int

	mu     sync.Mutex // serialises calls
	slots  []*Handle  // live handle of each slot (nil: free)
	poison bool       // GOEP_EP_POISON: poison views when they expire
	// The views of the last call of each kind, poisoned (in debug mode)
	// when the next call of that kind makes them expire.
	lastDispatch, lastCombine, lastLayout []poisonView
}

// NewBuffer builds rank bs.Rank()'s Buffer on dev for a group of bs.Size()
// ranks (1..8 GPUs of one node, or host-backend goroutine ranks; ranks on
// several nodes, or Config.VirtualNodes, run the internode mode: Mode). Every
// rank calls it at the same time with the same Config. All memory is
// allocated here: no call on the Buffer allocates device memory. dev and bs
// stay the caller's; close the Buffer first. A bootstrap timeout or ctx
// deadline satisfies errors.Is(err, ErrTimeout).
func NewBuffer(ctx context.Context, bs bootstrap.Bootstrap, dev Device, cfg Config) (*Buffer, error) {
	if bs == nil || dev == nil || ctx == nil {
		return nil, &argError{errors.New("ep: NewBuffer needs a context, a bootstrap and a device")}
	}
	if _, err := SizeHints(cfg, bs.Size()); err != nil {
		return nil, &argError{fmt.Errorf("ep: rank %d: %w", bs.Rank(), err)}
	}
	b, err := buffer.New(ctx, bs, dev, cfg.buffer())
	if err != nil {
		return nil, err
	}
	return &Buffer{b: b, cfg: cfg, rank: b.Rank(), ranks: b.Ranks(),
		slots: make([]*Handle, b.HandleSlots()), poison: poisonViews()}, nil
}

// Mode is the protocol the Buffer runs: ModeIntranode or ModeInternode
// ("" for a nil Buffer).
func (b *Buffer) Mode() Mode {
	if b == nil {
		return ""
	}
	return b.b.Mode()
}

// Rank is this rank (0 for a nil Buffer).
func (b *Buffer) Rank() int {
	if b == nil {
		return 0
	}
	return b.rank
}

// Ranks is the size of the group (0 for a nil Buffer).
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
	return b.b.SizeHint()
}

// Memory reports the device and host-mapped memory the Buffer holds now
// (zero once closed).
func (b *Buffer) Memory() Memory {
	if b == nil {
		return Memory{}
	}
	return b.b.Memory()
}

// Device is the Buffer's device (nil for a nil Buffer).
func (b *Buffer) Device() Device {
	if b == nil {
		return nil
	}
	return b.b.Device()
}

// Stream is the Buffer's own stream, used by calls whose Stream is nil
// (nil once closed).
func (b *Buffer) Stream() Stream {
	if b == nil {
		return nil
	}
	return b.b.Stream()
}

// MaxRecv is the most rows a rank can receive in one dispatch,
// Ranks*MaxTokens: the row count of worst-case outputs.
func (b *Buffer) MaxRecv() int {
	if b == nil {
		return 0
	}
	return b.ranks * b.cfg.MaxTokens
}

// LocalExperts is the number of experts on each rank.
func (b *Buffer) LocalExperts() int {
	if b == nil || b.ranks == 0 {
		return 0
	}
	return b.cfg.Experts / b.ranks
}

// NewEvent creates an event for After and Done, closed with the Buffer.
// Engines record it on their stream (Record, or cudaEventRecord on its
// Handle) to order a call after their work.
func (b *Buffer) NewEvent() (*Event, error) {
	if b == nil {
		return nil, errNilBuffer
	}
	return b.b.NewEvent()
}

// Events reports the Buffer's pool of per-call Done events: how many the
// engine holds unreleased, the pool's size (Config.Events), and how many
// held ones were recycled because the ring wrapped (each such event's
// methods return ErrEventRecycled; a non-zero count is an engine bug).
func (b *Buffer) Events() (held, size int, wraps uint64) {
	if b == nil {
		return 0, 0, 0
	}
	return b.b.Events()
}

// Check returns nil while the Buffer is usable, else the error that made
// it unusable (a device-side timeout names the stage and the rank waited
// on; errors.Is(err, ErrTimeout)). Cheap: it reads host-mapped memory.
func (b *Buffer) Check() error {
	if b == nil {
		return errNilBuffer
	}
	return b.b.Check()
}

// InternodeTrace is a diagnostic for measurement builds: this rank's raw
// in-kernel phase trace of the last internode dispatch and combine (per
// block, the GPU's global timer at each phase point;
// internode.ParseKernelTrace decodes it), written only when the kernels
// were compiled with GOEP_INN_TRACE=1 (`ep-bench internode
// --trace-kernels`); all zero otherwise. Synchronous: synchronise the
// calls' stream first. An error unless the Buffer runs the internode mode
// on a device that runs kernels.
func (b *Buffer) InternodeTrace() ([]byte, error) {
	if b == nil {
		return nil, errNilBuffer
	}
	return b.b.InternodeTrace()
}

// InvalidIDs reports top-k ids outside [-1, Experts) counted by the last
// dispatch and by the last layout launch of this Buffer, one
// *InvalidIDsError each (joined; nil when none, and once closed).
// Dispatches that wait on the host report theirs from the call itself; for
// worst-case dispatches and Layout, call this once their Done event has
// completed.
func (b *Buffer) InvalidIDs() error {
	if b == nil {
		return nil
	}
	var errs []error
	if n := b.b.NotifyInvalid(); n > 0 {
		errs = append(errs, &InvalidIDsError{Rank: b.rank, Op: "dispatch", Count: n, Experts: b.cfg.Experts})
	}
	if n := b.b.LayoutInvalid(); n > 0 {
		errs = append(errs, &InvalidIDsError{Rank: b.rank, Op: "layout", Count: n, Experts: b.cfg.Experts})
	}
	return errors.Join(errs...)
}

// Barrier enqueues a device-side barrier of all ranks on s (nil: the
// Buffer's stream), after After: work issued on s afterwards starts once
// every rank's stream has reached its Barrier. Collective. It returns a
// Done event of its own (see Event), recorded after the barrier. A ctx
// that has already ended is refused before anything is enqueued.
//
// Changed in this version: Barrier takes a ctx (every blocking call does).
func (b *Buffer) Barrier(ctx context.Context, s Stream, after *Event) (*Event, error) {
	if b == nil {
		return nil, errNilBuffer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.begin(ctx, "barrier", s, after)
	if err != nil {
		return nil, err
	}
	if err := b.b.Barrier(s); err != nil {
		return nil, err
	}
	return b.finish("barrier", s, nil)
}

// Close waits for the Buffer's stream, meets every rank, and frees all the
// Buffer holds, checking nothing is left. Each rank must first have
// synchronised the streams it used the Buffer on (no kernel of any rank may
// still read or write the Buffer's memory). Views, handles and Done events
// die with it (handles and events then return ErrClosed / errors).
// Collective; it also works after a failure (bounded by ctx and the
// bootstrap timeout: a timeout satisfies errors.Is(err, ErrTimeout)).
// Closing twice, or a nil Buffer, is a no-op.
func (b *Buffer) Close(ctx context.Context) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, h := range b.slots {
		if h != nil {
			h.state.Store(handleClosed)
		}
		b.slots[i] = nil
	}
	b.lastDispatch, b.lastCombine, b.lastLayout = nil, nil, nil
	return b.b.Close(ctx)
}

// stream is s, or the Buffer's stream when s is nil.
func (b *Buffer) stream(s Stream) Stream {
	if s == nil {
		return b.b.Stream()
	}
	return s
}

// usable is the start of every call: not closed nor failed, and a context
// that has not ended (refused before anything is enqueued).
func (b *Buffer) usable(ctx context.Context, op string) error {
	if err := b.b.Usable(); err != nil {
		return err
	}
	if ctx == nil {
		return b.invalid(op, "nil context")
	}
	if err := ctx.Err(); err != nil {
		return buffer.CtxError(fmt.Sprintf("ep: rank %d: %s: refused before launch", b.rank, op), err)
	}
	return nil
}

// begin is the start of every call's enqueueing: s defaults to the
// Buffer's stream, and s waits for after.
func (b *Buffer) begin(ctx context.Context, op string, s Stream, after *Event) (Stream, error) {
	if err := b.usable(ctx, op); err != nil {
		return nil, err
	}
	s = b.stream(s)
	if after != nil {
		if err := after.Wait(s); err != nil {
			return nil, b.invalid(op, "waiting for the After event: %v", err)
		}
	}
	return s, nil
}

// finish records the call's Done event (done, or a new one of the
// Buffer's pool, bound to this call).
func (b *Buffer) finish(op string, s Stream, done *Event) (*Event, error) {
	if done == nil {
		var err error
		if done, err = b.b.CallEvent(); err != nil {
			return nil, err
		}
	}
	if err := done.Record(s); err != nil {
		return nil, b.b.Fail(fmt.Errorf("ep: rank %d: %s: recording the Done event: %w", b.rank, op, err))
	}
	// A device-side wait that already gave up (always the case on the host
	// backend, whose kernels run as they are issued) is reported now.
	if err := b.b.Check(); err != nil {
		return nil, err
	}
	return done, nil
}

// fail makes the Buffer unusable after a launch error mid-collective.
func (b *Buffer) fail(op string, err error) error {
	return b.b.Fail(fmt.Errorf("ep: rank %d: %s: %w", b.rank, op, err))
}
