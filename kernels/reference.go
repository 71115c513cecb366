package kernels

import "math"

// This file is the plain-Go reference for common.cuh: the same pattern hash
// and the same narrow-float conversions, bit for bit, so that the host
// backend and GPU results are checked against one definition. Change both
// sides together; reference_test.go pins the behaviour.

const (
	// FP8E4M3Max is the largest finite FP8 E4M3 value (0x7e).
	FP8E4M3Max = 448.0
	// FP8E4M3NaN is the NaN that Float32ToFP8E4M3 produces (0xff is NaN too).
	FP8E4M3NaN uint8 = 0x7f
	// BF16NaN is the canonical quiet NaN that Float32ToBF16 produces for
	// every NaN input.
	BF16NaN uint16 = 0x7fff
)

// PatternValue is the test pattern word for index i and seed (the GPU's
// goep_pattern_value): a 64-bit mix of both, folded to 32 bits.
func PatternValue(i uint64, seed uint32) uint32 {
	x := (i + 1) * 0x9e3779b97f4a7c15
	x ^= uint64(seed)<<32 | uint64(seed^0xa5a5a5a5)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return uint32(x) ^ uint32(x>>32)
}

// FillPattern sets dst[i] = PatternValue(i, seed), the host twin of the
// goep_fill_pattern kernel.
func FillPattern(dst []uint32, seed uint32) {
	for i := range dst {
		dst[i] = PatternValue(uint64(i), seed)
	}
}

// CountPatternMismatches counts the words of src that differ from the
// pattern, the host twin of goep_check_pattern.
func CountPatternMismatches(src []uint32, seed uint32) uint64 {
	var bad uint64
	for i, v := range src {
		if v != PatternValue(uint64(i), seed) {
			bad++
		}
	}
	return bad
}

// Float32ToBF16 converts f to bfloat16 bits, rounding to nearest with ties
// to even. Overflow gives ±inf, subnormals are kept, and every NaN becomes
// BF16NaN.
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return BF16NaN
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16ToFloat32 widens bfloat16 bits to float32 (exact).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToFP8E4M3 converts f to FP8 E4M3 (the OCP/NVIDIA "fn" variant)
// with round to nearest, ties to even, and saturation: magnitudes >= 448 and
// ±inf give ±448 (0x7e/0xfe), NaN gives FP8E4M3NaN, and magnitudes that
// round below 2^-9 give a zero of f's sign.
func Float32ToFP8E4M3(f float32) uint8 {
	u := math.Float32bits(f)
	sign := uint8(u>>24) & 0x80
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return FP8E4M3NaN
	case a >= 0x43e00000: // >= 448, including +inf
		return sign | 0x7e
	case a >= 0x3c800000: // >= 2^-6: normal
		v := a - 120<<23
		v += 0x7ffff + (v>>20)&1
		return sign | uint8(v>>20)
	}
	e := a >> 23
	if e < 117 { // below 2^-10, half the smallest subnormal
		return sign
	}
	sig := a&0x7fffff | 0x800000
	shift := 141 - e
	q := sig >> shift
	rem := sig & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return sign | uint8(q)
}

// FP8E4M3ToFloat32 widens FP8 E4M3 bits to float32 (exact); 0x7f and 0xff
// give a quiet NaN of that sign.
func FP8E4M3ToFloat32(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	e := uint32(b>>3) & 0xf
	m := uint32(b & 7)
	switch {
	case b&0x7f == 0x7f:
		return math.Float32frombits(sign | 0x7fc00000)
	case e == 0:
		return math.Float32frombits(sign | math.Float32bits(float32(m)*0.001953125))
	}
	return math.Float32frombits(sign | (e+120)<<23 | m<<20)
}
