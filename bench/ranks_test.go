package bench

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// lockstep agrees on the AND of every rank's verdict, round after round,
// and a rank that leaves releases the others with an error.
func TestLockstep(t *testing.T) {
	const n, rounds = 4, 200
	l := newLockstep(n)
	got := make([][]bool, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				// Round i fails when rank i%(n+1) says so (never for i%(n+1) == n).
				v, err := l.all(i%(n+1) != r)
				if err != nil {
					t.Error(err)
					return
				}
				got[r] = append(got[r], v)
			}
		}()
	}
	wg.Wait()
	for r := range n {
		require.Len(t, got[r], rounds)
		for i, v := range got[r] {
			require.Equal(t, i%(n+1) == n, v, "rank %d round %d", r, i)
		}
	}
	// Rank 0 fails instead of arriving: the others are released.
	errs := make(chan error, n-1)
	for r := 1; r < n; r++ {
		go func() { _, err := l.all(true); errs <- err }()
	}
	l.leave()
	for r := 1; r < n; r++ {
		require.ErrorIs(t, <-errs, errRankLeft)
	}
	_, err := l.all(true)
	require.ErrorIs(t, err, errRankLeft)
}
