package parallel

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every index is visited exactly once, for counts around the worker count.
func TestForVisitsEachIndexOnce(t *testing.T) {
	for _, procs := range []int{1, 3, 8} {
		old := runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 2, 7, 8, 9, 1000} {
			hits := make([]atomic.Int32, n)
			For(n, func(i int) { hits[i].Add(1) })
			for i := range hits {
				require.EqualValues(t, 1, hits[i].Load(), "procs %d n %d index %d", procs, n, i)
			}
		}
		runtime.GOMAXPROCS(old)
	}
}

// The values depend on the seed and n only, not on the core count, and
// every element is written.
func TestFillChunksIndependentOfCores(t *testing.T) {
	n := 3*FillChunk + 17
	fill := func(procs int) []uint64 {
		old := runtime.GOMAXPROCS(procs)
		defer runtime.GOMAXPROCS(old)
		out := make([]uint64, n)
		FillChunks(rand.New(rand.NewPCG(1, 2)), n, func(rng *rand.Rand, lo, hi int) {
			for i := lo; i < hi; i++ {
				out[i] = rng.Uint64() | 1
			}
		})
		return out
	}
	a, b := fill(1), fill(8)
	require.Equal(t, a, b)
	for i, v := range a {
		require.NotZero(t, v, "element %d not written", i)
	}
}
