package routing_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

// goep_ep_widen_i32 sign-extends: -1 stays -1, out-of-range ids keep their
// values; LaunchWidenIDs refuses bad pointers and launches nothing for 0 ids.
func TestWidenTwin(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	ids := []int32{0, -1, 7, math.MaxInt32, math.MinInt32, -2, 255}
	src, err := d.Alloc(4 * len(ids))
	require.NoError(t, err)
	dst, err := d.Alloc(8 * (len(ids) + 1))
	require.NoError(t, err)
	raw := make([]byte, 4*len(ids))
	for i, v := range ids {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
	}
	require.NoError(t, d.CopyIn(src.Ptr, raw))
	require.NoError(t, d.CopyIn(dst.Ptr, make([]byte, dst.Size)))
	require.NoError(t, routing.LaunchWidenIDs(d, nil, src.Ptr, dst.Ptr, len(ids)))
	out := make([]byte, dst.Size)
	require.NoError(t, d.CopyOut(out, dst.Ptr))
	for i, v := range ids {
		require.Equal(t, int64(v), int64(binary.LittleEndian.Uint64(out[8*i:])), "id %d", i)
	}
	require.Zero(t, binary.LittleEndian.Uint64(out[8*len(ids):]), "nothing past n")

	require.NoError(t, routing.LaunchWidenIDs(d, nil, 0, 0, 0))
	require.Error(t, routing.LaunchWidenIDs(nil, nil, src.Ptr, dst.Ptr, 1))
	require.Error(t, routing.LaunchWidenIDs(d, nil, 0, dst.Ptr, 1))
	require.Error(t, routing.LaunchWidenIDs(d, nil, src.Ptr+2, dst.Ptr, 1))
	require.Error(t, routing.LaunchWidenIDs(d, nil, src.Ptr, dst.Ptr+4, 1))
	require.Error(t, routing.LaunchWidenIDs(d, nil, src.Ptr, dst.Ptr, -1))
	require.NoError(t, d.Free(src))
	require.NoError(t, d.Free(dst))
}
