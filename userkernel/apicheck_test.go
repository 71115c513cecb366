package userkernel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/userkernel"
)

// apiTable is one value of every exported type of package userkernel with
// exported methods; TestAPITable fails when a new one is not added here.
var apiTable = []any{(*userkernel.Module)(nil)}

// 1 (issue 18). Every exported method answers on a nil receiver without a
// panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}

// 1 (issue 18). A Module whose communicator was closed answers every
// method without a panic, and Launch fails with ErrClosed.
func TestAPIAfterClose(t *testing.T) {
	const src = `extern "C" __global__ void uk_closed(int* p) { *p = 1; }
`
	for _, b := range kernelBackends(t) {
		t.Run(string(b), func(t *testing.T) { apiAfterClose(t, b, src) })
	}
}

func apiAfterClose(t *testing.T, b backend, src string) {
	noErrors(t, runRanks(t, b, 2, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
		mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "closed", Code: src})
		if err != nil {
			return err
		}
		if err := comm.Close(); err != nil {
			return err
		}
		var errs []error
		for _, f := range apicheck.Call(mod, apicheck.Options{}) {
			errs = append(errs, errors.New(f.String()))
		}
		one := userkernel.D1(1)
		if err := mod.Launch("uk_closed", userkernel.Launch{Grid: one, Block: one, NoPeerWaits: true}, userkernel.NewArgs(1).Ptr(0)); !errors.Is(err, channels.ErrClosed) {
			errs = append(errs, fmt.Errorf("Launch after the communicator closed: %v, want ErrClosed", err))
		}
		return errors.Join(errs...)
	}))
}
