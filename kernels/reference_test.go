package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func f32(u uint32) float32 { return math.Float32frombits(u) }

// --- bfloat16 ---------------------------------------------------------------

func TestBF16RoundTripsAllValues(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		f := BF16ToFloat32(h)
		// Widening is exact: the float's bits are h followed by zeros.
		require.Equal(t, uint32(h)<<16, math.Float32bits(f))
		exp, man := h>>7&0xff, h&0x7f
		if exp == 0xff && man != 0 {
			require.True(t, math.IsNaN(float64(f)), "%#04x", h)
			require.Equal(t, BF16NaN, Float32ToBF16(f), "NaN %#04x narrows to the canonical NaN", h)
			continue
		}
		require.Equal(t, h, Float32ToBF16(f), "round trip of %#04x (%g)", h, f)
	}
}

// bf16Oracle rounds x to bfloat16 by brute force: the two truncation
// neighbours, the nearer one, ties to the even one. Only for finite x whose
// rounding stays finite or goes to inf.
func bf16Oracle(x float32) uint16 {
	u := math.Float32bits(x)
	lo := uint16(u >> 16) // truncation toward zero (same sign)
	hi := lo + 1
	dLo := math.Abs(float64(x) - float64(BF16ToFloat32(lo)))
	var dHi float64
	if lo&0x7fff == 0x7f7f { // next step is inf: treat as the IEEE "next" value 2^128
		dHi = math.Abs(math.Abs(float64(x)) - math.Ldexp(1, 128))
	} else {
		dHi = math.Abs(float64(x) - float64(BF16ToFloat32(hi)))
	}
	switch {
	case dLo < dHi:
		return lo
	case dHi < dLo:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestBF16MatchesOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(u uint32) {
		x := f32(u)
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return
		}
		require.Equal(t, bf16Oracle(x), Float32ToBF16(x), "x=%g (%#08x)", x, u)
	}
	for range 1 << 20 {
		check(rng.Uint32())
	}
	// Every float whose low 16 bits sit at or next to the halfway point.
	for hi := range 1 << 16 {
		for _, lo := range []uint32{0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff} {
			check(uint32(hi)<<16 | lo)
		}
	}
}

func TestBF16Specials(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
		what string
	}{
		{0x3f800000, 0x3f80, "1.0"},
		{0x3f808000, 0x3f80, "1 + half ulp ties to even (down)"},
		{0x3f818000, 0x3f82, "1 + 3 half ulps ties to even (up)"},
		{0x3f808001, 0x3f81, "just above the tie rounds up"},
		{0x3f807fff, 0x3f80, "just below the tie rounds down"},
		{0x7f7fffff, 0x7f80, "max float rounds to +inf"},
		{0x7f7f7fff, 0x7f7f, "stays at max bf16"},
		{0xff7fffff, 0xff80, "-max float rounds to -inf"},
		{0x7f800000, 0x7f80, "+inf"},
		{0xff800000, 0xff80, "-inf"},
		{0x00000000, 0x0000, "+0"},
		{0x80000000, 0x8000, "-0"},
		{0x00000001, 0x0000, "smallest subnormal rounds to 0"},
		{0x00008000, 0x0000, "subnormal tie to even (0)"},
		{0x00018000, 0x0002, "subnormal tie to even (2)"},
		{0x00010000, 0x0001, "smallest bf16 subnormal is kept"},
		{0x007fffff, 0x0080, "largest subnormal rounds up to smallest normal"},
		{0x7fc00000, BF16NaN, "quiet NaN"},
		{0xffc00001, BF16NaN, "negative NaN"},
		{0x7f800001, BF16NaN, "signalling NaN whose payload is in the low bits"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Float32ToBF16(f32(c.in)), "%s (%#08x)", c.what, c.in)
	}
	assert.True(t, math.IsNaN(float64(BF16ToFloat32(BF16NaN))))
}

// --- FP8 E4M3 -----------------------------------------------------------------

func TestFP8DecodeTable(t *testing.T) {
	cases := map[uint8]float32{
		0x00: 0, 0x38: 1, 0x40: 2, 0x30: 0.5, 0x3c: 1.5, 0x7e: 448, 0x7d: 416, 0x78: 256,
		0x08: 1.0 / 64, 0x01: 1.0 / 512, 0x07: 7.0 / 512, 0x04: 4.0 / 512,
		0xb8: -1, 0xfe: -448, 0x81: -1.0 / 512,
	}
	for b, want := range cases {
		assert.Equal(t, want, FP8E4M3ToFloat32(b), "%#02x", b)
	}
	assert.Equal(t, uint32(0x80000000), math.Float32bits(FP8E4M3ToFloat32(0x80)), "0x80 is -0")
	for _, b := range []uint8{0x7f, 0xff} {
		f := FP8E4M3ToFloat32(b)
		assert.True(t, math.IsNaN(float64(f)), "%#02x is NaN", b)
		assert.Equal(t, b&0x80 != 0, math.Signbit(float64(f)), "NaN keeps its sign")
	}
}

func TestFP8RoundTripsAllValues(t *testing.T) {
	prev := float32(-1)
	for b := range 256 {
		b := uint8(b)
		f := FP8E4M3ToFloat32(b)
		if b&0x7f == 0x7f {
			require.Equal(t, FP8E4M3NaN, Float32ToFP8E4M3(f))
			continue
		}
		require.Equal(t, b, Float32ToFP8E4M3(f), "round trip of %#02x (%g)", b, f)
		if b < 0x80 {
			require.Greater(t, f, prev, "positive codes are strictly increasing at %#02x", b)
			prev = f
		}
	}
}

// fp8Oracle rounds a finite x by brute force over all positive codes:
// nearest value, ties to the even code, saturating at 448.
func fp8Oracle(x float32) uint8 {
	var sign uint8
	ax := float64(x)
	if math.Signbit(ax) {
		sign, ax = 0x80, -ax
	}
	if ax >= FP8E4M3Max {
		return sign | 0x7e
	}
	best, bestD := uint8(0), math.Inf(1)
	for c := uint8(0); c <= 0x7e; c++ {
		d := math.Abs(ax - float64(FP8E4M3ToFloat32(c)))
		if d < bestD || (d == bestD && c&1 == 0) {
			best, bestD = c, d
		}
	}
	return sign | best
}

func TestFP8MatchesOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	check := func(x float32) {
		require.Equal(t, fp8Oracle(x), Float32ToFP8E4M3(x), "x=%g (%#08x)", x, math.Float32bits(x))
	}
	// Random floats over the interesting exponent range, 2^-12 .. 2^10.
	for range 100_000 {
		e := 115 + rng.Uint32N(23)
		u := rng.Uint32()&0x807fffff | e<<23
		check(f32(u))
	}
	// Every midpoint between neighbouring codes, and the floats next to it.
	for c := uint8(0); c < 0x7e; c++ {
		lo, hi := FP8E4M3ToFloat32(c), FP8E4M3ToFloat32(c+1)
		mid := float32((float64(lo) + float64(hi)) / 2) // exact in float32
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000), lo, hi} {
			check(x)
			check(-x)
		}
	}
}

func TestFP8Specials(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		in   float32
		want uint8
		what string
	}{
		{448, 0x7e, "max"},
		{449, 0x7e, "above max saturates"},
		{464, 0x7e, "tie between 448 and (NaN) 480 saturates"},
		{465, 0x7e, "saturates"},
		{1e6, 0x7e, "saturates"},
		{math.MaxFloat32, 0x7e, "saturates"},
		{inf, 0x7e, "+inf saturates"},
		{-inf, 0xfe, "-inf saturates"},
		{-500, 0xfe, "negative saturates"},
		{432, 0x7e, "tie between 416 and 448 goes to even 0x7e"},
		{400, 0x7c, "tie between 384 (0x7c) and 416 (0x7d) goes to even"},
		{1.0625, 0x38, "1 + half step ties to even (down)"},
		{1.1875, 0x3a, "1 + 3 half steps ties to even (up)"},
		{0, 0x00, "+0"},
		{float32(math.Copysign(0, -1)), 0x80, "-0"},
		{1.0 / 1024, 0x00, "half the smallest subnormal ties to 0"},
		{math.Nextafter32(1.0/1024, 1), 0x01, "just above half rounds up"},
		{-1.0 / 1024, 0x80, "negative underflow keeps the sign"},
		{3.0 / 1024, 0x02, "1.5 subnormal steps ties to even 2"},
		{15.0 / 1024, 0x08, "between 7*2^-9 and 2^-6 ties to even 0x08"},
		{1e-30, 0x00, "tiny"},
		{f32(1), 0x00, "float subnormal"},
		{f32(0x80000001), 0x80, "negative float subnormal"},
		{float32(math.NaN()), FP8E4M3NaN, "NaN"},
		{f32(0xffc00000), FP8E4M3NaN, "negative NaN"},
		{f32(0x7f800001), FP8E4M3NaN, "signalling NaN"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Float32ToFP8E4M3(c.in), "%s (%g)", c.what, c.in)
	}
}

// --- pattern ----------------------------------------------------------------

func TestPatternValue(t *testing.T) {
	// Pinned values: the CUDA twin in common.cuh produces the same (checked
	// on an H200), so changing either side breaks this on purpose.
	pinned := []struct {
		i    uint64
		seed uint32
		want uint32
	}{
		{0x0, 0x0, 0x3488f7ca},
		{0x1, 0x0, 0x1e70f7ef},
		{0x0, 0x1, 0x8a466b01},
		{0x3039, 0x2a, 0x10ca510b},
		{0x10000000000, 0xdeadbeef, 0x3d88193b},
		{0xffffffffffffffff, 0xffffffff, 0x180874e8},
	}
	for _, p := range pinned {
		assert.Equal(t, p.want, PatternValue(p.i, p.seed), "PatternValue(%#x, %#x)", p.i, p.seed)
	}
	assert.NotZero(t, PatternValue(0, 0), "zeroed memory must not pass a check")
	differ := 0
	for i := range uint64(10_000) {
		if PatternValue(i, 1) != PatternValue(i, 2) {
			differ++
		}
		if PatternValue(i, 1) != PatternValue(i+1, 1) {
			differ++
		}
	}
	assert.Greater(t, differ, 19_990)

	buf := make([]uint32, 1000)
	FillPattern(buf, 7)
	assert.Zero(t, CountPatternMismatches(buf, 7))
	assert.Greater(t, CountPatternMismatches(buf, 8), uint64(990), "another seed gives another pattern")
	buf[10]++
	buf[999] = 0
	assert.Equal(t, uint64(2), CountPatternMismatches(buf, 7))
}
