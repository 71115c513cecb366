package ep_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
)

// apiTable is one value of every exported type of package ep that has
// exported methods: nil pointers for pointer methods, zero values for value
// types. TestAPITable fails when a new such type is declared and not added
// here, so the no-panic rule (issue 18 class 1) keeps covering the API.
var apiTable = []any{
	(*ep.Buffer)(nil), (*ep.Handle)(nil), (*ep.Event)(nil), (*ep.InvalidIDsError)(nil),
	(*ep.LowLatencyBuffer)(nil), (*ep.LLHandle)(nil),
	ep.LLFormat(0), ep.LLFormat(-1), ep.LLFormat(1 << 30), ep.Tensor{},
	// new(T) of the opaque types, which only the constructors fill: a
	// misuse that must still answer with an error, not a panic.
	new(ep.Buffer), new(ep.Handle), new(ep.LowLatencyBuffer), new(ep.LLHandle), new(ep.Event),
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value, with an error or a zero value, never a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}

// 1 (issue 18). After Close every exported method of a Buffer, of a
// handle it returned and of its events answers without a panic (zero
// arguments, cancelled contexts).
func TestAPIAfterClose(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(string(kind), func(t *testing.T) { apiAfterClose(t, kind) })
	}
}

func apiAfterClose(t *testing.T, kind ep.Kind) {
	ctx := context.Background()
	s := engineSpec(kind, "apicheck")
	r := newRig(t, kind, s.ranks, s.config())
	io := setup(t, r, s)
	newRound(t, r, s, io, 0)
	res := make([]ep.DispatchResult, s.ranks)
	evs := make([]*ep.Event, s.ranks)
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		a := io[i].args(s, i)
		a.Stream = r.streams[i]
		var err error
		if res[i], err = b.Dispatch(ctx, a); err != nil {
			return err
		}
		evs[i], err = b.NewEvent()
		return err
	}))
	require.NoError(t, r.close())
	for i, b := range r.bufs {
		for _, v := range []any{b, res[i].Handle, res[i].Done, evs[i]} {
			for _, f := range apicheck.Call(v, apicheck.Options{}) {
				t.Errorf("rank %d: %v", i, f)
			}
		}
		_, err := b.Dispatch(ctx, io[i].args(s, i))
		require.ErrorIs(t, err, ep.ErrClosed)
		require.ErrorIs(t, res[i].Handle.Pin(), ep.ErrExpiredHandle)
	}
}

// 1 (issue 18). The low-latency buffer: after Close every method of the
// buffer and of a handle it returned answers without a panic, calls fail,
// and its accessors polled from other goroutines while Close runs do not
// crash (run under -race).
func TestLowLatencyAPIAfterClose(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(string(kind), func(t *testing.T) { lowLatencyAPIAfterClose(t, kind) })
	}
}

func lowLatencyAPIAfterClose(t *testing.T, kind ep.Kind) {
	cfg := ep.LowLatencyConfig{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 4, NumSMs: 1, Threads: 64, Timeout: 10 * time.Second}
	boots, devs := llWorld(t, kind, 2)
	bufs := make([]*ep.LowLatencyBuffer, 2)
	hs := make([]*ep.LLDispatchResult, 2)
	llEachRank(t, 2, func(i int) error {
		var err error
		if bufs[i], err = ep.NewLowLatencyBuffer(context.Background(), boots[i], devs[i], cfg); err != nil {
			return err
		}
		x := ep.NewTensor(llUp(t, devs[i], make([]uint16, 2*128)), ep.BF16, 2, 128)
		ids := ep.NewTensor(llUp(t, devs[i], []int64{0, 1, 2, 3}), ep.I64, 2, 2)
		if hs[i], err = bufs[i].Dispatch(ep.LLDispatchArgs{X: x, TopKIdx: ids}); err != nil {
			return err
		}
		return bufs[i].Stream().Synchronize()
	})
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, l := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = l.Rank() + l.Ranks() + l.LocalExperts() + l.Slots()
				_ = l.Config()
				_ = l.Device()
				_ = l.Stream()
				_ = l.Check()
				_, _ = l.MaskedRanks()
				_, _ = l.PhaseTrace()
				_, _ = l.HostCounts(hs[i].Handle)
				_ = l.InvalidIDs(hs[i].Handle)
				_ = hs[i].Handle.Set() + hs[i].Handle.Tokens()
				_ = hs[i].Done.Handle()
			}
		}()
	}
	llEachRank(t, 2, func(i int) error { return bufs[i].Close(context.Background()) })
	stop.Store(true)
	wg.Wait()
	for i, l := range bufs {
		for _, v := range []any{l, hs[i].Handle, hs[i].Done} {
			for _, f := range apicheck.Call(v, apicheck.Options{}) {
				t.Errorf("rank %d: %v", i, f)
			}
		}
		_, err := l.Dispatch(ep.LLDispatchArgs{})
		require.Error(t, err, "rank %d: dispatch after Close", i)
		require.Error(t, l.Check(), "rank %d", i)
		require.NoError(t, l.Close(context.Background()), "rank %d: closing twice", i)
	}
}

// llWorld opens n devices of kind (ranks sharing the GPUs present) and an
// in-process bootstrap, closed at Cleanup.
func llWorld(t *testing.T, kind ep.Kind, n int) ([]bootstrap.Bootstrap, []device.Device) {
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{Timeout: 30 * time.Second})
	require.NoError(t, err)
	devs := make([]device.Device, n)
	for i := range devs {
		d, err := ep.OpenDevice(kind, ordinalOf(t, kind, i))
		require.NoError(t, err)
		devs[i] = d
	}
	t.Cleanup(func() {
		for i := range devs {
			_ = devs[i].Close()
			_ = boots[i].Close()
		}
	})
	return boots, devs
}

func llEachRank(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}
