package collectives

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strings"

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
	ErrConfigMismatch = errors.New("configuration differs between ranks")
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

// compareConfigs is the error for the ranks' field lists all (one per
// rank; a rank whose own configuration was invalid sends "invalid: why"),
// naming every field that differs and which ranks hold which value; nil
// when they agree.
func compareConfigs(component string, all [][]byte) error {
	type rankVal struct {
		rank int
		val  string
	}
	perField := map[string][]rankVal{}
	var order []string
	var invalid []string
	for r, b := range all {
		s := string(b)
		if rest, ok := strings.CutPrefix(s, "invalid: "); ok {
			invalid = append(invalid, fmt.Sprintf("rank %d: %s", r, clip(rest, 200)))
			continue
		}
		for _, line := range strings.Split(s, "\n") {
			name, val, _ := strings.Cut(line, "=")
			if _, seen := perField[name]; !seen {
				order = append(order, name)
			}
			perField[name] = append(perField[name], rankVal{r, val})
		}
	}
	var diffs []string
	for _, name := range order {
		groups := map[string][]int{}
		for _, rv := range perField[name] {
			groups[rv.val] = append(groups[rv.val], rv.rank)
		}
		if len(groups) < 2 && len(perField[name]) == len(all)-len(invalid) {
			continue
		}
		var parts []string
		for v, ranks := range groups {
			parts = append(parts, fmt.Sprintf("%s on %s", clip(v, 80), rankList(ranks)))
		}
		sort.Strings(parts)
		diffs = append(diffs, fmt.Sprintf("%s.%s: %s", component, name, strings.Join(parts, ", ")))
	}
	if len(invalid) == 0 && len(diffs) == 0 {
		return nil
	}
	msg := strings.Join(append(invalid, diffs...), "; ")
	return fmt.Errorf("%w: %s", ErrConfigMismatch, msg)
}

func rankList(ranks []int) string {
	sort.Ints(ranks)
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	if len(s) > 16 {
		s = append(s[:16], fmt.Sprintf("and %d more", len(ranks)-16))
	}
	return "ranks " + strings.Join(s, " ")
}

// clip shortens echoed input.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
}
