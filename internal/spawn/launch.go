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
}

// DefaultGracePeriod gives ranks time to tear down GPU state before SIGKILL.
const DefaultGracePeriod = 10 * time.Second

// RankError reports the rank whose failure ended the job.
type RankError struct {
	Rank     int
	ExitCode int            // -1 when killed by a signal
	Signal   syscall.Signal // the signal that killed it; 0 if it exited
	Stopped  int            // ranks still running that were then stopped
	Others   int            // N-1
}

func (e *RankError) Error() string {
	var msg string
	if e.Signal != 0 {
		msg = fmt.Sprintf("launch: rank %d was killed by signal %d (%v)", e.Rank, int(e.Signal), e.Signal)
	} else {
		msg = fmt.Sprintf("launch: rank %d exited with status %d", e.Rank, e.ExitCode)
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
