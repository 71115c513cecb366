package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// Flag checks shared by the subcommands: every flag is checked before any
// work starts, so a mistake costs a second, not the minutes of a run.

// given is the set of flags set on the command line (as opposed to left at
// their defaults).
func given(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// checkOutput refuses an output file that cannot be written where it is
// meant to go: its folder must exist and be writable, and the path must not
// be a folder. "" (no output) and "-" (stdout) pass.
func checkOutput(flagName, path string) error {
	if path == "" || path == "-" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("--%s %s: that is a folder; give a file name", flagName, clip(path, maxEchoLine))
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("--%s %s: the folder %s does not exist", flagName, clip(path, maxEchoLine), clip(dir, maxEchoLine))
	case !st.IsDir():
		return fmt.Errorf("--%s %s: %s is not a folder", flagName, clip(path, maxEchoLine), clip(dir, maxEchoLine))
	case syscall.Access(dir, 2 /* W_OK */) != nil:
		return fmt.Errorf("--%s %s: the folder %s is not writable", flagName, clip(path, maxEchoLine), clip(dir, maxEchoLine))
	}
	return nil
}

// checkOutputs runs checkOutput on (flag, path) pairs and returns the first
// failure.
func checkOutputs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkOutput(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// checkRange refuses v outside [lo, hi] for the flag name.
func checkRange(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s %d: want %d..%d", name, v, lo, hi)
	}
	return nil
}

// checkMasked refuses more masked (token, slot) entries than the largest
// token count has (smaller counts of a sweep mask all they have).
func checkMasked(masked, topk int, tokens []int) error {
	if masked == 0 || len(tokens) == 0 {
		return nil
	}
	most := 0
	for _, t := range tokens {
		most = max(most, t)
	}
	if masked > most*topk {
		return fmt.Errorf("--masked %d: more than the %d (token, slot) entries of %d tokens x top-%d", masked, most*topk, most, topk)
	}
	return nil
}

// progress prints one line per step of a long run to stderr with the time
// since the run started, so a run that takes minutes says what it is doing.
// A nil *progress prints nothing. Safe for concurrent use.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

func (p *progress) printf(format string, a ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "progress %6.1fs: %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, a...))
}

// launchedBy says which launcher's variables ep-bench follows.
func launchedBy(env bootstrap.EnvInfo) string {
	if env.Launcher == "none" {
		return "no launcher"
	}
	s := fmt.Sprintf("launched by %s", env.Launcher)
	if env.Enclosing != "" {
		s += " (inside " + env.Enclosing + ")"
	}
	return s
}

// deviceLabel names a device for a report header: its SM count only where
// it has SMs (the host backend has none).
func deviceLabel(name string, sms int) string {
	if sms <= 0 {
		return name
	}
	return fmt.Sprintf("%s (%d SMs)", name, sms)
}

// gbps formats a bandwidth with three significant digits below 10 GB/s, so
// the host backend's small figures do not all print as 0.0.
func gbps(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// abortOnCancel calls abort (a communicator's Abort) once ctx is cancelled,
// so that device waits for peers that have stopped end at once instead of
// waiting out their timeout. The returned func withdraws it, waiting for an
// abort under way: call it before the communicator closes.
func abortOnCancel(ctx context.Context, abort func() error) (release func()) {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = abort()
	})
	return func() {
		if !stop() {
			<-done
		}
	}
}

// launcherEnv reads the launcher's variables (bootstrap.FromEnv). cmd's
// host backend, whose ranks share memory inside one process, is refused
// under a launch of several processes.
func launcherEnv(cmd string, kind device.Kind) (bootstrap.EnvInfo, error) {
	env, err := bootstrap.FromEnv()
	if err != nil {
		return env, fmt.Errorf("launcher environment: %w", err)
	}
	if env.Size > 1 && kind == device.Host && cmd != "doctor" {
		return env, fmt.Errorf("the host backend shares memory between goroutine ranks of one process only; run `ep-bench %s --backend host` without a launcher (%s)",
			cmd, launchedBy(env))
	}
	return env, nil
}
