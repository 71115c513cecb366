package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 20: what a newcomer's mistakes get. Every case is refused before
// any work, with one line that says what is wrong: the exit code and the
// first line of stderr are checked, and stdout must be empty (no table, no
// FAIL rows printed before the error).

const reducePlan = "../collectives/plan/testdata/plans/reduce.json"

// noLauncher clears the launcher variables a test machine might have, then
// sets kv (name, value, ...).
func noLauncher(t *testing.T, kv ...string) {
	for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
		"OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "GOEP_LAUNCHER"} {
		t.Setenv(k, "")
	}
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

func TestNewcomerMistakesAreRefusedFirst(t *testing.T) {
	noLauncher(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "folder")
	bigDim := filepath.Join(dir, "big.npy")
	hdr := "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	require.NoError(t, os.WriteFile(bigDim, []byte("\x93NUMPY\x01\x00\x76\x00"+hdr), 0o644))
	notObject := filepath.Join(dir, "array.json")
	require.NoError(t, os.WriteFile(notObject, []byte(`[1, 2]`), 0o644))
	small := []string{"--backend", "host", "--hidden", "256", "--topk", "4", "--experts", "16", "--tokens", "128"}

	cases := []struct {
		name  string
		args  []string
		first string // a prefix of stderr's first line
	}{
		{"plan size not whole elements", []string{"plan", "--plan", reducePlan, "--backend", "host", "--size", "3"},
			"ep-bench plan: --size: 3 bytes is not a whole number of bf16 elements (2 bytes each)"},
		{"plan negative iters", []string{"plan", "--plan", reducePlan, "--backend", "host", "--size", "4K", "--iters", "-1"},
			"ep-bench plan: --iters -1: want at least 1"},
		{"plan zero iters", []string{"plan", "--plan", reducePlan, "--backend", "host", "--iters", "0"},
			"ep-bench plan: --iters 0: want at least 1"},
		{"plan size the plan does not take", []string{"plan", "--plan", reducePlan, "--backend", "host", "--size", "4K", "--inplace=false"},
			"ep-bench plan: --size 4096: "},
		{"plan JSON of the wrong kind", []string{"plan", "--plan", notObject, "--backend", "host"},
			"ep-bench plan: plan " + notObject + ": the plan at line 1: JSON array where an object is expected"},
		{"launch of a plan", []string{"launch", "-n", "3", "--", "plan", "--plan", reducePlan},
			"ep-bench launch: plan runs in one process"},
		{"launch of nothing known", []string{"launch", "-n", "2", "--", "frobnicate"},
			`ep-bench launch: no ep-bench command "frobnicate" to launch`},
		{"collectives sizes that check nothing", []string{"collectives", "--backend", "host", "--sizes", "3"},
			"ep-bench collectives: --sizes: 3 bytes is not a whole number of bf16 elements"},
		{"collectives bogus algorithm", []string{"collectives", "--backend", "host", "--algo", "bogus"},
			`ep-bench collectives: --algo "bogus": allreduce has no such algorithm (it has ll, ll2, scratch, zc, nccl)`},
		{"collectives algorithm one collective lacks", []string{"collectives", "--backend", "host", "--algo", "ll2"},
			`ep-bench collectives: --algo "ll2": allgather has no such algorithm`},
		{"collectives NCCL on the host", []string{"collectives", "--backend", "host", "--compare", "nccl"},
			"ep-bench collectives: --compare nccl needs GPUs"},
		{"collectives zero iters", []string{"collectives", "--backend", "host", "--iters", "0"},
			"ep-bench collectives: --iters 0: want at least 1"},
		{"collectives json folder", []string{"collectives", "--backend", "host", "--json", filepath.Join(missing, "c.json")},
			"ep-bench collectives: --json " + filepath.Join(missing, "c.json") + ": the folder " + missing + " does not exist"},
		{"collectives size overflow", []string{"collectives", "--backend", "host", "--sizes", "99999999999999G"},
			"ep-bench collectives: --sizes: size 99999999999999G is more than 1024 GiB"},
		{"intranode masked beyond the tokens", append([]string{"intranode", "--masked", "99999"}, small...),
			"ep-bench intranode: --masked 99999: more than the 512 (token, slot) entries of 128 tokens x top-4"},
		{"intranode no experts", []string{"intranode", "--backend", "host", "--experts", "0"},
			"ep-bench intranode: --experts 0: want at least 1"},
		{"intranode huge hidden", []string{"intranode", "--backend", "host", "--hidden", "4611686018427387904"},
			"ep-bench intranode: --hidden 4611686018427387904: want 1..65536"},
		{"intranode json folder", append([]string{"intranode", "--json", filepath.Join(missing, "i.json")}, small...),
			"ep-bench intranode: --json " + filepath.Join(missing, "i.json") + ": the folder " + missing + " does not exist"},
		{"intranode plot folder", append([]string{"intranode", "--plot", filepath.Join(missing, "p")}, small...),
			"ep-bench intranode: --plot " + filepath.Join(missing, "p") + ".png: the folder " + missing + " does not exist"},
		{"intranode json into a folder", append([]string{"intranode", "--json", dir}, small...),
			"ep-bench intranode: --json " + dir + ": that is a folder"},
		{"layout masked beyond the tokens", []string{"layout", "--backend", "host", "--tokens", "128", "--masked", "99999"},
			"ep-bench layout: --masked 99999: more than the 1024 (token, slot) entries of 128 tokens x top-8"},
		{"layout threads", []string{"layout", "--backend", "host", "--threads", "7"},
			"ep-bench layout: --threads: layout: 7 threads per block: want a multiple of 32 in 32..1024"},
		{"layout json folder", []string{"layout", "--backend", "host", "--json", filepath.Join(missing, "l.json")},
			"ep-bench layout: --json " + filepath.Join(missing, "l.json") + ": the folder " + missing + " does not exist"},
		{"route topk is not the file", []string{"route", "--topk", "8", "--experts", "8", "--ranks", "2"},
			"ep-bench route: route reads the routing from --file"},
		{"route huge dimension", []string{"route", "--file", bigDim, "--experts", "8", "--ranks", "2"},
			"ep-bench route: " + bigDim + ": npy: header"},
		{"doctor json folder", []string{"doctor", "--backend", "host", "--json", filepath.Join(missing, "d.json")},
			"ep-bench doctor: --json " + filepath.Join(missing, "d.json") + ": the folder " + missing + " does not exist"},
		{"channels json folder", []string{"channels", "--backend", "host", "--json", filepath.Join(missing, "ch.json")},
			"ep-bench channels: --json " + filepath.Join(missing, "ch.json") + ": the folder " + missing + " does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := run(t, c.args...)
			assert.Equal(t, 1, code, "stderr:\n%s", stderr)
			assert.True(t, strings.HasPrefix(firstLine(stderr), c.first), "first line %q, want the prefix %q", firstLine(stderr), c.first)
			assert.Empty(t, stdout, "nothing runs before the refusal")
		})
	}
}

func TestNewcomerHugeDimensionIsNamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.npy")
	hdr := "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	require.NoError(t, os.WriteFile(path, []byte("\x93NUMPY\x01\x00\x76\x00"+hdr), 0o644))
	code, _, stderr := run(t, "route", "--file", path, "--experts", "8", "--ranks", "2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "dimension 4611686018427387904 is too large (more than 12 digits)")
}

// A corrupt header length makes the "header" a large run of binary: the
// error repeats a bounded part of it.
func TestNewcomerCorruptHeaderEchoIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corrupt.npy")
	body := bytes.Repeat([]byte{0x00, 0xff, 0x93, '\''}, 60_000)
	// Version 2.0: a 4-byte header length, here the whole body.
	b := append([]byte("\x93NUMPY\x02\x00"), byte(len(body)), byte(len(body)>>8), byte(len(body)>>16), 0)
	require.NoError(t, os.WriteFile(path, append(b, body...), 0o644))
	code, stdout, stderr := run(t, "route", "--file", path, "--experts", "8", "--ranks", "2")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.True(t, strings.HasPrefix(stderr, "ep-bench route: "+path+": npy: header"), stderr)
	require.Less(t, len(stderr), 600, "the echo of the header is bounded")
}

// Launcher variables that contradict each other are refused by name.
func TestNewcomerContradictingLaunchers(t *testing.T) {
	noLauncher(t, "RANK", "0", "WORLD_SIZE", "2", "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "4",
		"MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "1")
	for _, cmd := range []string{"intranode", "collectives", "channels", "doctor", "plan"} {
		args := []string{cmd, "--backend", "host"}
		if cmd == "plan" {
			args = append(args, "--plan", reducePlan)
		}
		code, stdout, stderr := run(t, args...)
		assert.Equal(t, 1, code, cmd)
		assert.Empty(t, stdout, cmd)
		assert.Contains(t, firstLine(stderr), "launcher variables disagree: torchrun's say rank 0 of 2", cmd)
	}
}

// A plan under a launcher (several processes) is refused: it would run the
// whole plan once per process.
func TestNewcomerPlanUnderALauncher(t *testing.T) {
	noLauncher(t, "RANK", "1", "WORLD_SIZE", "3", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "1")
	code, stdout, stderr := run(t, "plan", "--plan", reducePlan, "--backend", "host")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.True(t, strings.HasPrefix(stderr, "ep-bench plan: plan runs every rank of the plan in this one process"), stderr)
	require.Contains(t, stderr, "launched by torchrun")

	// A batch script of a Slurm allocation looks like rank 0 of its tasks;
	// GOEP_LAUNCHER=none says it is one process.
	noLauncher(t, "SLURM_PROCID", "0", "SLURM_NTASKS", "8", "SLURM_LOCALID", "0", "SLURM_TASKS_PER_NODE", "8",
		"MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "1")
	code, _, stderr = run(t, "plan", "--plan", reducePlan, "--backend", "host", "--size", "4K", "--iters", "1")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "launched by slurm")
	require.Contains(t, stderr, "GOEP_LAUNCHER=none")
	t.Setenv("GOEP_LAUNCHER", "none")
	code, stdout, stderr = run(t, "plan", "--plan", reducePlan, "--backend", "host", "--size", "4K", "--iters", "1")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, " ok ")
}

// cancelOn is a writer that cancels a context once what it was written
// contains marker: a test's stand-in for Ctrl-C in the middle of a run.
type cancelOn struct {
	mu     sync.Mutex
	b      bytes.Buffer
	marker string
	cancel context.CancelFunc
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Contains(w.b.String(), w.marker) {
		w.cancel()
	}
	return len(p), nil
}

func (w *cancelOn) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Interrupted runs end with one line, "interrupted", and exit code 130: no
// FAIL rows, no bootstrap errors of the ranks that were stopped.
func TestNewcomerInterruptedRunsSaySo(t *testing.T) {
	noLauncher(t)
	cases := []struct {
		args   []string
		marker string // cancel when stderr shows this
	}{
		{[]string{"intranode", "--backend", "host", "--hidden", "256", "--topk", "4", "--experts", "16", "--tokens", "64,128,256,512"}, "T=128 (2/4)"},
		{[]string{"collectives", "--backend", "host", "--ranks", "2", "--sizes", "1K,2K,4K,8K", "--colls", "allreduce"}, "allreduce 2 KiB"},
		{[]string{"plan", "--plan", reducePlan, "--backend", "host", "--size", "4K,8K,16K,32K"}, "size 8 KiB"},
		{[]string{"channels", "--backend", "host", "--ranks", "2"}, "checking LL8 packets"},
		{[]string{"doctor", "--backend", "host", "--mib", "1"}, "checking ranks"},
	}
	for _, c := range cases {
		t.Run(c.args[0], func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stderr := &cancelOn{marker: c.marker, cancel: cancel}
			var stdout bytes.Buffer
			code := runCommand(ctx, commands[c.args[0]], c.args, &stdout, stderr)
			require.Equal(t, exitInterrupted, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			require.Equal(t, "ep-bench "+c.args[0]+": interrupted", lines[len(lines)-1])
			for _, l := range lines[:len(lines)-1] {
				require.True(t, strings.HasPrefix(l, "progress "), "only progress lines before it: %q", l)
			}
			require.NotContains(t, stdout.String(), "FAIL")
		})
	}
}

// Long runs say what they do, step by step, with the time so far.
func TestNewcomerProgressLines(t *testing.T) {
	noLauncher(t)
	code, stdout, stderr := run(t, "plan", "--plan", reducePlan, "--backend", "host", "--size", "4K,8K")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `(?m)^progress +[0-9.]+s: size 4 KiB \(1/2\): checking, then 3 timed launches$`, stderr)
	assert.Regexp(t, `(?m)^progress +[0-9.]+s: size 8 KiB \(2/2\): `, stderr)
	assert.NotContains(t, stdout, "dlopen", "the header names the cause once, briefly")

	code, _, stderr = run(t, "collectives", "--backend", "host", "--ranks", "2", "--sizes", "1K", "--colls", "allgather")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `(?m)^progress +[0-9.]+s: allgather 1 KiB auto: checking, then timing$`, stderr)

	code, _, stderr = run(t, "doctor", "--backend", "host", "--mib", "1")
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `(?m)^progress +[0-9.]+s: checking host backend \(6/6\)$`, stderr)
}

// The host backend prints bandwidths with three digits (not 0.0 all over)
// and no SM count, which it does not have.
func TestNewcomerHostCollectivesFigures(t *testing.T) {
	noLauncher(t)
	code, stdout, stderr := run(t, "collectives", "--backend", "host", "--ranks", "2", "--sizes", "64K", "--colls", "allreduce")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stdout, "SMs")
	require.NotContains(t, stdout, "L2 flush (256 MiB memset)")
	var rows int
	for _, l := range strings.Split(stdout, "\n") {
		f := strings.Fields(l)
		if len(f) >= 9 && f[0] == "allreduce" {
			rows++
			assert.NotEqual(t, "0.0", f[7], "alg GB/s: %q", l)
			assert.NotEqual(t, "0.0", f[8], "bus GB/s: %q", l)
		}
	}
	require.Equal(t, 2, rows, stdout) // eager and graph
}

func TestHelpAligns(t *testing.T) {
	code, stdout, _ := run(t, "help")
	require.Equal(t, 0, code)
	col := -1
	for _, l := range strings.Split(stdout, "\n") {
		name := strings.Fields(l + " x")[0]
		if _, ok := commands[name]; !ok || !strings.HasPrefix(l, "  ") {
			continue
		}
		c := strings.Index(l, commands[name].summary)
		if col < 0 {
			col = c
		}
		require.Equal(t, col, c, "summary column of %q", l)
	}
	require.Positive(t, col)
}
