package channels

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors for errors.Is.
var (
	// ErrTimeout: a device-side wait ran past Timeouts.Wait (see TimeoutError).
	ErrTimeout = errors.New("device wait timed out")
	// ErrAborted: the communicator's waits were aborted (Communicator.Abort).
	ErrAborted = errors.New("device waits aborted")
	// ErrClosed: the communicator or object was closed.
	ErrClosed = errors.New("closed")
	// ErrNil: a method was called on a nil object.
	ErrNil = errors.New("channels: nil object")
)

// PeerGoneError reports a peer whose network connection broke: closed
// without the goodbye every orderly close sends, reset, or failing on a
// read or write (its process or host died or became unreachable). The
// communicator that saw it refuses further calls until Close.
type PeerGoneError struct {
	Peer int   // the rank whose connection broke
	Err  error // what the connection reported, naming the rank and socket
}

func (e *PeerGoneError) Error() string {
	if e == nil || e.Err == nil {
		return "channels: a peer's connection broke"
	}
	return e.Err.Error()
}

func (e *PeerGoneError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// TimeoutError reports a device-side wait that gave up: which channel (or
// semaphore, or registered wait id), which peer, which stage of the kernel,
// and what it saw. The communicator whose wait it was refuses further calls
// (with this error) until Close: the protocol state of its channels is no
// longer known.
type TimeoutError struct {
	Rank     int    // the rank whose kernel waited
	ID       uint32 // the channel, semaphore or wait id
	Object   string // what ID names, e.g. "memory channel 3 to rank 1 (tag 0)"
	Peer     int    // the rank it waited on
	Stage    uint32 // the kernel's own stage number
	Op       string // what it waited for, e.g. "semaphore wait", "LL packet read"
	Waited   time.Duration
	Expected uint64 // the token, flag or counter value it waited for
	Observed uint64 // the last value it saw
}

func (e *TimeoutError) Error() string {
	if e == nil {
		var r0 string
		return r0
	}
	var b strings.Builder
	fmt.Fprintf(&b, "channels: rank %d: ", e.Rank)
	if e.Object != "" {
		fmt.Fprintf(&b, "%s: ", e.Object)
	} else {
		fmt.Fprintf(&b, "wait id %d: ", e.ID)
	}
	fmt.Fprintf(&b, "%s at stage %d timed out after %s waiting on rank %d (wanted %d, saw %d)",
		e.Op, e.Stage, e.Waited.Round(time.Microsecond), e.Peer, e.Expected, e.Observed)
	return b.String()
}

// Is makes errors.Is(err, ErrTimeout) true.
func (e *TimeoutError) Is(target error) bool {
	if e == nil {
		var r0 bool
		return r0
	}
	return target == ErrTimeout
}
