package intranodetest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/goep-dev/goep/intranode"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// Rank is one rank's intranode state built over a bootstrap: its workspace,
// the peers' workspaces mapped here, the peer table, a watchdog with its
// host-mapped timeout record, and host-mapped counters for notify. It is a
// minimal stand-in for the EP Buffer, for tests and benchmarks; the Buffer
// builds the same intranode.Workspace its own way.
//
// Ranks are processes (CUDA IPC) or goroutines of one process (peer access);
// NewGroup builds goroutine ranks.
type Rank struct {
	Dev  device.Device
	Boot bootstrap.Bootstrap
	WS   intranode.Workspace
	// RecvCount (int32) and ExpertCounts (int32[LocalExperts]) are
	// host-mapped notify outputs; Notify sets RecvCount to -1 first.
	RecvCount, ExpertCounts device.HostMapped

	record    device.HostMapped
	ws, table device.Buffer
	wd        device.Buffer
	imports   []device.Buffer
	closed    bool
}

// RankOptions configure NewRank.
type RankOptions struct {
	// Timeout bounds every device-side wait; 0 means DefaultTimeout.
	Timeout time.Duration
	// WaitID is written into timeout records.
	WaitID uint32
	// SpinBlocks caps the grid of launches that wait on peers (ranks that
	// share a GPU; 0: no cap). NewGroup sets it.
	SpinBlocks int
}

// DefaultTimeout bounds device-side waits unless RankOptions says otherwise.
const DefaultTimeout = 60 * time.Second

// NewRank builds rank bs.Rank() of a group of bs.Size() == l.Ranks ranks.
// Every rank calls it at the same time with the same layout.
func NewRank(ctx context.Context, dev device.Device, bs bootstrap.Bootstrap, l intranode.Layout, opt RankOptions) (_ *Rank, err error) {
	if dev == nil || bs == nil {
		return nil, errors.New("intranode: NewRank needs a device and a bootstrap")
	}
	if l.Size == 0 {
		return nil, errors.New("intranode: NewRank: layout not built (use NewLayout)")
	}
	if bs.Size() != l.Ranks {
		return nil, fmt.Errorf("intranode: bootstrap of %d ranks for a layout of %d", bs.Size(), l.Ranks)
	}
	if opt.Timeout < 0 {
		return nil, fmt.Errorf("intranode: timeout %s", opt.Timeout)
	}
	if opt.Timeout == 0 {
		opt.Timeout = DefaultTimeout
	}
	rank := bs.Rank()
	r := &Rank{Dev: dev, Boot: bs}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.free())
		}
	}()
	fail := func(what string, err error) error { return fmt.Errorf("intranode: rank %d: %s: %w", rank, what, err) }

	// Every kernel is loaded before the ranks meet (a module load waits
	// for the kernels running in the context, which ranks sharing a GPU
	// share); the TMA module may not compile everywhere: its launch says so.
	if err = dev.Preload(intranode.KernelNotify); err != nil {
		return nil, fail("preload", err)
	}
	_ = dev.Preload(intranode.KernelDispatchTMA)
	if r.ws, err = dev.Alloc(l.Size); err != nil {
		return nil, fail("workspace", err)
	}
	if err = dev.CopyIn(r.ws.Ptr+uintptr(l.Ctrl.Offset), make([]byte, l.Ctrl.Size)); err != nil {
		return nil, fail("zero control block", err)
	}
	if r.record, err = dev.AllocHostMapped(devapi.TimeoutRecordSize); err != nil {
		return nil, fail("timeout record", err)
	}
	clear(r.record.Host)
	if r.wd, err = dev.Alloc(devapi.WatchdogSize); err != nil {
		return nil, fail("watchdog", err)
	}
	wd := make([]byte, devapi.WatchdogSize)
	devapi.Watchdog{TimeoutNS: uint64(opt.Timeout), Record: r.record.Dev}.Encode(wd)
	if err = dev.CopyIn(r.wd.Ptr, wd); err != nil {
		return nil, fail("watchdog", err)
	}
	if r.RecvCount, err = dev.AllocHostMapped(4); err != nil {
		return nil, fail("recv counter", err)
	}
	if r.ExpertCounts, err = dev.AllocHostMapped(4 * l.LocalExperts); err != nil {
		return nil, fail("expert counters", err)
	}
	clear(r.ExpertCounts.Host)
	r.setRecvCount(-1)

	// The control block is zero before anyone can learn its address.
	mine, err := dev.Export(r.ws)
	if err != nil {
		return nil, fail("export workspace", err)
	}
	all, err := bs.AllGather(ctx, mine)
	if err != nil {
		return nil, fail("exchange workspaces", err)
	}
	table := make([]byte, 8*l.Ranks)
	for peer, h := range all {
		p := r.ws.Ptr
		if peer != rank {
			b, err := dev.Import(h)
			if err != nil {
				return nil, fail(fmt.Sprintf("import rank %d's workspace", peer), err)
			}
			r.imports = append(r.imports, b)
			if b.Size < l.Size {
				return nil, fail("peer workspace", fmt.Errorf("rank %d's workspace has %d bytes, the layout needs %d", peer, b.Size, l.Size))
			}
			p = b.Ptr
		}
		binary.LittleEndian.PutUint64(table[8*peer:], uint64(p))
	}
	if r.table, err = dev.Alloc(len(table)); err != nil {
		return nil, fail("peer table", err)
	}
	if err = dev.CopyIn(r.table.Ptr, table); err != nil {
		return nil, fail("peer table", err)
	}
	r.WS = intranode.Workspace{Layout: l, Rank: rank, Base: r.ws.Ptr, Size: r.ws.Size, Peers: r.table.Ptr,
		Watchdog: r.wd.Ptr, WaitID: opt.WaitID, SpinBlocks: opt.SpinBlocks}
	if err = r.WS.Validate(); err != nil {
		return nil, fail("workspace", err)
	}
	if err = bs.Barrier(ctx); err != nil {
		return nil, fail("barrier", err)
	}
	return r, nil
}

func (r *Rank) setRecvCount(v int32) {
	(*atomic.Int32)(unsafe.Pointer(&r.RecvCount.Host[0])).Store(v)
}

// RecvCountNow reads the host-mapped received count (-1 until notify wrote it).
func (r *Rank) RecvCountNow() int {
	return int((*atomic.Int32)(unsafe.Pointer(&r.RecvCount.Host[0])).Load())
}

// ExpertCountsNow reads the host-mapped per-local-expert counts.
func (r *Rank) ExpertCountsNow() []int {
	out := make([]int, r.WS.Layout.LocalExperts)
	for i := range out {
		out[i] = int((*atomic.Int32)(unsafe.Pointer(&r.ExpertCounts.Host[4*i])).Load())
	}
	return out
}

// Notify launches notify with the host-mapped counters (RecvCount reset to
// -1 first; the previous notify must have finished).
func (r *Rank) Notify(s device.Stream, topk uintptr, h intranode.Handle, alignment int) error {
	r.setRecvCount(-1)
	return r.WS.Notify(r.Dev, s, intranode.NotifyArgs{TopK: topk, Handle: h, ExpertAlignment: alignment,
		RecvCount: r.RecvCount.Dev, ExpertCounts: r.ExpertCounts.Dev}, intranode.LaunchConfig{})
}

// NotifyDispatch launches notify (as Notify does) and then dispatch with
// the same handle, the dispatch without its entry wait
// (intranode.Workspace.NotifyDispatch).
func (r *Rank) NotifyDispatch(s device.Stream, topk uintptr, h intranode.Handle, alignment int, a intranode.DispatchArgs, cfg intranode.LaunchConfig) error {
	r.setRecvCount(-1)
	return r.WS.NotifyDispatch(r.Dev, s, intranode.NotifyArgs{TopK: topk, Handle: h, ExpertAlignment: alignment,
		RecvCount: r.RecvCount.Dev, ExpertCounts: r.ExpertCounts.Dev}, a, cfg)
}

// WaitRecvCount polls the host-mapped received count until notify writes
// it, as DeepEP's host does before it sizes outputs. It gives up on ctx, on
// a device-side timeout (Check), or after the watchdog's timeout.
func (r *Rank) WaitRecvCount(ctx context.Context) (int, error) {
	start := time.Now()
	for {
		if n := r.RecvCountNow(); n >= 0 {
			return n, nil
		}
		if err := r.Check(); err != nil {
			return 0, err
		}
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("intranode: rank %d: waiting for the received count: %w", r.WS.Rank, err)
		}
		// Busy-poll (yielding) at first: a timer sleep overshoots by more
		// than a small dispatch takes.
		if time.Since(start) < 5*time.Millisecond {
			runtime.Gosched()
			continue
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// Check returns a *channels.TimeoutError when a device-side wait of this
// rank gave up (read from the host-mapped record; cheap), else nil. After a
// timeout the group's protocol state is unknown: close and rebuild it.
func (r *Rank) Check() error {
	if len(r.record.Host) < devapi.TimeoutRecordSize {
		return nil
	}
	state := (*atomic.Uint32)(unsafe.Pointer(&r.record.Host[devapi.RecordState])).Load()
	if state == devapi.TimeoutNone {
		return nil
	}
	var snap [devapi.TimeoutRecordSize]byte
	for i := 0; i < devapi.TimeoutRecordSize; i += 4 {
		binary.LittleEndian.PutUint32(snap[i:], (*atomic.Uint32)(unsafe.Pointer(&r.record.Host[i])).Load())
	}
	rec := devapi.DecodeTimeoutRecord(snap[:])
	return &channels.TimeoutError{
		Rank: r.WS.Rank, ID: rec.ID, Object: "intranode " + intranode.StageName(rec.Stage), Peer: int(rec.Peer),
		Stage: rec.Stage, Op: devapi.OpName(rec.Op), Waited: time.Duration(rec.WaitedNS),
		Expected: rec.Expected, Observed: rec.Observed,
	}
}

// Close waits for every rank (so that no peer still uses this workspace;
// streams must be synchronised first), then frees everything. The bootstrap
// and device stay open.
func (r *Rank) Close(ctx context.Context) error {
	if r.closed {
		return nil
	}
	r.closed = true
	var berr error
	if err := r.Boot.Barrier(ctx); err != nil {
		berr = fmt.Errorf("intranode: rank %d: close barrier: %w", r.WS.Rank, err)
	}
	return errors.Join(berr, r.free())
}

func (r *Rank) free() error {
	var errs []error
	for _, b := range r.imports {
		errs = append(errs, r.Dev.CloseImport(b))
	}
	r.imports = nil
	for _, b := range []*device.Buffer{&r.table, &r.wd, &r.ws} {
		if b.Ptr != 0 {
			errs = append(errs, r.Dev.Free(*b))
			*b = device.Buffer{}
		}
	}
	for _, m := range []*device.HostMapped{&r.record, &r.RecvCount, &r.ExpertCounts} {
		if m.Dev != 0 {
			errs = append(errs, r.Dev.FreeHostMapped(*m))
			*m = device.HostMapped{}
		}
	}
	return errors.Join(errs...)
}

// Group is goroutine ranks of one process, one device each.
type Group struct {
	Ranks []*Rank
	devs  []device.Device
	boots []bootstrap.Bootstrap
}

// NewGroup opens a device per rank (host-backend ranks, or GPUs: rank i on
// GPU i mod the GPUs present, the launches capped so that ranks sharing a
// GPU stay co-resident),
// connects them with in-process bootstraps and builds a Rank on each.
func NewGroup(ctx context.Context, kind device.Kind, l intranode.Layout, opt RankOptions) (_ *Group, err error) {
	if l.Size == 0 {
		return nil, errors.New("intranode: NewGroup: layout not built (use NewLayout)")
	}
	g := &Group{Ranks: make([]*Rank, l.Ranks)}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.Close(context.Background()))
		}
	}()
	if g.boots, err = bootstrap.NewInProcess(l.Ranks, bootstrap.Config{}); err != nil {
		return nil, err
	}
	gpus := l.Ranks
	if kind == device.CUDA {
		if gpus, err = device.CUDADeviceCount(); err != nil {
			return nil, err
		}
	}
	for i := 0; i < l.Ranks; i++ {
		// Rank i on GPU i mod the GPUs present: several goroutine ranks
		// share a GPU when there are fewer GPUs than ranks.
		d, err := device.Open(kind, i%gpus)
		if err != nil {
			return nil, err
		}
		g.devs = append(g.devs, d)
	}
	if kind == device.CUDA && opt.SpinBlocks == 0 {
		shared := (l.Ranks + gpus - 1) / gpus
		opt.SpinBlocks = channels.SpinBudget(g.devs[0].Info().SMs, shared)
	}
	err = g.Run(func(i int, _ *Rank) error {
		r, err := NewRank(ctx, g.devs[i], g.boots[i], l, opt)
		g.Ranks[i] = r
		return err
	})
	return g, err
}

// Run calls f for every rank at once, each in its own goroutine, and joins
// their errors.
func (g *Group) Run(f func(rank int, r *Rank) error) error {
	errs := make([]error, len(g.Ranks))
	var wg sync.WaitGroup
	for i := range g.Ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i, g.Ranks[i]); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every rank (after a barrier), the bootstraps and the devices.
func (g *Group) Close(ctx context.Context) error {
	var errs []error
	complete := len(g.Ranks) > 0
	for _, r := range g.Ranks {
		complete = complete && r != nil
	}
	if complete {
		errs = append(errs, g.Run(func(_ int, r *Rank) error { return r.Close(ctx) }))
	} else {
		// A partly built group: no barrier (the missing ranks never come).
		for _, r := range g.Ranks {
			if r != nil {
				r.closed = true
				errs = append(errs, r.free())
			}
		}
	}
	for _, b := range g.boots {
		errs = append(errs, b.Close())
	}
	for _, d := range g.devs {
		errs = append(errs, d.Close())
	}
	g.Ranks, g.boots, g.devs = nil, nil, nil
	return errors.Join(errs...)
}
