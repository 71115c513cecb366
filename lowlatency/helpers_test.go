package lowlatency_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/lowlatency"
)

// rank is one rank's low-latency state for tests: its workspace, the peers'
// imported, the peer table and a watchdog with a host-mapped record (the
// EP Buffer builds the same Workspace its own way).
// newWorkspace loads the kernels and allocates r's workspace for l, its
// control block zeroed (the state a Buffer's first call expects); the
// workspace is freed with r's other buffers.
func (r *rank) newWorkspace(l lowlatency.Layout) (device.Buffer, error) {
	if err := r.dev.Preload(lowlatency.Kernels...); err != nil {
		return device.Buffer{}, err
	}
	ws, err := r.dev.Alloc(l.Size)
	if err != nil {
		return device.Buffer{}, err
	}
	r.bufs = append(r.bufs, ws)
	return ws, r.dev.CopyIn(ws.Ptr, make([]byte, l.Ctrl.Size))
}

type rank struct {
	dev     device.Device
	ws      lowlatency.Workspace
	stream  device.Stream
	record  device.HostMapped
	bufs    []device.Buffer
	imports []device.Buffer
	// Groups across nodes (newNodeGroup): the communicator, whose
	// watchdog the kernels use, and the connection Connect built.
	comm *channels.Communicator
	conn *lowlatency.Connection
}

// check reports a device-side timeout of this rank as an error.
func (r *rank) check() error {
	if r.comm != nil {
		return r.comm.Check()
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
	return &channels.TimeoutError{Rank: r.ws.Rank, ID: rec.ID, Object: "lowlatency " + lowlatency.StageName(rec.Stage),
		Peer: int(rec.Peer), Stage: rec.Stage, Op: devapi.OpName(rec.Op), Waited: time.Duration(rec.WaitedNS),
		Expected: rec.Expected, Observed: rec.Observed}
}

type group struct {
	ranks []*rank
}

// newGroup builds one rank per device (goroutine ranks, in-process
// bootstrap). spin caps grids (ranks sharing a GPU).
func newGroup(t testing.TB, devs []device.Device, c lowlatency.Config, timeout time.Duration, spin int) *group {
	l, err := lowlatency.NewLayout(c)
	require.NoError(t, err)
	boots, err := bootstrap.NewInProcess(c.Ranks, bootstrap.Config{})
	require.NoError(t, err)
	g := &group{ranks: make([]*rank, c.Ranks)}
	t.Cleanup(func() {
		for i, r := range g.ranks {
			if r == nil {
				continue
			}
			if r.stream != nil {
				_ = r.stream.Synchronize()
				_ = r.stream.Close()
			}
			for _, b := range r.imports {
				_ = r.dev.CloseImport(b)
			}
			for _, b := range r.bufs {
				_ = r.dev.Free(b)
			}
			_ = r.dev.FreeHostMapped(r.record)
			_ = boots[i].Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = g.each(func(i int, _ *rank) error {
		dev := devs[i]
		r := &rank{dev: dev}
		g.ranks[i] = r
		ws, err := r.newWorkspace(l)
		if err != nil {
			return err
		}
		if r.record, err = dev.AllocHostMapped(devapi.TimeoutRecordSize); err != nil {
			return err
		}
		clear(r.record.Host)
		wd, err := dev.Alloc(devapi.WatchdogSize)
		if err != nil {
			return err
		}
		r.bufs = append(r.bufs, wd)
		wdb := make([]byte, devapi.WatchdogSize)
		devapi.Watchdog{TimeoutNS: uint64(timeout), Record: r.record.Dev}.Encode(wdb)
		if err := dev.CopyIn(wd.Ptr, wdb); err != nil {
			return err
		}
		if r.stream, err = dev.NewStream(); err != nil {
			return err
		}
		mine, err := dev.Export(ws)
		if err != nil {
			return err
		}
		all, err := boots[i].AllGather(ctx, mine)
		if err != nil {
			return err
		}
		table := make([]byte, 8*c.Ranks)
		for peer, h := range all {
			p := ws.Ptr
			if peer != i {
				b, err := dev.Import(h)
				if err != nil {
					return err
				}
				r.imports = append(r.imports, b)
				p = b.Ptr
			}
			binary.LittleEndian.PutUint64(table[8*peer:], uint64(p))
		}
		tb, err := dev.Alloc(len(table))
		if err != nil {
			return err
		}
		r.bufs = append(r.bufs, tb)
		if err := dev.CopyIn(tb.Ptr, table); err != nil {
			return err
		}
		r.ws = lowlatency.Workspace{Layout: l, Rank: i, Base: ws.Ptr, Size: ws.Size, Peers: tb.Ptr, Watchdog: wd.Ptr,
			WaitID: 5, SpinBlocks: spin}
		if err := r.ws.Validate(); err != nil {
			return err
		}
		return boots[i].Barrier(ctx)
	})
	require.NoError(t, err)
	return g
}

// each runs f for every rank at once and joins the errors.
func (g *group) each(f func(i int, r *rank) error) error {
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for i := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i, g.ranks[i]); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run runs f on every rank, then synchronises each stream and checks for
// device timeouts.
func (g *group) run(t testing.TB, f func(i int, r *rank) error) {
	t.Helper()
	require.NoError(t, g.each(func(i int, r *rank) error {
		if err := f(i, r); err != nil {
			return err
		}
		if err := r.stream.Synchronize(); err != nil {
			return err
		}
		return r.check()
	}))
}

// steps issues the launch steps of one round in lockstep: every rank
// issues step k before any rank issues step k+1, then every rank
// synchronises its stream and checks for device timeouts. Goroutine ranks
// sharing a GPU share its hardware queues; a launch waiting behind its own
// rank's spinning kernel holds back whatever was queued after it in that
// queue, so a peer's step that the spinning kernel waits for must be queued
// before it: issuing the steps in lockstep guarantees that (a rank that
// runs ahead, as in runCase before, could queue its second receive ahead
// of a peer's first send and wait out the device timeout; seen on one H100
// with 8 and with 3 ranks).
func (g *group) steps(t testing.TB, steps ...func(i int, r *rank) error) {
	t.Helper()
	n := len(g.ranks)
	gates := make([]sync.WaitGroup, len(steps))
	for k := range gates {
		gates[k].Add(n)
	}
	require.NoError(t, g.each(func(i int, r *rank) error {
		var err error
		for k, f := range steps {
			if err == nil {
				err = f(i, r)
			}
			// Every rank passes every gate, failed or not, so none waits
			// here for ever.
			gates[k].Done()
			gates[k].Wait()
		}
		if err != nil {
			return err
		}
		if err := r.stream.Synchronize(); err != nil {
			return err
		}
		return r.check()
	}))
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func (r *rank) upload(t testing.TB, b []byte) uintptr {
	buf, err := r.dev.Alloc(max(256, len(b)))
	require.NoError(t, err)
	r.bufs = append(r.bufs, buf)
	if len(b) > 0 {
		require.NoError(t, r.dev.CopyIn(buf.Ptr, b))
	}
	return buf.Ptr
}

func down[T any](t testing.TB, r *rank, p uintptr, n int) []T {
	out := make([]T, n)
	if n > 0 {
		require.NoError(t, r.dev.CopyOut(bytesOf(out), p))
	}
	return out
}

func sameSlice[T comparable](t testing.TB, want, got []T, format string, a ...any) {
	t.Helper()
	what := fmt.Sprintf(format, a...)
	require.Equal(t, len(want), len(got), "%s: length", what)
	for i := range want {
		if want[i] != got[i] {
			n := 0
			for j := range want {
				if want[j] != got[j] {
					n++
				}
			}
			t.Fatalf("%s: %d of %d elements differ; first at %d: want %v, got %v", what, n, len(want), i, want[i], got[i])
		}
	}
}
