package routing_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

// apiTable is one value of every exported type of package routing with
// exported methods (nil pointers for pointer methods, zero values for value
// types); TestAPITable fails when a new one is not added here.
var apiTable = []any{
	(*routing.DeviceLayout)(nil), (*routing.Layout)(nil), (*routing.Routing)(nil),
	routing.LaunchShape{}, routing.Shape{}, &routing.Routing{}, &routing.Layout{},
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}

// 1 (issue 18). A DeviceLayout answers every method with an error after
// Close instead of touching freed memory; closing twice is a no-op.
func TestAPIAfterClose(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	dl, err := routing.NewDeviceLayout(d, routing.Shape{Tokens: 4, Ranks: 2, Experts: 4, K: 2})
	require.NoError(t, err)
	require.NoError(t, dl.Poison(0xff))
	require.NoError(t, dl.Close())
	for _, f := range apicheck.Call(dl, apicheck.Options{}) {
		t.Error(f)
	}
	require.Error(t, dl.Poison(0))
	_, _, err = dl.Read()
	require.Error(t, err)
	_, err = dl.WorkspaceClean()
	require.Error(t, err)
	require.NoError(t, dl.Close())

	r := &routing.Routing{Shape: routing.Shape{Tokens: 2, Ranks: 2, Experts: 4, K: 2}, Idx: []int64{0, 1, 2, 3}}
	require.Equal(t, []int64{2, 3}, r.Row(1))
	require.Nil(t, r.Row(2), "a token past the end")
	require.Nil(t, r.Row(-1))
	l, err := r.Layout()
	require.NoError(t, err)
	require.True(t, l.InRank(1, 1))
	require.False(t, l.InRank(2, 0), "a token past the end")
	require.False(t, l.InRank(0, 2), "a rank past the end")
}
