package cuda

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKernelArgsAlignment(t *testing.T) {
	a := NewKernelArgs()
	a.Ptr(0x1122334455667788)                                                   // 0
	a.U8(0xAB)                                                                  // 8
	a.U16(0xBEEF)                                                               // 10
	a.U32(0xCAFEF00D)                                                           // 12
	a.U8(7)                                                                     // 16
	a.U64(0x0102030405060708)                                                   // 24
	a.F32(1.5)                                                                  // 32
	a.I32(-3)                                                                   // 36
	a.I64(-5)                                                                   // 40
	a.F64(math.Pi)                                                              // 48
	a.U8(1)                                                                     // 56
	a.Struct([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 16) // 64
	a.U16(2)                                                                    // 80

	want := []int{0, 8, 10, 12, 16, 24, 32, 36, 40, 48, 56, 64, 80}
	require.Equal(t, len(want), a.Len())
	for i, off := range want {
		assert.Equal(t, off, a.Offset(i), "param %d", i)
	}
	assert.Equal(t, 82, a.Size())

	b := a.Bytes()
	ne := binary.NativeEndian
	assert.Equal(t, uint64(0x1122334455667788), ne.Uint64(b[0:]))
	assert.Equal(t, byte(0xAB), b[8])
	assert.Equal(t, byte(0), b[9], "padding must be zero")
	assert.Equal(t, uint16(0xBEEF), ne.Uint16(b[10:]))
	assert.Equal(t, uint32(0xCAFEF00D), ne.Uint32(b[12:]))
	assert.Equal(t, byte(7), b[16])
	assert.Equal(t, make([]byte, 7), b[17:24], "padding must be zero")
	assert.Equal(t, uint64(0x0102030405060708), ne.Uint64(b[24:]))
	assert.Equal(t, float32(1.5), math.Float32frombits(ne.Uint32(b[32:])))
	assert.Equal(t, int32(-3), int32(ne.Uint32(b[36:])))
	assert.Equal(t, int64(-5), int64(ne.Uint64(b[40:])))
	assert.Equal(t, math.Pi, math.Float64frombits(ne.Uint64(b[48:])))
	assert.Equal(t, byte(1), b[56])
	assert.Equal(t, byte(1), b[64])
	assert.Equal(t, byte(16), b[79])
	assert.Equal(t, uint16(2), ne.Uint16(b[80:]))
}

func TestKernelArgsResetReusesStorage(t *testing.T) {
	a := NewKernelArgs()
	fill := func() {
		a.Reset().Ptr(0xdead0000).U32(10).U32(20).U64(30).F32(2)
	}
	fill()
	assert.Equal(t, 5, a.Len())
	allocs := testing.AllocsPerRun(1000, fill)
	assert.Zero(t, allocs, "refilling a KernelArgs must not allocate")

	a.Reset()
	assert.Zero(t, a.Len())
	assert.Zero(t, a.Size())
	a.U8(1).U32(2)
	assert.Equal(t, 4, a.Offset(1))
	assert.Equal(t, byte(0), a.Bytes()[1], "stale bytes in padding must be cleared after Reset")
}

func TestKernelArgsGrowth(t *testing.T) {
	var a KernelArgs // the zero value works too
	for i := 0; i < 200; i++ {
		a.U8(uint8(i)).U64(uint64(i))
	}
	require.Equal(t, 400, a.Len())
	for i := 0; i < 200; i++ {
		assert.Equal(t, 16*i, a.Offset(2*i))
		assert.Equal(t, 16*i+8, a.Offset(2*i+1))
		assert.Equal(t, uint64(i), binary.NativeEndian.Uint64(a.Bytes()[16*i+8:]))
	}
}

func TestKernelArgsStructBadAlign(t *testing.T) {
	assert.Panics(t, func() { NewKernelArgs().Struct([]byte{1}, 3) })
	assert.Panics(t, func() { NewKernelArgs().Struct([]byte{1}, 0) })
}

func TestLaunchTooManyParams(t *testing.T) {
	a := NewKernelArgs()
	for i := 0; i <= MaxKernelParams; i++ {
		a.U32(uint32(i))
	}
	// Rejected before any driver call, so no GPU (or function) is needed.
	err := Launch(&Function{}, Dim3{X: 1}, Dim3{X: 1}, 0, nil, a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "65 kernel parameters, at most 64")
	err = LaunchCooperative(&Function{}, Dim3{X: 1}, Dim3{X: 1}, 0, nil, a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuLaunchCooperativeKernel")
}

func TestAsBytes(t *testing.T) {
	assert.Nil(t, AsBytes([]uint32(nil)))
	b := AsBytes([]uint32{0x04030201, 0x08070605})
	require.Len(t, b, 8)
	assert.Equal(t, binary.NativeEndian.Uint32(b[4:]), uint32(0x08070605))
	type pair struct{ A, B uint16 }
	assert.Len(t, AsBytes([]pair{{1, 2}, {3, 4}, {5, 6}}), 12)
}

func TestImageKind(t *testing.T) {
	assert.True(t, isBinaryImage([]byte("\x7fELF\x02\x01")))
	assert.True(t, isBinaryImage([]byte{0x50, 0xED, 0x55, 0xBA, 1, 0}))
	assert.False(t, isBinaryImage([]byte(".version 7.8\n")))
	assert.False(t, isBinaryImage([]byte("ab")))
}

func TestVMMHelpers(t *testing.T) {
	assert.Equal(t, 2<<20, roundUp(1, 2<<20))
	assert.Equal(t, 2<<20, roundUp(2<<20, 2<<20))
	assert.Equal(t, 4<<20, roundUp(2<<20+1, 2<<20))

	ctx := &Context{dev: Device{ordinal: 1, h: 1}}
	got := accessList(ctx, []Device{{ordinal: 0}, {ordinal: 1}, {ordinal: 3}, {ordinal: 0}})
	assert.Equal(t, []int{1, 0, 3}, cints(got))
	assert.Equal(t, []int{1}, cints(accessList(ctx, nil)))
}

func TestDim3(t *testing.T) {
	y, z := Dim3{X: 5}.yz()
	assert.EqualValues(t, 1, y)
	assert.EqualValues(t, 1, z)
	y, z = Dim3{X: 5, Y: 2, Z: 3}.yz()
	assert.EqualValues(t, 2, y)
	assert.EqualValues(t, 3, z)
}

func TestDevicePtrAdd(t *testing.T) {
	assert.Equal(t, DevicePtr(0x1010), DevicePtr(0x1000).Add(16))
}

func cints[T ~int32](s []T) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

func TestLaunchPackedOffsetsChecked(t *testing.T) {
	// Rejected before any driver call, so no GPU (or function) is needed.
	err := LaunchPacked(&Function{}, Dim3{X: 1}, Dim3{X: 1}, 0, nil, make([]byte, 8), []uint32{0, 8})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "parameter 1 at offset 8 is outside the 8-byte buffer")
}
