package spawn

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
)

// Class 8: -n is bounded before anything is forked.
func TestNBounded(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	opts := options("sleep", 100000, &stdout, &stderr)
	start := time.Now()
	err := Run(context.Background(), opts)
	require.ErrorContains(t, err, "N=100000")
	require.ErrorContains(t, err, "bound")
	require.Less(t, time.Since(start), 2*time.Second, "refused at once, not after forking")
	require.Empty(t, stdout.String())
	opts.N, opts.MaxN = 3, 2
	require.ErrorContains(t, Run(context.Background(), opts), "bound of 2")
}

// Class 8: a signal while ranks are being started stops the starting and
// kills what was started.
func TestSignalStopsSpawning(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	opts := options("sleep", 48, &stdout, &stderr)
	opts.MaxN = 48
	opts.GracePeriod = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(5 * time.Millisecond); cancel() }()
	start := time.Now()
	err := Run(ctx, opts)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, errors.Is(err, errInterrupted), "%v", err)
	require.Less(t, time.Since(start), 10*time.Second)
}

// Class 8: when a rank dies and others exit because of it, the launcher
// names the rank that failed on its own, even when the others were reaped
// first, and lists the others.
func TestFirstOwnFailureNamed(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	opts := options("peerdeath", 3, &stdout, &stderr)
	opts.Settle = time.Second
	err := Run(context.Background(), opts)
	var re *RankError
	require.ErrorAs(t, err, &re, "stderr:\n%s", stderr.String())
	require.Equal(t, 1, re.Rank, "%v", err)
	require.Equal(t, 5, re.ExitCode)
	require.ElementsMatch(t, []int{0, 2}, re.Also)
	require.Contains(t, err.Error(), "rank 1 exited with status 5")
}

// culprit on its own: a rank killed by a signal beats one that exited with
// a status; blame in the output beats order.
func TestCulpritChoice(t *testing.T) {
	j := &job{}
	j.noteLine(0, []byte("x: peer rank 3 is gone: EOF\n"))
	j.noteLine(3, []byte("peer rank 3 is gone\n")) // a rank never blames itself
	require.Equal(t, 3, j.blamed(0))
	require.Equal(t, -1, j.blamed(3))
}

// Class 8: a rank whose root never opens its bootstrap server is told that
// rank 0 is missing, not only that an address refused.
func TestMissingRankZeroNamed(t *testing.T) {
	port, err := freePort()
	require.NoError(t, err)
	_, err = bootstrap.Connect(context.Background(), bootstrap.Config{Rank: 1, Size: 2, UniqueID: "x",
		RootAddr: "127.0.0.1:" + strconv.Itoa(port), Timeout: 300 * time.Millisecond})
	require.ErrorIs(t, err, bootstrap.ErrTimeout)
	require.ErrorContains(t, err, "rank 0's bootstrap server")
}
