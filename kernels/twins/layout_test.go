package twins_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	_ "github.com/goep-dev/goep/kernels/twins"
	"github.com/goep-dev/goep/routing"
)

// The twins read the kernel's parameter list in the kernel's order; this
// pins it with a hand-packed launch (LaunchLayout packs the same list).
func TestLayoutTwinArgumentOrder(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	// 2 tokens, K=2, 4 experts on 2 ranks; token 1 has a bad id (7).
	for _, kernel := range []string{routing.KernelLayoutInt64, routing.KernelLayoutInt32} {
		elem := 8
		if kernel == routing.KernelLayoutInt32 {
			elem = 4
		}
		ids := []int64{1, 2, 7, -1}
		raw := make([]byte, elem*len(ids))
		for i, v := range ids {
			if elem == 8 {
				binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
			} else {
				binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
			}
		}
		mem, err := d.Alloc(len(raw) + 4*2 + 4*4 + 4 + 4)
		require.NoError(t, err)
		topk, perRank, perExpert, invalid, inRank := mem.Ptr, mem.Ptr+uintptr(len(raw)), mem.Ptr+uintptr(len(raw)+8), mem.Ptr+uintptr(len(raw)+24), mem.Ptr+uintptr(len(raw)+28)
		require.NoError(t, d.CopyIn(topk, raw))
		args := device.NewArgs(10).Ptr(topk).I32(2).I32(2).I32(4).I32(2).
			Ptr(perRank).Ptr(perExpert).Ptr(inRank).Ptr(invalid).Ptr(0)
		require.NoError(t, d.Launch(kernel, device.D1(1), device.D1(32), 0, nil, args))
		out := make([]byte, mem.Size)
		require.NoError(t, d.CopyOut(out, mem.Ptr))
		o := len(raw)
		i32 := func(at int) int32 { return int32(binary.LittleEndian.Uint32(out[at:])) }
		assert.Equal(t, []int32{1, 1}, []int32{i32(o), i32(o + 4)}, "%s: tokens per rank", kernel)
		assert.Equal(t, []int32{0, 1, 1, 0}, []int32{i32(o + 8), i32(o + 12), i32(o + 16), i32(o + 20)}, "%s: tokens per expert", kernel)
		assert.Equal(t, int32(1), i32(o+24), "%s: invalid entries", kernel)
		assert.Equal(t, []byte{1, 1, 0, 0}, out[o+28:o+32], "%s: is_token_in_rank", kernel)
		require.NoError(t, d.Free(mem))
	}
}

func TestLayoutTwinRejectsBadShape(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	args := device.NewArgs(10).Ptr(0).I32(1).I32(1).I32(6).I32(4).Ptr(0).Ptr(0).Ptr(0).Ptr(0).Ptr(0)
	err := d.Launch(routing.KernelLayoutInt64, device.D1(1), device.D1(32), 0, nil, args)
	assert.ErrorContains(t, err, "do not divide evenly")
	err = d.Launch(routing.KernelLayoutInt32, device.D1(1), device.D1(32), 0, nil, device.NewArgs(1).Ptr(0))
	assert.ErrorContains(t, err, "out of range", "a short argument list is an error, not a crash")
}
