package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors for errors.Is. Their texts carry no "bootstrap:" prefix
// because they only ever appear wrapped in an error that has one.
var (
	// ErrTimeout: a wait ran past Config.Timeout or the context's deadline.
	ErrTimeout = errors.New("timed out")
	// ErrPeerClosed: the peer closed its bootstrap, exited or its connection broke.
	ErrPeerClosed = errors.New("peer closed")
	// ErrClosed: the local Bootstrap (or FDExchanger) was closed.
	ErrClosed = errors.New("bootstrap is closed")
	// ErrRejected: a handshake was refused (unique id, size or rank mismatch).
	ErrRejected = errors.New("handshake rejected")
)

// TimeoutError reports a wait that ran out of time, and what it was waiting for.
type TimeoutError struct {
	Op    string        // e.g. "barrier", "recv from rank 3 tag 7", "connect"
	After time.Duration // how long the wait lasted
	Ranks []int         // ranks that did not arrive, sorted; may be empty
	What  string        // what was awaited when it is not (only) a set of ranks
	Cause error         // context.DeadlineExceeded when the context expired, else nil
}

func (e *TimeoutError) Error() string {
	if e == nil {
		return "bootstrap: nil *TimeoutError"
	}
	var b strings.Builder
	b.WriteString(e.Op)
	if e.Cause != nil {
		fmt.Fprintf(&b, ": %v after %s", e.Cause, e.After)
	} else {
		fmt.Fprintf(&b, " timed out after %s", e.After)
	}
	switch {
	case len(e.Ranks) > 0 && e.What != "":
		fmt.Fprintf(&b, " waiting for ranks %v (%s)", e.Ranks, e.What)
	case len(e.Ranks) > 0:
		fmt.Fprintf(&b, " waiting for ranks %v", e.Ranks)
	case e.What != "":
		fmt.Fprintf(&b, " waiting for %s", e.What)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// Unwrap exposes the context error, if any, so errors.Is(err,
// context.DeadlineExceeded) also works when the caller's deadline fired.
func (e *TimeoutError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Cause
}

// PeerClosedError reports that a peer rank is gone.
type PeerClosedError struct {
	Rank int   // the peer
	Err  error // what we observed: EOF, a reset, "closed its bootstrap", ...
}

func (e *PeerClosedError) Error() string {
	if e == nil {
		return "bootstrap: nil *PeerClosedError"
	}
	return fmt.Sprintf("peer rank %d is gone: %v", e.Rank, e.Err)
}

// Is makes errors.Is(err, ErrPeerClosed) true.
func (e *PeerClosedError) Is(target error) bool { return target == ErrPeerClosed }

func (e *PeerClosedError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// waitError turns the outcome of an interrupted wait into the error the API
// promises: a TimeoutError for our timeout or the context's deadline (naming
// the ranks still missing), the context error for a cancellation.
func waitError(ctx context.Context, op string, start time.Time, timeout time.Duration, missing []int, what string) error {
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		var waiting []string
		if len(missing) > 0 {
			waiting = append(waiting, fmt.Sprintf("ranks %v", missing))
		}
		if what != "" {
			waiting = append(waiting, what)
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%s canceled while waiting for %s: %w", op, strings.Join(waiting, ", "), err)
		}
		return fmt.Errorf("%s canceled: %w", op, err)
	}
	te := &TimeoutError{Op: op, Ranks: missing, What: what, After: timeout}
	if ctx.Err() != nil {
		te.Cause = ctx.Err()
		te.After = time.Since(start).Round(time.Millisecond)
	}
	return te
}
