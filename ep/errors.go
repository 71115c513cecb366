package ep

import (
	"errors"
	"fmt"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/channels"
)

// Sentinel errors for errors.Is.
var (
	// ErrTimeout: a device-side wait ran out (the error also wraps a
	// *channels.TimeoutError naming the stage and the rank waited on). The
	// Buffer refuses calls until Close.
	ErrTimeout = channels.ErrTimeout
	// ErrMismatch: the ranks made mismatched calls (a different call
	// kind, cached on some ranks and full on others, another dtype or
	// weights, or the same calls in another order). Every rank gets it
	// (the error wraps a *intranode.MismatchError naming the peer and the
	// fields); the Buffer refuses calls until Close. It is always checked:
	// a fingerprint travels with the signals the kernels already exchange.
	ErrMismatch = buffer.ErrMismatch
	// ErrClosed: the Buffer was closed.
	ErrClosed = channels.ErrClosed
	// ErrForeignHandle: a handle from another Buffer.
	ErrForeignHandle = errors.New("handle belongs to another buffer")
	// ErrExpiredHandle: a handle that was released, or whose Buffer was
	// closed.
	ErrExpiredHandle = errors.New("handle expired")
	// ErrNoHandleSlot: a non-cached dispatch found every handle slot held
	// by a live handle (Config.Handles); it also wraps ErrInvalidArgument:
	// nothing was launched and the Buffer stays usable.
	ErrNoHandleSlot = errors.New("no free handle slot")
	// ErrEventRecycled: a call's Done event held unreleased while more
	// than Config.Events later calls took theirs: the pool's ring wrapped
	// and gave its CUevent to a later call (Buffer.Events counts these).
	ErrEventRecycled = buffer.ErrEventRecycled
	// ErrEventReleased: a Done event used after Event.Release.
	ErrEventReleased = buffer.ErrEventReleased
	// ErrInvalidArgument: validation refused the call before any launch;
	// the Buffer stays usable.
	ErrInvalidArgument = errors.New("invalid argument")
)

// InvalidIDsError reports top-k expert ids outside [-1, Experts) that a
// kernel counted. The kernels treat them as -1 (no expert), so the call
// completed on every rank and its result is valid; the routing is wrong.
type InvalidIDsError struct {
	Rank    int
	Op      string // "dispatch" or "layout"
	Count   int    // entries outside [-1, Experts)
	Experts int
}

func (e *InvalidIDsError) Error() string {
	if e == nil {
		return "ep: nil *InvalidIDsError"
	}
	return fmt.Sprintf("ep: rank %d: %s: %d top-k ids outside [-1, %d) (treated as -1)", e.Rank, e.Op, e.Count, e.Experts)
}

// errNilBuffer is what calls on a nil *Buffer return.
var errNilBuffer = &argError{errors.New("ep: nil Buffer")}

// argError marks a validation failure.
type argError struct{ err error }

func (e *argError) Error() string   { return e.err.Error() }
func (e *argError) Unwrap() []error { return []error{e.err, ErrInvalidArgument} }
func (b *Buffer) invalid(op string, format string, a ...any) error {
	return &argError{fmt.Errorf("ep: rank %d: %s: "+format, append([]any{b.rank, op}, a...)...)}
}
