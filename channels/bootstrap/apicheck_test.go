package bootstrap_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package bootstrap with
// exported methods; TestAPITable fails when a new one is not added here.
// The Bootstrap implementations are unexported and reached through the
// interface: TestAPIAfterClose covers the in-process one.
var apiTable = []any{(*bootstrap.FDExchanger)(nil), (*bootstrap.PeerClosedError)(nil), (*bootstrap.TimeoutError)(nil)}

// 1 (issue 18). Every exported method answers on a nil receiver without a
// panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}

// 1 (issue 18). A closed in-process Bootstrap and a closed FDExchanger
// answer every method without a panic or a hang (zero arguments, cancelled
// contexts), and exchanges fail with ErrClosed.
func TestAPIAfterClose(t *testing.T) {
	const n = 2
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{Timeout: 10 * time.Second})
	require.NoError(t, err)
	xs := make([]*bootstrap.FDExchanger, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range boots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			xs[i], errs[i] = bootstrap.NewFDExchanger(context.Background(), boots[i], 10*time.Second)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for i := range boots {
		require.NoError(t, xs[i].Close())
		require.NoError(t, boots[i].Close())
	}
	for i := range boots {
		for _, v := range []any{boots[i], xs[i]} {
			for _, f := range apicheck.Call(v, apicheck.Options{Bound: 20 * time.Second}) {
				t.Errorf("rank %d: %v", i, f)
			}
		}
		_, err := boots[i].AllGather(context.Background(), []byte("x"))
		require.ErrorIs(t, err, bootstrap.ErrClosed, "rank %d", i)
	}
}
