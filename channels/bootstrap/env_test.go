package bootstrap

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromEnvLaunchers(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want EnvInfo
	}{
		{"none", map[string]string{"HOME": "/root", "MASTER_ADDR": "ignored"},
			EnvInfo{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, Launcher: "none"}},
		{"torchrun", map[string]string{"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
			"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"},
			EnvInfo{Rank: 5, Size: 16, LocalRank: 1, LocalSize: 4, MasterAddr: "node0", MasterPort: 29500, RootPort: 29500,
				Launcher: "torchrun", RunID: "torchrun/abc/0"}},
		{"torchrun with agent store uses the next port", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"},
			EnvInfo{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, RootPort: 29501, Launcher: "torchrun"}},
		{"torchrun without local variables is one host", map[string]string{"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
			EnvInfo{Rank: 2, Size: 4, LocalRank: 2, LocalSize: 4, MasterAddr: "h", MasterPort: 1, RootPort: 1, Launcher: "torchrun"}},
		{"goep launcher", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4000", "GOEP_RUN_ID": "r1", "TORCHELASTIC_RUN_ID": "not-used"},
			EnvInfo{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, MasterAddr: "127.0.0.1", MasterPort: 4000, RootPort: 4000, Launcher: "torchrun", RunID: "r1"}},
		{"single torchrun rank needs no master", map[string]string{"RANK": "0", "WORLD_SIZE": "1"},
			EnvInfo{Rank: 0, Size: 1, LocalRank: 0, LocalSize: 1, Launcher: "torchrun"}},
		{"mpirun", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "1234", "PMIX_NAMESPACE": "ns1",
			"SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
			EnvInfo{Rank: 3, Size: 8, LocalRank: 3, LocalSize: 4, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "mpirun", RunID: "pmix/ns1",
				Enclosing: "slurm"}},
		{"mpirun in a batch script: Slurm's rank 0 is the script's", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
			"MASTER_ADDR": "h0", "MASTER_PORT": "1234", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"},
			EnvInfo{Rank: 3, Size: 4, LocalRank: 3, LocalSize: 4, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "mpirun", Enclosing: "slurm"}},
		{"torchrun started by mpirun, one agent per node", map[string]string{"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8",
			"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"},
			EnvInfo{Rank: 5, Size: 16, LocalRank: 5, LocalSize: 8, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "torchrun", Enclosing: "mpirun"}},
		{"torchrun and Open MPI agreeing", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
			"MASTER_ADDR": "h0", "MASTER_PORT": "1234"},
			EnvInfo{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "torchrun"}},
		{"torchrun under srun", map[string]string{"RANK": "9", "WORLD_SIZE": "16", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
			"MASTER_ADDR": "h0", "MASTER_PORT": "1234"},
			EnvInfo{Rank: 9, Size: 16, LocalRank: 9, LocalSize: 16, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "torchrun", Enclosing: "slurm"}},
		{"GOEP_LAUNCHER picks Open MPI over stale torchrun variables", map[string]string{"RANK": "0", "WORLD_SIZE": "2",
			"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "1234", "GOEP_LAUNCHER": "mpirun"},
			EnvInfo{Rank: 3, Size: 4, LocalRank: 3, LocalSize: 4, MasterAddr: "h0", MasterPort: 1234, RootPort: 1234, Launcher: "mpirun"}},
		{"GOEP_LAUNCHER=none ignores every launcher", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "GOEP_LAUNCHER": "none"},
			EnvInfo{Size: 1, LocalSize: 1, Launcher: "none"}},
		{"slurm with ntasks per node", map[string]string{"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
			"SLURM_NTASKS_PER_NODE": "8", "SLURM_TASKS_PER_NODE": "3(x9)", "MASTER_ADDR": "n0", "MASTER_PORT": "29500",
			"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"},
			EnvInfo{Rank: 9, Size: 16, LocalRank: 1, LocalSize: 8, MasterAddr: "n0", MasterPort: 29500, RootPort: 29500, Launcher: "slurm", RunID: "slurm/77.0"}},
		{"slurm tasks per node first field", map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3",
			"SLURM_TASKS_PER_NODE": "8(x2)", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"},
			EnvInfo{Rank: 3, Size: 16, LocalRank: 3, LocalSize: 8, MasterAddr: "n0", MasterPort: 29500, RootPort: 29500, Launcher: "slurm"}},
		{"slurm tasks per node indexed by node id", map[string]string{"SLURM_PROCID": "16", "SLURM_NTASKS": "18", "SLURM_LOCALID": "0",
			"SLURM_TASKS_PER_NODE": "8(x2),2", "SLURM_NODEID": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"},
			EnvInfo{Rank: 16, Size: 18, LocalRank: 0, LocalSize: 2, MasterAddr: "n0", MasterPort: 29500, RootPort: 29500, Launcher: "slurm"}},
		{"goep overrides", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "100",
			"GOEP_MASTER_ADDR": "b", "GOEP_MASTER_PORT": "200", "GOEP_UNIQUE_ID": "feedface", "GOEP_LISTEN_HOST": "10.1.1.1"},
			EnvInfo{Rank: 0, Size: 2, LocalRank: 0, LocalSize: 2, MasterAddr: "b", MasterPort: 100, RootPort: 200, Launcher: "torchrun",
				UniqueID: "feedface", ListenHost: "10.1.1.1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := fromEnv(lookupMap(c.env))
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestFromEnvErrors(t *testing.T) {
	tr := func(extra ...string) map[string]string {
		m := map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
		for i := 0; i < len(extra); i += 2 {
			if extra[i+1] == "<unset>" {
				delete(m, extra[i])
			} else {
				m[extra[i]] = extra[i+1]
			}
		}
		return m
	}
	slurm := func(extra ...string) map[string]string {
		m := map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4",
			"MASTER_ADDR": "h", "MASTER_PORT": "29500"}
		for i := 0; i < len(extra); i += 2 {
			if extra[i+1] == "<unset>" {
				delete(m, extra[i])
			} else {
				m[extra[i]] = extra[i+1]
			}
		}
		return m
	}
	cases := []struct {
		name string
		env  map[string]string
		want []string // substrings of the error
	}{
		{"non-numeric rank", tr("RANK", "one"), []string{"torchrun environment", `RANK="one" is not an integer`}},
		{"negative world size", tr("WORLD_SIZE", "-4"), []string{`WORLD_SIZE="-4" is negative`}},
		{"zero world size", tr("WORLD_SIZE", "0", "RANK", "0"), []string{"WORLD_SIZE=0"}},
		{"rank too large", tr("RANK", "4"), []string{"RANK=4 is not less than WORLD_SIZE=4"}},
		{"local rank too large", tr("LOCAL_RANK", "4"), []string{"LOCAL_RANK=4 is not less than LOCAL_WORLD_SIZE=4"}},
		{"local size above world size", tr("LOCAL_WORLD_SIZE", "8"), []string{"local size 8 exceeds world size 4"}},
		{"rank without world size", tr("WORLD_SIZE", "<unset>"), []string{`RANK="1" is set but WORLD_SIZE is not`}},
		{"world size without rank", tr("RANK", "<unset>"), []string{`WORLD_SIZE="4" is set but RANK is not`}},
		{"local rank without local size", tr("LOCAL_WORLD_SIZE", "<unset>"), []string{`LOCAL_RANK="1" is set but LOCAL_WORLD_SIZE is not`}},
		{"local rank alone", map[string]string{"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, []string{"RANK and WORLD_SIZE are not"}},
		{"port not a number", tr("MASTER_PORT", "http"), []string{`MASTER_PORT="http" is not a port number in [1, 65535]`}},
		{"port out of range", tr("MASTER_PORT", "70000"), []string{`MASTER_PORT="70000"`, "[1, 65535]"}},
		{"port zero", tr("MASTER_PORT", "0"), []string{`MASTER_PORT="0"`}},
		{"goep port out of range", tr("GOEP_MASTER_PORT", "-1"), []string{`GOEP_MASTER_PORT="-1"`}},
		{"torchrun without master", tr("MASTER_ADDR", "<unset>", "MASTER_PORT", "<unset>"), []string{"MASTER_ADDR and MASTER_PORT must be set when there are 4 ranks"}},
		{"agent store on the last port", tr("MASTER_PORT", "65535", "TORCHELASTIC_USE_AGENT_STORE", "True"), []string{"GOEP_MASTER_PORT"}},
		{"mpirun without master", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
			[]string{"mpirun environment", "MASTER_ADDR and MASTER_PORT must be set", "mpirun -x MASTER_ADDR"}},
		{"mpirun without port", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h"},
			[]string{"MASTER_PORT must be set"}},
		{"mpirun partial", map[string]string{"OMPI_COMM_WORLD_RANK": "0"}, []string{`OMPI_COMM_WORLD_RANK="0" is set but OMPI_COMM_WORLD_SIZE is not`}},
		{"mpirun bad local", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "x", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
			[]string{`OMPI_COMM_WORLD_LOCAL_RANK="x" is not an integer`}},
		{"slurm without master", slurm("MASTER_ADDR", "<unset>"), []string{"slurm environment", "MASTER_ADDR must be set", "scontrol"}},
		{"slurm without ntasks", slurm("SLURM_NTASKS", "<unset>"), []string{`SLURM_PROCID="1" is set but SLURM_NTASKS is not`}},
		{"slurm without localid", slurm("SLURM_LOCALID", "<unset>"), []string{"SLURM_LOCALID is not"}},
		{"slurm without tasks per node", slurm("SLURM_TASKS_PER_NODE", "<unset>"), []string{"neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE"}},
		{"slurm bad tasks per node", slurm("SLURM_TASKS_PER_NODE", "8(xx)"), []string{`SLURM_TASKS_PER_NODE="8(xx)"`}},
		{"slurm localid too large", slurm("SLURM_LOCALID", "4"), []string{"SLURM_LOCALID=4 is not less than the 4 tasks on this node"}},
		{"slurm procid too large", slurm("SLURM_PROCID", "4"), []string{"SLURM_PROCID=4 is not less than SLURM_NTASKS=4"}},
		{"bad unique id", tr("GOEP_UNIQUE_ID", "a b"), []string{"GOEP_UNIQUE_ID"}},
		{"torchrun and Open MPI disagree", tr("OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "8"),
			[]string{"launcher variables disagree: torchrun's say rank 1 of 4", "Open MPI's rank 2 of 8", "GOEP_LAUNCHER"}},
		{"torchrun and Open MPI same size, other rank", tr("OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4"),
			[]string{"launcher variables disagree", "rank 1 of 4", "rank 2 of 4"}},
		{"torchrun world not a multiple of Open MPI's", tr("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "3"),
			[]string{"launcher variables disagree"}},
		{"broken Open MPI variables beside torchrun's", tr("OMPI_COMM_WORLD_RANK", "x", "OMPI_COMM_WORLD_SIZE", "4"),
			[]string{"mpirun environment", `OMPI_COMM_WORLD_RANK="x"`}},
		{"GOEP_LAUNCHER unknown", tr("GOEP_LAUNCHER", "pbs"), []string{`GOEP_LAUNCHER="pbs": want torchrun, mpirun, slurm or none`}},
		{"GOEP_LAUNCHER without its variables", tr("GOEP_LAUNCHER", "slurm"), []string{"GOEP_LAUNCHER=slurm but no slurm variables are set"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := fromEnv(lookupMap(c.env))
			requireMentions(t, err, append([]string{"bootstrap: "}, c.want...)...)
		})
	}
}

func TestTasksOnNode(t *testing.T) {
	for _, c := range []struct {
		v    string
		node int
		want int
	}{{"8", 0, 8}, {"8(x2)", 1, 8}, {"8(x2),4", 2, 4}, {"2,3,4", 1, 3}, {"8(x2),4", 9, 8}} {
		got, err := tasksOnNode(c.v, c.node)
		require.NoError(t, err, c.v)
		require.Equal(t, c.want, got, "%s node %d", c.v, c.node)
	}
	for _, v := range []string{"", "x", "8(x0)", "0", "8(x2"} {
		_, err := tasksOnNode(v, 0)
		require.Error(t, err, v)
	}
}

func TestFromEnvProcessEnvironment(t *testing.T) {
	for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID"} {
		t.Setenv(k, "")
	}
	info, err := FromEnv()
	require.NoError(t, err)
	require.Equal(t, "none", info.Launcher)
	require.Equal(t, 1, info.Size)
}

// TestConnectFromEnv connects four goroutine ranks from torchrun-style
// variables without a shared id: each derives the same one.
func TestConnectFromEnv(t *testing.T) {
	checkLeaks(t)
	addr := freeAddr(t)
	_, port, _ := splitHostPortInt(addr)
	const size = 4
	bs := make([]Bootstrap, size)
	errs := forAll(size, func(r int) error {
		info := EnvInfo{Rank: r, Size: size, LocalRank: r, LocalSize: size, MasterAddr: "127.0.0.1", MasterPort: port, RootPort: port,
			Launcher: "torchrun", RunID: "test-run"}
		var err error
		bs[r], err = ConnectFromEnv(context.Background(), info, 5*time.Second)
		return err
	})
	defer closeAll(t, bs)
	requireAllOK(t, errs)
	require.Equal(t, DeriveUniqueID("127.0.0.1", port, "test-run"), bs[3].(*core).UniqueID())
	requireAllOK(t, forAll(size, func(r int) error { return bs[r].Barrier(context.Background()) }))

	_, err := ConnectFromEnv(context.Background(), EnvInfo{Rank: 0, Size: 2}, time.Second)
	requireMentions(t, err, "no master address")
	solo, err := ConnectFromEnv(context.Background(), EnvInfo{Size: 1, LocalSize: 1, Launcher: "none"}, 0)
	require.NoError(t, err)
	require.NoError(t, solo.Close())
}
