// Package checked holds overflow-checked size arithmetic for host code that
// turns caller-given counts into byte sizes (issue 18: sizes never wrap).
package checked

import (
	"math"
	"math/bits"
)

// Mul is a*b for non-negative a and b; false when either is negative or the
// product does not fit an int.
func Mul(a, b int) (int, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt {
		return 0, false
	}
	return int(lo), true
}
