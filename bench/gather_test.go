package bench

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
)

func TestGatherOutcomesBringsEveryRankToRoot(t *testing.T) {
	const ranks = 3
	bss, err := bootstrap.NewInProcess(ranks, bootstrap.Config{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	outs := make([][]chanOutcome, ranks)
	roots := make([]bool, ranks)
	errs := make([]error, ranks)
	stdout := make([]bytes.Buffer, ranks)
	for r := range bss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer bss[r].Close()
			mine := chanOutcome{}
			if r == 2 {
				mine.Err = "rank 2 broke"
			}
			outs[r], roots[r], errs[r] = gatherOutcomes(context.Background(), bss[r], &stdout[r], mine)
		}()
	}
	wg.Wait()
	require.True(t, roots[0])
	require.NoError(t, errs[0])
	require.Len(t, outs[0], ranks)
	require.Equal(t, "rank 2 broke", outs[0][2].Err, "rank 0 sees rank 2's failure")
	require.Empty(t, outs[0][1].Err)
	require.False(t, roots[1])
	require.NoError(t, errs[1])
	require.Equal(t, "rank 1: done\n", stdout[1].String())
	require.False(t, roots[2])
	require.EqualError(t, errs[2], "rank 2 broke", "a failing rank reports its own failure")
}
