package collectives

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/goep-dev/goep/internal/device"
)

// CallOption adjusts one call.
type CallOption func(*call)

// WithAlgorithm forces an algorithm by name (AlgoLL, AlgoLL2, AlgoScratch,
// AlgoZC, AlgoNCCL); the call fails, saying why, when it cannot run it.
// Every rank must force the same one.
func WithAlgorithm(name string) CallOption {
	return func(x *call) { x.algo, x.forced = name, true }
}

// WithBlocks sets the grid of a scratch or zero-copy kernel (at most
// Config.MaxBlocks); every rank must pass the same.
func WithBlocks(n int) CallOption { return func(x *call) { x.blocks = n } }

// AllReduce reduces count elements of send on every rank with op and
// leaves the result in every rank's recv (send == recv: in place). The work
// is enqueued on s (nil: the device's default stream).
func (c *Communicator) AllReduce(ctx context.Context, s device.Stream, send, recv uintptr, count int, dt DataType, op Op, opts ...CallOption) (*Work, error) {
	return c.run(ctx, &call{kind: AllReduce, stream: s, send: send, recv: recv, count: count, dt: dt, op: op}, opts)
}

// AllGather concatenates every rank's sendCount elements, in rank order,
// into every rank's recv (size * sendCount elements). In place: send is
// recv + rank * sendCount elements.
func (c *Communicator) AllGather(ctx context.Context, s device.Stream, send, recv uintptr, sendCount int, dt DataType, opts ...CallOption) (*Work, error) {
	return c.run(ctx, &call{kind: AllGather, stream: s, send: send, recv: recv, count: sendCount, dt: dt, op: Sum}, opts)
}

// ReduceScatter reduces every rank's send (size * recvCount elements) with
// op and leaves part rank of the result (recvCount elements) in recv. In
// place: recv is send + rank * recvCount elements.
func (c *Communicator) ReduceScatter(ctx context.Context, s device.Stream, send, recv uintptr, recvCount int, dt DataType, op Op, opts ...CallOption) (*Work, error) {
	return c.run(ctx, &call{kind: ReduceScatter, stream: s, send: send, recv: recv, count: recvCount, dt: dt, op: op}, opts)
}

func (c *Communicator) run(ctx context.Context, x *call, opts []CallOption) (*Work, error) {
	if c == nil {
		return nil, ErrNil
	}
	for _, o := range opts {
		if o != nil {
			o(x)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkLocked(); err != nil {
		return nil, err
	}
	// A finished context is refused before anything is enqueued or
	// exchanged. Every rank of a collective call is expected to pass a live
	// one; a rank that does not fails alone and launches nothing.
	if err := checkCtx(ctx); err != nil {
		return nil, c.errorf("%s: %w", x, err)
	}
	verr := c.validate(x)
	if verr == nil && x.stream == nil {
		x.stream = c.dev.DefaultStream()
	}
	if verr == nil && x.count > 0 {
		verr = c.inspect(x)
	}
	// In debug mode every rank says what it is about to do (or that its
	// call is invalid) before any of them launches, so a mismatch fails
	// every rank at once instead of leaving the others waiting.
	if c.cfg.Debug {
		if err := c.debugCheck(ctx, x, verr); err != nil {
			return nil, err
		}
	}
	if verr != nil {
		return nil, verr
	}
	w := &Work{c: c, kind: x.kind, stream: x.stream}
	if x.count == 0 {
		w.algo = "none"
		if !c.native {
			w.done = true
			return w, nil
		}
		var err error
		if x.captured, err = c.gpu.capturing(x.stream); err != nil {
			return nil, c.errorf("%s: %w", x, err)
		}
		if err := c.launchSync(x); err != nil {
			return nil, err
		}
		return c.finish(w, x)
	}
	if c.size == 1 {
		w.algo = "copy"
		if x.send != x.recv {
			if err := c.dev.CopyAsync(x.recv, x.send, x.recvBytes, x.stream); err != nil {
				return nil, c.errorf("%s: %w", x, err)
			}
		}
		return c.finish(w, x)
	}
	// Registered plans come first (UsePlans).
	if algo, ok, err := c.tryPlan(ctx, x); err != nil {
		return nil, err
	} else if ok {
		w.algo = algo
		return c.finish(w, x)
	}
	if err := c.choose(x); err != nil {
		return nil, err
	}
	var err error
	if x.algo == AlgoNCCL {
		err = c.launchNCCL(ctx, x)
	} else {
		err = c.launch(x.algo, x)
	}
	if err != nil {
		return nil, err
	}
	w.algo = x.algo
	return c.finish(w, x)
}

// inspect finds out what the selector needs beyond the arguments: whether
// the stream is capturing, whether the buffers are this GPU's memory (an
// error otherwise) and whether they are registered.
func (c *Communicator) inspect(x *call) error {
	var err error
	if x.captured, err = c.gpu.capturing(x.stream); err != nil {
		return c.errorf("%s: %w", x, err)
	}
	// The host backend knows its allocations: the same range checks as the
	// driver's pointer queries give the CUDA path.
	if rc, ok := c.dev.(device.RangeChecker); ok && c.gpu == nil && !c.cfg.ForeignHostMemory {
		if err := rc.CheckRange(x.send, x.sendBytes); err != nil {
			return c.errorf("%s: send buffer: %w", x, err)
		}
		if err := rc.CheckRange(x.recv, x.recvBytes); err != nil {
			return c.errorf("%s: recv buffer: %w", x, err)
		}
	}
	if err := c.gpu.checkRange("send buffer", x.send, x.sendBytes); err != nil {
		return c.errorf("%s: %w", x, err)
	}
	if err := c.gpu.checkRange("recv buffer", x.recv, x.recvBytes); err != nil {
		return c.errorf("%s: %w", x, err)
	}
	x.sendReg, x.sendOff = c.lookup(x.send, x.sendBytes)
	x.recvReg, x.recvOff = c.lookup(x.recv, x.recvBytes)
	return nil
}

// finish records the call's event (not when captured: the call runs with
// the graph).
func (c *Communicator) finish(w *Work, x *call) (*Work, error) {
	c.seq++
	if w.captured = x.captured; w.captured {
		return w, nil
	}
	if c.gpu == nil {
		w.done = true
		return w, nil
	}
	var err error
	if w.ev, w.gen, err = c.events.record(x.stream); err != nil {
		return nil, c.errorf("%s: recording its event: %w", x, err)
	}
	return w, nil
}

// maxCallBytes bounds one buffer of a call (1 PiB): far above any GPU's
// memory, and small enough that offsets and sums of a few such sizes stay
// far from overflowing.
const maxCallBytes = 1 << 50

// validate checks the call's arguments before anything is enqueued.
func (c *Communicator) validate(x *call) error {
	if x.count < 0 {
		return c.errorf("%s: negative count", x.kind)
	}
	if !x.dt.Valid() {
		return c.errorf("%s: unknown data type %v", x.kind, x.dt)
	}
	if x.kind != AllGather && !x.op.Valid() {
		return c.errorf("%s: unknown reduction %v", x.kind, x.op)
	}
	if x.blocks < 0 {
		return c.errorf("%s: negative grid", x.kind)
	}
	if x.forced && !validAlgo(x.kind, x.algo) {
		return c.errorf("%s: no algorithm %q (have %s)", x.kind, x.algo, strings.Join(Algorithms(x.kind), ", "))
	}
	// Every byte count in 64 bits with overflow detection: a count whose
	// bytes wrap would pass the checks below as a small size.
	n, ok := mulBytes(x.count, x.dt.Size())
	W := c.size
	total, ok2 := mulBytes(W, n)
	if !ok || !ok2 || total > maxCallBytes {
		return c.errorf("%s: the byte count overflows (%d elements of %d bytes, %d ranks; at most %d bytes a buffer): %w",
			x, x.count, x.dt.Size(), W, maxCallBytes, ErrOverflow)
	}
	switch x.kind {
	case AllReduce:
		x.sendBytes, x.recvBytes = n, n
	case AllGather:
		x.sendBytes, x.recvBytes = n, total
	case ReduceScatter:
		x.sendBytes, x.recvBytes = total, n
	}
	if x.count == 0 {
		return nil
	}
	if x.send == 0 || x.recv == 0 {
		return c.errorf("%s: nil buffer (send %#x, recv %#x)", x, x.send, x.recv)
	}
	if _, ok := rangeEnd(x.send, x.sendBytes); !ok {
		return c.errorf("%s: send [%#x, +%d) overflows the address space: %w", x, x.send, x.sendBytes, ErrOverflow)
	}
	if _, ok := rangeEnd(x.recv, x.recvBytes); !ok {
		return c.errorf("%s: recv [%#x, +%d) overflows the address space: %w", x, x.recv, x.recvBytes, ErrOverflow)
	}
	overlap := func(a uintptr, an int, b uintptr, bn int) bool {
		return a < b+uintptr(bn) && b < a+uintptr(an)
	}
	var inPlace bool
	switch x.kind {
	case AllReduce:
		inPlace = x.send == x.recv
	case AllGather:
		inPlace = x.send == x.recv+uintptr(c.rank*n)
	case ReduceScatter:
		inPlace = x.recv == x.send+uintptr(c.rank*n)
	}
	if !inPlace && overlap(x.send, x.sendBytes, x.recv, x.recvBytes) {
		return c.errorf("%s: send [%#x, +%d) and recv [%#x, +%d) overlap without being in place", x, x.send, x.sendBytes, x.recv, x.recvBytes)
	}
	return nil
}

// debugCheck compares the call across ranks (Config.Debug): everything
// the algorithm choice depends on, or the reason this rank's call is
// invalid.
func (c *Communicator) debugCheck(ctx context.Context, x *call, invalid error) error {
	var sig string
	if invalid != nil {
		sig = "invalid call: " + invalid.Error()
	} else {
		sig = fmt.Sprintf("%s count=%d dtype=%s", x.kind, x.count, x.dt)
		if x.kind != AllGather {
			sig += " op=" + x.op.String()
		}
		if x.forced {
			sig += " algorithm=" + x.algo
		}
		sig += fmt.Sprintf(" blocks=%d registered=%v/%v graph=%v tuning=%s", x.blocks, x.sendReg != nil, x.recvReg != nil,
			x.captured, c.tuning.id())
	}
	all, err := c.bs.AllGather(ctx, []byte(sig))
	if err != nil {
		return c.errorf("debug check of %s: %w", x, err)
	}
	groups := map[string][]int{}
	for r, b := range all {
		groups[string(b)] = append(groups[string(b)], r)
	}
	if len(groups) == 1 {
		return nil
	}
	var lines []string
	for s, ranks := range groups {
		lines = append(lines, fmt.Sprintf("ranks %v: %s", ranks, s))
	}
	sort.Strings(lines)
	return c.errorf("debug: the ranks' calls do not match (call %d): %s", c.seq, strings.Join(lines, "; "))
}
