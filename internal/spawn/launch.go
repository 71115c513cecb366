// Package spawn runs N ranks of a program on this host, like
// `torchrun --standalone`: it gives each child the torchrun-style variables
// that bootstrap.FromEnv reads, prefixes their output with the rank, and
// stops the whole job when one rank fails or the launcher is interrupted.

package spawn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
	"time"
)

// Options configures Run.
type Options struct {
	N          int      // number of ranks, at least 1
	Executable string   // default: this program (os.Executable)
	Args       []string // arguments after the executable
	Env        []string // extra KEY=VALUE for every child; the launcher's own variables win
	Stdout     io.Writer
	Stderr     io.Writer // defaults: os.Stdout, os.Stderr
	// GracePeriod is how long stopped ranks get between SIGTERM (or the
	// forwarded signal) and SIGKILL. Default DefaultGracePeriod.
	GracePeriod time.Duration
	// MaxN bounds N (0: DefaultMaxN()): a typo such as -n 100000 must not
	// fork-bomb the host. Callers that know better (GPUs present, an
	// explicit override) set it.
	MaxN int
	// Settle is how long, after the first rank fails, the launcher keeps
	// collecting other failures before it stops the job and names one
	// (default DefaultSettle): ranks that exit because a peer died tend to
	// be reaped at about the same moment as the peer, in any order.
	Settle time.Duration
}

// DefaultSettle is Options.Settle's default.
const DefaultSettle = 200 * time.Millisecond

// DefaultMaxN bounds the ranks of one launch when the caller sets no
// bound: four per CPU core (ranks are processes with their own runtimes;
// far beyond that the host thrashes before anything useful runs).
func DefaultMaxN() int { return 4 * runtime.NumCPU() }

// DefaultGracePeriod gives ranks time to tear down GPU state before SIGKILL.
const DefaultGracePeriod = 10 * time.Second

// RankError reports the rank whose failure ended the job.
type RankError struct {
	Rank     int
	ExitCode int            // -1 when killed by a signal
	Signal   syscall.Signal // the signal that killed it; 0 if it exited
	Stopped  int            // ranks still running that were then stopped
	Others   int            // N-1
	// Also are other ranks that failed on their own (not stopped by the
	// launcher) within the settle window, most likely because of Rank.
	Also []int
}

func (e *RankError) Error() string {
	if e == nil {
		return "spawn: nil *RankError"
	}
	var msg string
	if e.Signal != 0 {
		msg = fmt.Sprintf("launch: rank %d was killed by signal %d (%v)", e.Rank, int(e.Signal), e.Signal)
	} else {
		msg = fmt.Sprintf("launch: rank %d exited with status %d", e.Rank, e.ExitCode)
	}
	if len(e.Also) > 0 {
		msg += fmt.Sprintf(" (first; then %s %v, likely because of it)", plural(len(e.Also), "rank"), e.Also)
	}
	switch {
	case e.Stopped == 0:
	case e.Stopped == e.Others:
		msg += fmt.Sprintf("; stopped the other %d %s", e.Stopped, plural(e.Stopped, "rank"))
	default:
		msg += fmt.Sprintf("; stopped %d other %s that were still running", e.Stopped, plural(e.Stopped, "rank"))
	}
	return msg
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Run starts opts.N children and waits for them. It returns nil only if every
// child exits with status 0. On the first child that fails it stops the
// others (SIGTERM, then SIGKILL after the grace period, to each child's whole
// process group) and returns a *RankError. When ctx ends (e.g. from
// signal.NotifyContext) it forwards the signal the same way and returns an
// error wrapping ctx.Err(). Descendants that a successful rank leaves behind
// are not touched.
func Run(ctx context.Context, opts Options) error {
	if opts.N < 1 {
		return fmt.Errorf("launch: N=%d; need at least one rank", opts.N)
	}
	if opts.MaxN <= 0 {
		opts.MaxN = DefaultMaxN()
	}
	if opts.N > opts.MaxN {
		return fmt.Errorf("launch: N=%d ranks, more than the bound of %d on this host (raise it explicitly if you mean it)", opts.N, opts.MaxN)
	}
	if opts.Settle <= 0 {
		opts.Settle = DefaultSettle
	}
	if opts.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("launch: finding this executable: %w", err)
		}
		opts.Executable = exe
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("launch: not started: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("launch: picking a master port: %w", err)
	}
	j := &job{opts: opts, out: newOutput(opts.Stdout, opts.Stderr)}
	runID := newRunID()
	for r := range opts.N {
		// A signal while starting stops the starting: the ranks started so
		// far are killed and nothing more is forked.
		if err := ctx.Err(); err != nil {
			j.abort()
			return fmt.Errorf("launch: %w (%v) while starting rank %d of %d; killed the %d started: %w",
				errInterrupted, context.Cause(ctx), r, opts.N, r, err)
		}
		env := childEnv(os.Environ(), opts.Env, r, opts.N, port, runID)
		if err := j.start(r, env); err != nil {
			j.abort()
			return fmt.Errorf("launch: starting rank %d (%s): %w", r, opts.Executable, err)
		}
	}
	return j.supervise(ctx)
}

// errInterrupted marks the error Run returns after ctx ended.
var errInterrupted = errors.New("interrupted")
