package intranodetest

import (
	"math/rand/v2"

	"github.com/goep-dev/goep/internal/parallel"
)

// RandBF16 draws n BF16 values of either sign with magnitudes in
// [2^-8, 2^8) and random mantissas, cheaply and on all cores (GPU-sized
// tests draw billions); the values depend on rng and n only. With special,
// about 1 in 64 is one of +-0, +-inf, NaN, a subnormal or the largest
// finite value. The intranode and ep tests draw their rows with it.
func RandBF16(rng *rand.Rand, n int, special bool) []uint16 {
	x := make([]uint16, n)
	specials := []uint16{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8003, 0x7f7f}
	parallel.FillChunks(rng, n, func(rng *rand.Rand, lo, hi int) {
		var bits uint64
		for i := lo; i < hi; i++ {
			if (i-lo)%4 == 0 {
				bits = rng.Uint64()
			}
			v := uint16(bits)
			bits >>= 16
			exp := 119 + uint16(v>>8)&15 // 2^-8 .. 2^7
			x[i] = v&0x8000 | exp<<7 | v&0x7f
			if special && v&0x3f00 == 0x1100 { // 1 in 64
				x[i] = specials[int(v>>7)%len(specials)]
			}
		}
	})
	return x
}
