package device_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
)

// apiTable is one value of every exported type of package device with
// exported methods; TestAPITable fails when a new one is not added here.
// The backends' own types are unexported and reached through the Device,
// Stream, Event and Graph interfaces: TestHostAPIAfterClose covers them.
var apiTable = []any{(*device.Args)(nil), device.NewArgs(0)}

// 1 (issue 18). Every exported method answers on a nil receiver without a
// panic.
// The Args readers (Get*) are left out: they are documented to panic on a
// mismatch, which is a bug in a host kernel twin, and the host backend's
// Launch turns a twin's panic into an error naming the kernel; no caller
// of the API reaches them. Appending to a nil Args gives a list whose Err
// refuses the launch.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{Skip: []string{"GetPtr", "GetU64", "GetI64", "GetU32", "GetI32", "GetF32"}})
	var nilArgs *device.Args
	require.Error(t, nilArgs.Ptr(1).U32(2).Err(), "a list built from a nil Args is refused")
	require.Equal(t, 2, nilArgs.Ptr(1).U32(2).Len())
	require.Error(t, nilArgs.U32Int(3).Err())
	require.NoError(t, device.NewArgs(1).Ptr(1).Err())
	d := device.OpenHost(0)
	defer d.Close()
	require.ErrorContains(t, d.Launch("any", device.D1(1), device.D1(1), 0, nil, nilArgs.Ptr(0)), "nil *Args", "launch with a nil-built list")
}

// 1 (issue 18). A host device, and the streams, events and graphs it made,
// answer every method without a panic, both live (zero arguments) and
// after the device closed; calls on a closed device fail.
func TestHostAPIAfterClose(t *testing.T) {
	d := device.OpenHost(0)
	s, err := d.NewStream()
	require.NoError(t, err)
	e, err := d.NewEvent()
	require.NoError(t, err)
	g, err := d.Capture(s, func() error { return nil })
	require.NoError(t, err)
	b, err := d.Alloc(64)
	require.NoError(t, err)
	for _, v := range []any{d, s, e, g} {
		for _, f := range apicheck.Call(v, apicheck.Options{Skip: []string{"Close"}}) {
			t.Errorf("live: %v", f)
		}
	}
	require.NoError(t, d.Free(b))
	require.NoError(t, d.Close())
	for _, v := range []any{d, s, e, g} {
		for _, f := range apicheck.Call(v, apicheck.Options{}) {
			t.Errorf("closed: %v", f)
		}
	}
	_, err = d.Alloc(64)
	require.Error(t, err, "Alloc on a closed device")
	require.Error(t, d.CopyIn(b.Ptr, make([]byte, 8)), "a copy into memory of a closed device")
}
