package bench

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The host backend runs the quick checks and the measurements on four
// goroutine ranks and writes the JSON report (the full --check suite runs
// in the channels package tests, which share its code).
func TestChannelsOnHostBackend(t *testing.T) {
	out := filepath.Join(t.TempDir(), "channels.json")
	code, stdout, stderr := run(t, "channels", "--backend", "host", "--sizes", "8,1K,64K", "--sms", "2",
		"--peer-bytes", "64K", "--rounds", "100", "--iters", "2", "--json", out)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"put/get", "LL16 packets", "LL8 graph replays",
		"signal/wait round trip", "LL8 exchange round", "put to all peers (all-to-all)", "port put/signal/flush",
		"port atomicAdd", "port signal/wait round trip", "plain CE copy", "channels: all checks passed"} {
		require.Contains(t, stdout, want)
	}
	rep := readJSON[chanReport](t, out)
	require.Equal(t, 4, rep.Ranks)
	require.Empty(t, rep.Errors)
	require.Len(t, rep.Checks, 10)
	kinds := map[string]int{}
	for _, r := range rep.Results {
		kinds[r.Primitive]++
		require.Positive(t, r.LatencyUS, "%+v", r)
	}
	require.Equal(t, 3, kinds["signal/wait round trip"], "rank 0 with each of 3 peers")
	require.Equal(t, 3, kinds["put"])
	require.Equal(t, 1, kinds["put to all peers (one sender)"])
	require.Equal(t, 3, kinds["port signal/wait round trip"], "rank 0 with each of 3 peers")
	require.Equal(t, 3, kinds["port put"], "one per size")
	require.Equal(t, 3, kinds["plain CE copy"], "beside each port put")
	require.Equal(t, 2, kinds["port atomicAdd"], "one counter and 64")
}

func TestChannelsFlags(t *testing.T) {
	for _, args := range [][]string{
		{"channels", "--backend", "host", "--sizes", "12Q"},
		{"channels", "--backend", "host", "--threads", "33"},
		{"channels", "--backend", "host", "--ranks", "1"},
		{"channels", "--backend", "tpu"},
	} {
		code, _, _ := run(t, args...)
		require.Equal(t, 1, code, "%q", args)
	}
	got, err := parseSizes("8, 4k,1M,2G", "")
	require.NoError(t, err)
	require.Equal(t, []int{8, 4 << 10, 1 << 20, 2 << 30}, got)
}

// Under a launcher the host backend cannot share memory across processes.
func TestChannelsHostBackendRefusesProcesses(t *testing.T) {
	t.Setenv("RANK", "0")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", "1")
	code, _, stderr := run(t, "channels", "--backend", "host")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "goroutine ranks of one process")
}
