package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
)

// launch is the per-call launch override for an SM count (0: default)
// and the key fields it resolves to.
func (r *inRank) launch(op ep.Op, sms, threads int, mode ep.CopyMode) (*ep.LaunchConfig, inKey, error) {
	o := &ep.LaunchConfig{SMs: sms, Threads: threads, Copy: mode}
	c, err := r.buf.LaunchFor(op, o)
	k := inKey{SMs: c.SMs, Threads: c.Threads}
	if op == ep.OpDispatch {
		k.Copy = c.Copy.String()
	}
	return o, k, err
}

// key is k's launch fields with the rest filled in.
func (k inKey) with(t int, op, dtype, mode string) inKey {
	k.Tokens, k.Op, k.Dtype, k.Mode = t, op, dtype, mode
	return k
}

// timeCalls issues warmup calls, flushes L2, then iters calls back to back,
// each between its own two events (no synchronisation between calls), and
// returns the mean GPU time of all but the first, and the mean host time
// per call likewise.
func (r *inRank) timeCalls(warmup, iters int, call func() error) (us, wallUS float64, err error) {
	return r.timeCallsAfter(warmup, iters, nil, call)
}

// timeCallsAfter is timeCalls with before (when not nil) issued ahead of
// every call, outside its events: a call timed in the state it is meant
// for (internode's combine right after its dispatch).
func (r *inRank) timeCallsAfter(warmup, iters int, before, call func() error) (us, wallUS float64, err error) {
	both := func() error {
		if before != nil {
			if err := before(); err != nil {
				return err
			}
		}
		return call()
	}
	for i := 0; i < warmup; i++ {
		if err := both(); err != nil {
			return 0, 0, err
		}
	}
	if r.flush.Size > 0 {
		if err := r.dev.MemsetAsync(r.flush.Ptr, 0, r.flush.Size, r.st); err != nil {
			return 0, 0, err
		}
	}
	evs := make([]device.Event, 2*iters)
	defer func() {
		for _, e := range evs {
			if e != nil {
				e.Close()
			}
		}
	}()
	for i := range evs {
		if evs[i], err = r.dev.NewEvent(); err != nil {
			return 0, 0, err
		}
	}
	walls := make([]time.Duration, iters)
	for i := 0; i < iters; i++ {
		if before != nil {
			if err := before(); err != nil {
				return 0, 0, err
			}
		}
		if err := evs[2*i].Record(r.st); err != nil {
			return 0, 0, err
		}
		start := time.Now()
		if err := call(); err != nil {
			return 0, 0, err
		}
		walls[i] = time.Since(start)
		if err := evs[2*i+1].Record(r.st); err != nil {
			return 0, 0, err
		}
	}
	if err := evs[2*iters-1].Synchronize(); err != nil {
		return 0, 0, err
	}
	if err := r.buf.Check(); err != nil {
		return 0, 0, err
	}
	for i := 1; i < iters; i++ {
		el, err := r.dev.Elapsed(evs[2*i], evs[2*i+1])
		if err != nil {
			return 0, 0, err
		}
		us += float64(el) / float64(time.Microsecond)
		wallUS += float64(walls[i]) / float64(time.Microsecond)
	}
	n := float64(iters - 1)
	return us / n, wallUS / n, nil
}

// timeGraph captures issue (one call) into a graph and times its replays
// like timeCalls.
func (r *inRank) timeGraph(warmup, iters int, issue func() error) (float64, error) {
	g, err := r.dev.Capture(r.st, issue)
	if err != nil {
		return 0, err
	}
	defer g.Close()
	us, _, err := r.timeCalls(warmup, iters, func() error { return g.Launch(r.st) })
	return us, err
}

// record adds a figure and prints progress.
func (r *inRank) record(k inKey, us, wallUS float64, bytes int64, recv int, tuning bool) {
	r.figs = append(r.figs, inFigure{Key: k, US: us, WallUS: wallUS, Bytes: bytes, Recv: recv, Tuning: tuning})
	gb := ""
	if bytes > 0 {
		gb = fmt.Sprintf(", %.1f GB/s", float64(bytes)/us/1e3)
	}
	launch := fmt.Sprintf("%d SMs x %d threads", k.SMs, k.Threads)
	if !r.o.showLaunch {
		launch = "host backend" // no SMs: the default launch shape means nothing there
	}
	r.progress("%s %s %s (%s%s): %.1f us%s (rank 0)", k.Op, k.Dtype, k.Mode, launch,
		map[bool]string{true: ", " + k.Copy + " copy", false: ""}[k.Copy != ""], us, gb)
}

// measure times one quantity on every rank and records it; the ranks agree
// afterwards.
func (r *inRank) measure(k inKey, bytes int64, recv int, tuning bool, f func() (float64, float64, error)) error {
	us, wall, err := f()
	if err = r.agree(fmt.Sprintf("T=%d %s %s %s", k.Tokens, k.Op, k.Dtype, k.Mode), err); err != nil {
		return err
	}
	r.record(k, us, wall, bytes, recv, tuning)
	return nil
}

// inStep is one measurement of a sequence.
type inStep struct {
	k     inKey
	bytes int64
	f     func() (us, wallUS float64, err error)
}

// timeBF16 times layout, cached dispatch, combine, full dispatch and the
// graph replays at every --sms value, and checks the results again after.
func (r *inRank) timeBF16(sh *inShared, in inTensors, res ep.DispatchResult, comb ep.CombineResult, bytes int64) error {
	ctx, o, t, n := r.ctx, r.o, sh.tokens, res.NumRecv
	h := res.Handle
	if err := r.measure(inKey{Tokens: t, Op: "layout", Dtype: "i64", Mode: "events"}, 0, 0, false, func() (float64, float64, error) {
		return r.timeCalls(o.warmup, o.iters, func() error {
			_, err := r.buf.Layout(r.ctx, ep.LayoutArgs{TopK: in.ids, Stream: r.st})
			return err
		})
	}); err != nil {
		return err
	}
	for _, sms := range o.sms {
		dl, dk, err := r.launch(ep.OpDispatch, sms, o.dispatchThreads, o.copyMode)
		if err != nil {
			return err
		}
		cl, ck, err := r.launch(ep.OpCombine, sms, o.combineThreads, ep.CopyDefault)
		if err != nil {
			return err
		}
		cached := ep.DispatchArgs{X: in.x, Handle: h, Stream: r.st, Launch: dl}
		full := ep.DispatchArgs{X: in.x, TopK: in.ids, Weights: in.w, Stream: r.st, Launch: dl}
		combine := ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: h, Stream: r.st, Launch: cl}
		dispatchCall := func(a ep.DispatchArgs) func() error {
			return func() error { return r.dispatchOnce(ctx, a) }
		}
		combineCall := func() error { _, err := r.buf.Combine(ctx, combine); return err }
		steps := []inStep{
			{dk.with(t, "dispatch", "bf16", "cached"), bytes, func() (float64, float64, error) {
				us, _, err := r.timeCalls(o.warmup, o.iters, dispatchCall(cached))
				if err == nil {
					err = r.checkDispatch("bf16 dispatch after timing", res, sh.ref[r.rank], false, false)
				}
				return us, 0, err
			}},
			{ck.with(t, "combine", "bf16", "events"), bytes, func() (float64, float64, error) {
				us, _, err := r.timeCalls(o.warmup, o.iters, combineCall)
				if err == nil {
					err = r.checkCombine("combine after timing", comb, sh.comb[r.rank])
				}
				return us, 0, err
			}},
			{dk.with(t, "notify+dispatch", "bf16", "full"), bytes, func() (float64, float64, error) {
				return r.timeCalls(o.warmup, o.iters, dispatchCall(full))
			}},
		}
		if o.graph {
			worstFull := full
			worstFull.WorstCase = true
			worstCached := cached
			worstCached.WorstCase = true
			steps = append(steps,
				inStep{dk.with(t, "dispatch", "bf16", "graph"), bytes, func() (float64, float64, error) {
					us, err := r.timeGraph(o.warmup, o.iters, dispatchCall(worstCached))
					return us, 0, err
				}},
				inStep{dk.with(t, "notify+dispatch", "bf16", "graph"), bytes, func() (float64, float64, error) {
					var last *ep.Handle
					us, err := r.timeGraph(o.warmup, o.iters, func() error {
						last.Release() // the host backend re-runs the closure: the last run's handle
						x, err := r.buf.Dispatch(ctx, worstFull)
						last = x.Handle
						return err
					})
					if last != nil {
						last.Release() // the captured dispatch's pinned slot
					}
					if err == nil {
						err = r.checkDispatch("bf16 dispatch after graph replays", res, sh.ref[r.rank], false, false)
					}
					return us, 0, err
				}},
				inStep{ck.with(t, "combine", "bf16", "graph"), bytes, func() (float64, float64, error) {
					us, err := r.timeGraph(o.warmup, o.iters, combineCall)
					if err == nil {
						err = r.checkCombine("combine after graph replays", comb, sh.comb[r.rank])
					}
					return us, 0, err
				}})
		}
		for _, s := range steps {
			if err := r.measure(s.k, s.bytes, n, false, s.f); err != nil {
				return err
			}
		}
	}
	r.rep.ok("checks", fmt.Sprintf("T=%d bf16 after timing", t), "received rows and combined tokens still exact after the timed and replayed calls")
	return nil
}

// timeFP8 times cached and full FP8 dispatch and the graph replays.
func (r *inRank) timeFP8(sh *inShared, in inTensors, res ep.DispatchResult, bytes int64) error {
	ctx, o, t, n := r.ctx, r.o, sh.tokens, res.NumRecv
	for _, sms := range o.sms {
		dl, dk, err := r.launch(ep.OpDispatch, sms, o.dispatchThreads, o.copyMode)
		if err != nil {
			return err
		}
		cached := ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res.Handle, Stream: r.st, Launch: dl}
		full := ep.DispatchArgs{X: in.x8, Scales: in.scales, TopK: in.ids, Stream: r.st, Launch: dl}
		call := func(a ep.DispatchArgs) func() error {
			return func() error { return r.dispatchOnce(ctx, a) }
		}
		if err := r.measure(dk.with(t, "dispatch", "fp8", "cached"), bytes, n, false, func() (float64, float64, error) {
			us, _, err := r.timeCalls(o.warmup, o.iters, call(cached))
			if err == nil {
				err = r.checkDispatch("fp8 dispatch after timing", res, sh.ref8[r.rank], true, false)
			}
			return us, 0, err
		}); err != nil {
			return err
		}
		if err := r.measure(dk.with(t, "notify+dispatch", "fp8", "full"), bytes, n, false, func() (float64, float64, error) {
			return r.timeCalls(o.warmup, o.iters, call(full))
		}); err != nil {
			return err
		}
		if !o.graph {
			continue
		}
		cached.WorstCase = true
		if err := r.measure(dk.with(t, "dispatch", "fp8", "graph"), bytes, n, false, func() (float64, float64, error) {
			us, err := r.timeGraph(o.warmup, o.iters, call(cached))
			return us, 0, err
		}); err != nil {
			return err
		}
		full.WorstCase = true
		if err := r.measure(dk.with(t, "notify+dispatch", "fp8", "graph"), bytes, n, false, func() (float64, float64, error) {
			var last *ep.Handle
			us, err := r.timeGraph(o.warmup, o.iters, func() error {
				last.Release() // the host backend re-runs the closure: the last run's handle
				x, err := r.buf.Dispatch(ctx, full)
				last = x.Handle
				return err
			})
			if last != nil {
				last.Release()
			}
			if err == nil {
				err = r.checkDispatch("fp8 dispatch after graph replays", res, sh.ref8[r.rank], true, false)
			}
			return us, 0, err
		}); err != nil {
			return err
		}
	}
	return nil
}

// dispatchOnce is one timed dispatch: a non-cached one's new handle is
// released at once (handles live until released; the next dispatch on the
// same stream may take the slot).
func (r *inRank) dispatchOnce(ctx context.Context, a ep.DispatchArgs) error {
	res, err := r.buf.Dispatch(ctx, a)
	if a.Handle == nil {
		res.Handle.Release()
	}
	res.Done.Release()
	return err
}
