package buffer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// sameConfig: every rank learns every peer's configuration; a rank whose
// differs is named by the others (and names the first other rank itself).
func TestSameConfigNamesTheRank(t *testing.T) {
	const n = 3
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, b := range boots {
			_ = b.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := func(mine func(r int) string) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = sameConfig(ctx, boots[r], r, n, 7, "test config", mine(r))
			}()
		}
		wg.Wait()
		return errs
	}
	require.NoError(t, errors.Join(run(func(int) string { return "a" })...))
	errs := run(func(r int) string { return fmt.Sprintf("hidden=%d", 128+128*(r/2)) })
	require.ErrorContains(t, errs[0], "rank 2's test config (hidden=256) differs from this rank's (hidden=128)")
	require.ErrorContains(t, errs[1], "rank 2's test config")
	require.ErrorContains(t, errs[2], "rank 0's test config (hidden=128) differs from this rank's (hidden=256)")
}

// exchangeWorkspaces on one rank: the peer table holds the own workspace.
func TestExchangeWorkspacesOneRank(t *testing.T) {
	boots, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	dev := device.OpenHost(0)
	t.Cleanup(func() { _ = dev.Close(); _ = boots[0].Close() })
	b, err := NewLowLatency(context.Background(), boots[0], dev, LowLatencyConfig{MaxTokens: 2, Hidden: 16, TopK: 1, Experts: 2})
	require.NoError(t, err)
	got := make([]byte, 8)
	require.NoError(t, dev.CopyOut(got, b.work.Peers))
	require.Equal(t, uint64(b.ws.Ptr), uint64(got[0])|uint64(got[1])<<8|uint64(got[2])<<16|uint64(got[3])<<24|
		uint64(got[4])<<32|uint64(got[5])<<40|uint64(got[6])<<48|uint64(got[7])<<56)
	require.NoError(t, b.Close(context.Background()))
	require.NoError(t, b.Close(context.Background()), "a second Close is a no-op")
	require.Error(t, b.Check())
}

// The first failure wins; none is recorded once closed.
func TestFirstFailure(t *testing.T) {
	var broken error
	e1, e2 := errors.New("one"), errors.New("two")
	require.Equal(t, e1, firstFailure(&broken, false, e1))
	require.Equal(t, e1, firstFailure(&broken, false, e2))
	var none error
	require.Equal(t, e2, firstFailure(&none, true, e2))
	require.NoError(t, none)
	var mu sync.Mutex
	closed := false
	require.False(t, markClosed(&mu, &closed))
	require.True(t, markClosed(&mu, &closed))
	require.True(t, closed)
	var nilLL *LowLatency
	require.ErrorIs(t, nilLL.Fail(e1), e1)
}
