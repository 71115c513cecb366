package collectives

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/goep-dev/goep/channels"
)

// Sentinel errors for errors.Is.
var (
	// ErrClosed: the communicator was closed (the channels layer's error).
	ErrClosed = channels.ErrClosed
	// ErrNil: a method was called on a nil *Communicator (or a handle of
	// none).
	ErrNil = errors.New("collectives: nil communicator")
	// ErrConfigMismatch: New found configuration fields that must agree
	// between ranks differing (the error names the fields and the ranks).
	ErrConfigMismatch = channels.ErrConfigMismatch
	// ErrOverflow: a size computation of a call overflowed.
	ErrOverflow = errors.New("size overflows")
)

// checkCtx refuses a nil or finished context before anything is enqueued.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return errors.New("nil context")
	}
	return context.Cause(ctx)
}

// mulBytes is a*b for sizes, failing on a negative factor or overflow of
// int.
func mulBytes(a, b int) (int, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > uint64(maxInt) {
		return 0, false
	}
	return int(lo), true
}

const maxInt = int(^uint(0) >> 1)

// rangeEnd is p+n as an address, failing when it wraps.
func rangeEnd(p uintptr, n int) (uintptr, bool) {
	if n < 0 || uintptr(n) > ^uintptr(0)-p {
		return 0, false
	}
	return p + uintptr(n), true
}

// configFields are the resolved fields every rank must agree on, as
// name=value lines: sizes and grids shape the kernels' shared layouts
// (scratch halves, mailboxes, semaphore sets, registration ids), the NCCL
// mode and Debug decide whether a call goes to a collective that only some
// ranks would enter, and the tuning table picks each call's algorithm.
// Events, SkipPointerChecks and the channels' timeouts are per rank.
func (c Config) fields(tuningID string) []string {
	return []string{
		fmt.Sprintf("ScratchBytes=%d", c.ScratchBytes),
		fmt.Sprintf("PacketBytes=%d", c.PacketBytes),
		fmt.Sprintf("MaxBlocks=%d", c.MaxBlocks),
		fmt.Sprintf("Threads=%d", c.Threads),
		fmt.Sprintf("LLMaxBlocks=%d", c.LLMaxBlocks),
		fmt.Sprintf("MaxRegistrations=%d", c.MaxRegistrations),
		fmt.Sprintf("NCCL=%d", c.NCCL),
		fmt.Sprintf("Debug=%v", c.Debug),
		"Tuning=" + tuningID,
	}
}
