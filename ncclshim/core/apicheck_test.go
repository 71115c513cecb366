package core

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
)

// apiTable is one value of every exported type of package core with
// exported methods (nil pointers for pointer methods, zero and
// out-of-range values for value types); TestAPITable fails when a new one
// is not added here.
var apiTable = []any{
	(*Comm)(nil), (*Error)(nil), Call{}, Call{Kind: numKinds}, Kind(-1), numKinds, Path(-1), numPaths, UniqueID{},
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero or out-of-range value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
	require.Equal(t, "kind(10)", numKinds.String())
	require.Equal(t, "path(-1)", Path(-1).String())
}

// 1 (issue 18). After Destroy every method of a communicator answers
// without a panic (calls fail), and its accessors polled from other
// goroutines while Destroy runs do not crash (run under -race).
func TestAPIAfterDestroy(t *testing.T) {
	t.Run("host", func(t *testing.T) {
		t.Setenv(EnvBackend, "host")
		apiAfterDestroy(t, nil)
	})
	t.Run("cuda", func(t *testing.T) {
		n, err := device.CUDADeviceCount()
		if err != nil || n == 0 {
			t.Skipf("no CUDA GPU (%v)", err)
		}
		t.Setenv(EnvBackend, "cuda")
		apiAfterDestroy(t, []int{0, 1 % n}) // two ranks on the GPUs present, sharing one if need be
	})
}

func apiAfterDestroy(t *testing.T, devlist []int) {
	comms, err := InitAll(2, devlist)
	require.NoError(t, err)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = c.Rank() + c.Size() + c.Device()
				_ = c.Counts()
				_ = c.CountsString()
				_ = c.AsyncError()
			}
		}()
	}
	for _, c := range comms {
		require.NoError(t, c.Destroy())
	}
	stop.Store(true)
	wg.Wait()
	for r, c := range comms {
		for _, f := range apicheck.Call(c, apicheck.Options{}) {
			t.Errorf("rank %d: %v", r, f)
		}
		require.Error(t, c.AsyncError(), "rank %d", r)
		require.Error(t, c.Finalize(), "rank %d", r)
		_, err := c.Register(0x1000, 16)
		require.Error(t, err, "rank %d", r)
		require.NoError(t, c.Destroy(), "rank %d: destroying twice", r)
		require.Equal(t, r, c.Rank(), "rank %d: accessors still answer", r)
	}
}
