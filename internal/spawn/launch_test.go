package spawn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
)

// The test binary doubles as the child program: with modeEnv set, TestMain
// runs the child mode instead of the tests.
const modeEnv = "GOEP_LAUNCH_TEST_MODE"

func TestMain(m *testing.M) {
	if mode := os.Getenv(modeEnv); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

func childMain(mode string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	switch mode {
	case "env":
		for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
			"GOEP_RUN_ID", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "GOEP_MASTER_PORT", "EXTRA"} {
			v, ok := os.LookupEnv(k)
			if !ok {
				v = "<unset>"
			}
			fmt.Printf("%s=%s\n", k, v)
		}
		return 0
	case "lines":
		fmt.Printf("first line from %d\n", rank)
		fmt.Fprintf(os.Stderr, "error line from %d\n", rank)
		fmt.Println(strings.Repeat(strconv.Itoa(rank), 100_000))
		fmt.Printf("second line from %d\nunterminated from %d", rank, rank)
		return 0
	case "fail2":
		if rank == 2 {
			time.Sleep(300 * time.Millisecond)
			fmt.Fprintln(os.Stderr, "rank 2 giving up")
			return 3
		}
		time.Sleep(time.Minute)
		return 0
	case "ignoreterm":
		if rank == 0 {
			time.Sleep(300 * time.Millisecond)
			return 1
		}
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Minute)
		return 0
	case "grandchild":
		gc := exec.Command(os.Args[0], "-test.run=^$")
		gc.Env = append(os.Environ(), modeEnv+"=sleep")
		if err := gc.Start(); err != nil {
			fmt.Println("cannot start grandchild:", err)
			return 1
		}
		fmt.Printf("grandchild %d\n", gc.Process.Pid)
		if rank == 1 {
			time.Sleep(500 * time.Millisecond)
			return 1
		}
		time.Sleep(time.Minute)
		return 0
	case "sleep":
		time.Sleep(time.Minute)
		return 0
	case "peerdeath":
		// Ranks 0 and 2 report rank 1 gone and exit before rank 1 itself
		// does: the order in which a launcher may reap them.
		if rank == 1 {
			time.Sleep(250 * time.Millisecond)
			return 5
		}
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintf(os.Stderr, "bootstrap: rank %d: barrier: peer rank 1 is gone: EOF\n", rank)
		return 1
	case "selfkill":
		if rank == 1 {
			time.Sleep(200 * time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		time.Sleep(time.Minute)
		return 0
	case "crash":
		return crashChild(rank)
	case "signals":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		fmt.Println("ready")
		fmt.Printf("got %v\n", <-ch)
		return 0
	case "bootstrap":
		if err := bootstrapChild(); err != nil {
			fmt.Println("FAILED:", err)
			return 1
		}
		fmt.Println("bootstrap ok")
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown mode", mode)
	return 2
}

// bootstrapChild is a rank of a real multi-process job: environment,
// TCP bootstrap, and fd passing between two processes.
func bootstrapChild() error {
	ctx := context.Background()
	info, err := bootstrap.FromEnv()
	if err != nil {
		return err
	}
	b, err := bootstrap.ConnectFromEnv(ctx, info, 20*time.Second)
	if err != nil {
		return err
	}
	defer b.Close()
	all, err := b.AllGather(ctx, []byte(fmt.Sprintf("pid %d rank %d", os.Getpid(), info.Rank)))
	if err != nil {
		return err
	}
	for r, v := range all {
		if !strings.HasSuffix(string(v), fmt.Sprintf(" rank %d", r)) {
			return fmt.Errorf("allgather slot %d holds %q", r, v)
		}
	}
	x, err := bootstrap.NewFDExchanger(ctx, b, 0)
	if err != nil {
		return err
	}
	defer x.Close()
	switch info.Rank {
	case 0: // pass a pipe's write end to rank 1, read what it writes
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		if err := x.SendFD(ctx, 1, 0, []int{int(pw.Fd())}); err != nil {
			return err
		}
		pw.Close()
		buf := new(bytes.Buffer)
		if _, err := buf.ReadFrom(pr); err != nil {
			return err
		}
		if got, want := buf.String(), "hello from process "+string(all[1]); got != want {
			return fmt.Errorf("read %q through the pipe, want %q", got, want)
		}
	case 1:
		fds, err := x.RecvFD(ctx, 0, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fds[0]), "pipe")
		fmt.Fprintf(f, "hello from process pid %d rank %d", os.Getpid(), info.Rank)
		f.Close()
	}
	return b.Barrier(ctx)
}

// crashChild: rank 2 dies right after connecting, without closing anything;
// the others must see it in their pending Barrier promptly. They ignore the
// launcher's SIGTERM so that they can report what they saw.
func crashChild(rank int) int {
	signal.Ignore(syscall.SIGTERM)
	ctx := context.Background()
	info, err := bootstrap.FromEnv()
	if err != nil {
		fmt.Println("FAILED:", err)
		return 1
	}
	b, err := bootstrap.ConnectFromEnv(ctx, info, 30*time.Second)
	if err != nil {
		fmt.Println("FAILED:", err)
		return 1
	}
	if rank == 2 {
		time.Sleep(200 * time.Millisecond)
		os.Exit(7) // no Close: the kernel closes the sockets
	}
	start := time.Now()
	err = b.Barrier(ctx)
	fmt.Printf("barrier after %v: peer closed %v: %v\n", time.Since(start).Round(100*time.Millisecond), errors.Is(err, bootstrap.ErrPeerClosed), err)
	b.Close()
	return 0
}

// syncBuffer lets a test read output while Run is still writing it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func options(mode string, n int, stdout, stderr *syncBuffer) Options {
	// A race-enabled child would otherwise sleep 1 s on exit.
	return Options{N: n, Args: []string{"-test.run=^$"}, Env: []string{modeEnv + "=" + mode, "GORACE=atexit_sleep_ms=0"},
		Stdout: stdout, Stderr: stderr, GracePeriod: 5 * time.Second}
}

func checkLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		require.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutine leak")
	})
}

// linesOf splits output into lines, grouped by rank, checking the prefix.
func linesOf(t *testing.T, out string, n int) [][]string {
	t.Helper()
	byRank := make([][]string, n)
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var r int
		_, err := fmt.Sscanf(line, "[rank %d] ", &r)
		require.NoError(t, err, "line without prefix: %.80q", line)
		require.True(t, r >= 0 && r < n, "line %.80q", line)
		byRank[r] = append(byRank[r], strings.TrimPrefix(line, fmt.Sprintf("[rank %d] ", r)))
	}
	return byRank
}

func TestAllSucceedWithEnvironment(t *testing.T) {
	checkLeaks(t)
	t.Setenv("GOEP_MASTER_PORT", "1")    // inherited: must not reach the children
	t.Setenv("CUDA_VISIBLE_DEVICES", "") // make sure the launcher does not set it
	os.Unsetenv("CUDA_VISIBLE_DEVICES")  // (t.Setenv restores the old value afterwards)
	var stdout, stderr syncBuffer
	opts := options("env", 4, &stdout, &stderr)
	opts.Env = append(opts.Env, "EXTRA=passed", "RANK=99") // RANK cannot be overridden
	require.NoError(t, Run(context.Background(), opts))
	require.Empty(t, stderr.String())

	var port, runID string
	for r, lines := range linesOf(t, stdout.String(), 4) {
		env := map[string]string{}
		for _, l := range lines {
			k, v, _ := strings.Cut(l, "=")
			env[k] = v
		}
		require.Equal(t, strconv.Itoa(r), env["RANK"])
		require.Equal(t, strconv.Itoa(r), env["LOCAL_RANK"])
		require.Equal(t, "4", env["WORLD_SIZE"])
		require.Equal(t, "4", env["LOCAL_WORLD_SIZE"])
		require.Equal(t, "127.0.0.1", env["MASTER_ADDR"])
		require.Equal(t, "0", env["NCCL_NVLS_ENABLE"])
		require.Equal(t, "<unset>", env["CUDA_VISIBLE_DEVICES"])
		require.Equal(t, "<unset>", env["GOEP_MASTER_PORT"])
		require.Equal(t, "passed", env["EXTRA"])
		p, err := strconv.Atoi(env["MASTER_PORT"])
		require.NoError(t, err)
		require.True(t, p > 0 && p < 65536)
		require.Len(t, env["GOEP_RUN_ID"], 32)
		if r == 0 {
			port, runID = env["MASTER_PORT"], env["GOEP_RUN_ID"]
		}
		require.Equal(t, port, env["MASTER_PORT"], "all ranks share the port")
		require.Equal(t, runID, env["GOEP_RUN_ID"], "all ranks share the run id")
	}
}

func TestOutputPrefixing(t *testing.T) {
	checkLeaks(t)
	const n = 4
	var stdout, stderr syncBuffer
	require.NoError(t, Run(context.Background(), options("lines", n, &stdout, &stderr)))
	for r, lines := range linesOf(t, stdout.String(), n) {
		require.Equal(t, []string{
			fmt.Sprintf("first line from %d", r),
			strings.Repeat(strconv.Itoa(r), 100_000), // whole, not interleaved with other ranks
			fmt.Sprintf("second line from %d", r),
			fmt.Sprintf("unterminated from %d", r),
		}, lines)
	}
	for r, lines := range linesOf(t, stderr.String(), n) {
		require.Equal(t, []string{fmt.Sprintf("error line from %d", r)}, lines)
	}
}

func TestFailingRankStopsOthers(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	start := time.Now()
	err := Run(context.Background(), options("fail2", 4, &stdout, &stderr))
	elapsed := time.Since(start)
	var re *RankError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 2, re.Rank)
	require.Equal(t, 3, re.ExitCode)
	require.Equal(t, "launch: rank 2 exited with status 3; stopped the other 3 ranks", err.Error())
	require.Less(t, elapsed, 3*time.Second, "the sleeping ranks must be stopped, not waited for")
	require.Contains(t, stderr.String(), "[rank 2] rank 2 giving up\n")
}

func TestSIGKILLAfterGracePeriod(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	opts := options("ignoreterm", 3, &stdout, &stderr)
	opts.GracePeriod = 300 * time.Millisecond
	start := time.Now()
	err := Run(context.Background(), opts)
	var re *RankError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 0, re.Rank)
	require.Contains(t, err.Error(), "stopped the other 2 ranks")
	require.Less(t, time.Since(start), 3*time.Second)
}

func TestGrandchildrenAreKilled(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	opts := options("grandchild", 3, &stdout, &stderr)
	opts.GracePeriod = time.Second
	err := Run(context.Background(), opts)
	var re *RankError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Rank)
	var pids []int
	for _, lines := range linesOf(t, stdout.String(), 3) {
		for _, l := range lines {
			var pid int
			if _, err := fmt.Sscanf(l, "grandchild %d", &pid); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	require.Len(t, pids, 3)
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range pids {
		for !gone(pid) {
			require.True(t, time.Now().Before(deadline), "grandchild %d survived", pid)
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// gone reports whether pid no longer runs (absent or a zombie awaiting reaping
// by whatever adopted it).
func gone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

func TestContextCancelForwardsSignal(t *testing.T) {
	for _, c := range []struct {
		cause error
		want  string
	}{
		{errors.New("interrupt signal received"), "got interrupt"}, // what signal.NotifyContext reports
		{nil, "got terminated"},
	} {
		t.Run(c.want, func(t *testing.T) {
			checkLeaks(t)
			const n = 3
			var stdout, stderr syncBuffer
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			errc := make(chan error, 1)
			go func() { errc <- Run(ctx, options("signals", n, &stdout, &stderr)) }()
			require.Eventually(t, func() bool { return strings.Count(stdout.String(), "ready") == n }, 10*time.Second, 10*time.Millisecond)
			cancel(c.cause)
			err := <-errc
			require.ErrorIs(t, err, context.Canceled)
			require.Contains(t, err.Error(), "launch: interrupted")
			require.Contains(t, err.Error(), "stopped 3 ranks")
			for r, lines := range linesOf(t, stdout.String(), n) {
				require.Equal(t, []string{"ready", c.want}, lines, "rank %d", r)
			}
		})
	}
}

func TestStartFailure(t *testing.T) {
	checkLeaks(t)
	err := Run(context.Background(), Options{N: 2, Executable: "/nonexistent/program"})
	require.ErrorContains(t, err, "launch: starting rank 0 (/nonexistent/program)")
	err = Run(context.Background(), Options{N: 0})
	require.ErrorContains(t, err, "N=0")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, Run(ctx, Options{N: 1}), context.Canceled)
}

// TestBootstrapEndToEnd runs real multi-process ranks: FromEnv,
// ConnectFromEnv, AllGather and fd passing between processes.
func TestBootstrapEndToEnd(t *testing.T) {
	checkLeaks(t)
	const n = 4
	var stdout, stderr syncBuffer
	err := Run(context.Background(), options("bootstrap", n, &stdout, &stderr))
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	for r, lines := range linesOf(t, stdout.String(), n) {
		require.Equal(t, []string{"bootstrap ok"}, lines, "rank %d", r)
	}
}

func TestRankKilledBySignal(t *testing.T) {
	checkLeaks(t)
	var stdout, stderr syncBuffer
	err := Run(context.Background(), options("selfkill", 3, &stdout, &stderr))
	var re *RankError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.Rank)
	require.Equal(t, syscall.SIGKILL, re.Signal)
	require.Equal(t, "launch: rank 1 was killed by signal 9 (killed); stopped the other 2 ranks", err.Error())
}

// TestBootstrapSeesProcessDeath: a rank process that dies makes every other
// rank's pending Barrier fail promptly, naming it.
func TestBootstrapSeesProcessDeath(t *testing.T) {
	checkLeaks(t)
	const n = 4
	var stdout, stderr syncBuffer
	err := Run(context.Background(), options("crash", n, &stdout, &stderr))
	var re *RankError
	require.ErrorAs(t, err, &re, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Equal(t, 2, re.Rank)
	require.Equal(t, 7, re.ExitCode)
	for r, lines := range linesOf(t, stdout.String(), n) {
		if r == 2 {
			require.Empty(t, lines)
			continue
		}
		require.Len(t, lines, 1, "rank %d", r)
		require.Regexp(t, `^barrier after (0s|[1-9]00ms): peer closed true: bootstrap: rank \d: barrier: peer rank 2 is gone`, lines[0], "rank %d", r)
	}
}

func TestChildEnv(t *testing.T) {
	env := childEnv([]string{"PATH=/bin", "RANK=7", "GOEP_UNIQUE_ID=stale", "TORCHELASTIC_USE_AGENT_STORE=True", "CUDA_VISIBLE_DEVICES=0,1"},
		[]string{"PATH=/usr/bin", "NCCL_NVLS_ENABLE=1"}, 1, 2, 1234, "rid")
	require.Equal(t, []string{"PATH=/usr/bin", "RANK=1", "CUDA_VISIBLE_DEVICES=0,1", "NCCL_NVLS_ENABLE=0",
		"WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1234", "GOEP_RUN_ID=rid"}, env)
}

func TestRankErrorWording(t *testing.T) {
	require.Equal(t, "launch: rank 3 exited with status 1; stopped the other 7 ranks",
		(&RankError{Rank: 3, ExitCode: 1, Stopped: 7, Others: 7}).Error())
	require.Equal(t, "launch: rank 0 was killed by signal 9 (killed); stopped 2 other ranks that were still running",
		(&RankError{Rank: 0, ExitCode: -1, Signal: syscall.SIGKILL, Stopped: 2, Others: 7}).Error())
	require.Equal(t, "launch: rank 1 exited with status 2", (&RankError{Rank: 1, ExitCode: 2, Others: 1}).Error())
}
