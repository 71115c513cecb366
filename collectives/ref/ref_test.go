package ref

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// FP16 conversions against the definition: every binary16 value widens
// exactly and rounds back to itself; float32 values between two binary16
// neighbours round to the nearer (ties to even); overflow and NaN.
func TestFP16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := FP16ToFloat32(uint16(h))
		if f != f {
			require.Equal(t, FP16NaN, Float32ToFP16(f))
			continue
		}
		require.Equal(t, uint16(h), Float32ToFP16(f), "%#04x (%g)", h, f)
		if h&0x7fff < 0x7bff { // a finite successor of the same sign
			next := FP16ToFloat32(uint16(h + 1))
			mid := float32((float64(f) + float64(next)) / 2)
			want := uint16(h)
			if h&1 == 1 {
				want = uint16(h + 1)
			}
			require.Equal(t, want, Float32ToFP16(mid), "tie between %#04x and %#04x", h, h+1)
			above := math.Nextafter32(mid, next)
			if math.Abs(float64(f)) < math.Abs(float64(next)) {
				require.Equal(t, uint16(h+1), Float32ToFP16(above))
			}
		}
	}
	require.Equal(t, uint16(0x7c00), Float32ToFP16(65520))
	require.Equal(t, uint16(0x7bff), Float32ToFP16(65519))
	require.Equal(t, uint16(0xfc00), Float32ToFP16(float32(math.Inf(-1))))
	require.Equal(t, uint16(0x0000), Float32ToFP16(0x1p-25))
	require.Equal(t, uint16(0x0001), Float32ToFP16(math.Nextafter32(0x1p-25, 1)))
}

func TestReduceSemantics(t *testing.T) {
	one, two := FromFloat32(BF16, 1), FromFloat32(BF16, 2)
	negz, posz := uint32(0x8000), uint32(0)
	require.Equal(t, FromFloat32(BF16, 4), Reduce(BF16, Sum, []uint32{one, one, two}))
	require.Equal(t, negz, Reduce(BF16, Min, []uint32{negz, posz}), "ties keep the earlier rank")
	require.Equal(t, posz, Reduce(BF16, Min, []uint32{posz, negz}))
	// Sums accumulate in float32 and round once: 256 + 1 + 1 in bf16 steps
	// would stay 256; in float32 it is 258, which bf16 holds.
	x := FromFloat32(BF16, 256)
	require.Equal(t, FromFloat32(BF16, 258), Reduce(BF16, Sum, []uint32{x, one, one}))
}

func TestSmallIntFillIsExact(t *testing.T) {
	for _, d := range DataTypes {
		for i := uint64(0); i < 1000; i++ {
			v := ToFloat32(d, FillElem(d, FillSmallInt, 7, 3, i))
			require.True(t, v == float32(int(v)) && v >= -8 && v <= 8, "%s: %v", d, v)
		}
	}
	for i := uint64(0); i < 1000; i++ {
		b := FillElem(FP8E4M3, FillRandom, 1, 0, i)
		require.NotEqual(t, uint32(0x7f), b&0x7f, "fp8 fill is NaN-free")
	}
}
