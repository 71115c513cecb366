// Package parallel spreads independent pieces of host work over every core:
// the plain-Go references and the GPU tests' input generation handle
// gigabytes a round, and one core made them the slowest part of a GPU run.
package parallel

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
)

// For calls f(i) for every i in [0, n), on up to GOMAXPROCS goroutines
// that take the next index from a shared counter, and returns when all are
// done. The calls must be independent: each writes only its own outputs.
func For(n int, f func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := 0; i < n; i++ {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// FillChunk is the size of FillChunks' pieces.
const FillChunk = 1 << 16

// FillChunks fills n elements in pieces of FillChunk on every core: f
// fills [lo, hi) from its own PCG stream, seeded by one draw of rng and the
// piece's index, so the values depend on rng and n only, never on the core
// count.
func FillChunks(rng *rand.Rand, n int, f func(rng *rand.Rand, lo, hi int)) {
	seed := rng.Uint64()
	chunks := (n + FillChunk - 1) / FillChunk
	For(chunks, func(c int) {
		f(rand.New(rand.NewPCG(seed, uint64(c))), c*FillChunk, min(n, (c+1)*FillChunk))
	})
}
