package buffer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
)

// apiTable is one value of every exported type of package buffer with
// exported methods; TestAPITable fails when a new one is not added here.
var apiTable = []any{
	(*buffer.Buffer)(nil), (*buffer.Event)(nil), (*buffer.LowLatency)(nil), buffer.LaunchConfig{},
	// new(T) of the opaque types, which only the constructors fill: a
	// misuse that must still answer with an error, not a panic.
	new(buffer.Buffer), new(buffer.Event), new(buffer.LowLatency),
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}

// 1 (issue 18). After Close every method of a Buffer, a LowLatency and
// their events answers without a panic, and accessors polled from other
// goroutines while Close runs do not crash (run under -race).
func TestAPIAfterClose(t *testing.T) {
	const ranks = 2
	boots, err := bootstrap.NewInProcess(ranks, bootstrap.Config{Timeout: 30 * time.Second})
	require.NoError(t, err)
	devs := make([]device.Device, ranks)
	bufs := make([]*buffer.Buffer, ranks)
	lls := make([]*buffer.LowLatency, ranks)
	evs := make([]*buffer.Event, 2*ranks)
	for i := range devs {
		devs[i] = device.OpenHost(i)
	}
	t.Cleanup(func() {
		for i := range devs {
			_ = devs[i].Close()
			_ = boots[i].Close()
		}
	})
	each := func(f func(i int) error) {
		t.Helper()
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for i := range ranks {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = f(i) }()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	}
	ctx := context.Background()
	each(func(i int) error {
		var err error
		if bufs[i], err = buffer.New(ctx, boots[i], devs[i],
			buffer.Config{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 4, Handles: 2, Tag: 1}); err != nil {
			return err
		}
		if lls[i], err = buffer.NewLowLatency(ctx, boots[i], devs[i],
			buffer.LowLatencyConfig{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 4, NumSMs: 1, Threads: 64, Tag: 2}); err != nil {
			return err
		}
		if evs[2*i], err = bufs[i].NewEvent(); err != nil {
			return err
		}
		evs[2*i+1], err = lls[i].NewEvent()
		return err
	})
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, l := bufs[i], lls[i]
			for !stop.Load() {
				_ = b.Rank() + b.Ranks() + b.HandleSlots()
				_, _ = b.Mode(), b.Config()
				_, _ = b.SizeHint(), b.Memory()
				_, _ = b.Device(), b.Stream()
				_, _, _ = b.Events()
				_ = b.Check()
				_ = b.Usable()
				_, _ = b.IsCapturing(nil)
				_ = l.Rank() + l.Ranks()
				_, _ = l.Mode(), l.Memory()
				_, _ = l.Device(), l.Stream()
				_ = l.Check()
				_ = evs[2*i].Handle() + evs[2*i+1].Handle()
			}
		}()
	}
	each(func(i int) error { return errors.Join(bufs[i].Close(ctx), lls[i].Close(ctx)) })
	stop.Store(true)
	wg.Wait()
	for i := range ranks {
		for _, v := range []any{bufs[i], lls[i], evs[2*i], evs[2*i+1]} {
			for _, f := range apicheck.Call(v, apicheck.Options{}) {
				t.Errorf("rank %d: %v", i, f)
			}
		}
		require.Error(t, bufs[i].Check(), "rank %d", i)
		require.Error(t, lls[i].Check(), "rank %d", i)
		_, err := bufs[i].NewEvent()
		require.Error(t, err, "rank %d: NewEvent after Close", i)
		require.NoError(t, bufs[i].Close(ctx), "rank %d: closing twice", i)
		require.NoError(t, lls[i].Close(ctx), "rank %d: closing twice", i)
	}
}
