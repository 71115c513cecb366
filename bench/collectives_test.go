package bench

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives"
)

// On the host backend: every algorithm checked and timed at a few sizes,
// the tuning table written and used, the JSON report.
func TestCollectivesTuneOnHostBackend(t *testing.T) {
	dir := t.TempDir()
	out, tab := filepath.Join(dir, "coll.json"), filepath.Join(dir, "tuning.json")
	code, stdout, stderr := run(t, "collectives", "--backend", "host", "--ranks", "3", "--sizes", "1K,64K,512K",
		"--tune", "--tune-out", tab, "--json", out)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Contains(t, stdout, "collectives: all checks passed")
	require.Contains(t, stdout, "MEASUREMENTS")
	rep := readJSON[collReport](t, out)
	require.Equal(t, 3, rep.Ranks)
	require.Empty(t, rep.Errors)
	algos := map[string]bool{}
	for _, r := range rep.Rows {
		require.Empty(t, r.Error, "%+v", r)
		require.Positive(t, r.US, "%+v", r)
		algos[r.Collective+"/"+r.Algorithm] = true
	}
	for _, k := range collectives.Kinds {
		for _, a := range collectives.Algorithms(k) {
			if a != collectives.AlgoNCCL {
				require.True(t, algos[k.String()+"/"+a], "%s/%s measured", k, a)
			}
		}
	}
	tt, err := collectives.LoadTuning(tab)
	require.NoError(t, err)
	require.Equal(t, 3, tt.World)
	require.NotEmpty(t, tt.Rules)
	require.Equal(t, len(tt.Rules), len(rep.Tuning.Rules))
	// The table drives a later run.
	code, stdout, stderr = run(t, "collectives", "--backend", "host", "--ranks", "3", "--sizes", "1K,64K",
		"--colls", "allreduce", "--tuning", tab)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Contains(t, stdout, "auto=")
}

func TestCollectivesFlags(t *testing.T) {
	for _, args := range [][]string{
		{"collectives", "--backend", "host", "--compare", "mpi"},
		{"collectives", "--backend", "host", "--dtype", "int4"},
		{"collectives", "--backend", "host", "--colls", "alltoall"},
		{"collectives", "--backend", "host", "--tune", "--algo", "ll"},
		{"collectives", "--backend", "host", "--ranks", "1"},
	} {
		code, _, _ := run(t, args...)
		require.Equal(t, 1, code, "%q", args)
	}
}

// --compare nccl on the host backend fails clearly: NCCL needs GPUs.
func TestCollectivesCompareNeedsNCCL(t *testing.T) {
	code, _, stderr := run(t, "collectives", "--backend", "host", "--ranks", "2", "--sizes", "1K", "--compare", "nccl")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "NCCL")
}
