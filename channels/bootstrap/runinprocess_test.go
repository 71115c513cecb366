package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRunInProcess(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	// Every rank gathers every rank's id.
	errs := RunInProcess(ctx, 4, Config{Timeout: time.Minute}, func(ctx context.Context, bs Bootstrap) error {
		all, err := bs.AllGather(ctx, []byte{byte(bs.Rank())})
		if err != nil {
			return err
		}
		for r, b := range all {
			if int(b[0]) != r || bs.Size() != 4 {
				return fmt.Errorf("rank %d: slot %d holds %v", bs.Rank(), r, b)
			}
		}
		return nil
	})
	require.Equal(t, []error{nil, nil, nil, nil}, errs)

	// A rank that fails closes its bootstrap: the others' barrier fails
	// with the peer's closing (not the minute's timeout), and each rank
	// keeps its own error.
	boom := errors.New("boom")
	errs = RunInProcess(ctx, 3, Config{Timeout: time.Minute}, func(ctx context.Context, bs Bootstrap) error {
		if bs.Rank() == 1 {
			return boom
		}
		return bs.Barrier(ctx)
	})
	require.Len(t, errs, 3)
	require.ErrorIs(t, errs[1], boom)
	// Each survivor names a peer that closed: rank 1, or the other survivor
	// when that one saw rank 1 first and closed (a race); rank 1 at least once.
	named1 := false
	for _, r := range []int{0, 2} {
		var pc *PeerClosedError
		require.ErrorAs(t, errs[r], &pc, "rank %d", r)
		require.NotEqual(t, r, pc.Rank)
		named1 = named1 || pc.Rank == 1
	}
	require.True(t, named1, "no survivor named rank 1: %v", errs)

	errs = RunInProcess(ctx, 0, Config{}, func(context.Context, Bootstrap) error { return nil })
	require.Empty(t, errs)
	errs = RunInProcess(ctx, 2, Config{Size: 3}, func(context.Context, Bootstrap) error { return nil })
	require.Len(t, errs, 2)
	require.ErrorContains(t, errs[0], "disagrees")
}
