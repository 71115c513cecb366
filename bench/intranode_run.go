package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
)

// inOutcome is one rank's result, gathered on rank 0.
type inOutcome struct {
	Device  string     `json:"device"`
	SMs     int        `json:"sms"`
	Memory  ep.Memory  `json:"buffer_memory"`
	Hint    int        `json:"size_hint_device_bytes"`
	WSBytes int        `json:"workspace_bytes"`
	Checks  []check    `json:"checks"`
	Figures []inFigure `json:"figures"`
	Err     string     `json:"error,omitempty"`
}

// inFigure is one timed quantity on one rank.
type inFigure struct {
	Key    inKey   `json:"key"`
	US     float64 `json:"us"`
	WallUS float64 `json:"wall_us,omitempty"`
	Bytes  int64   `json:"bytes"`
	Recv   int     `json:"recv"`
	Tuning bool    `json:"tuning,omitempty"`
}

// inKey names a figure: what was timed, how, at which shape and launch.
type inKey struct {
	Tokens  int    `json:"tokens"`
	Op      string `json:"op"`    // layout, dispatch, notify+dispatch, combine
	Dtype   string `json:"dtype"` // bf16, fp8, i64
	Mode    string `json:"mode"`  // events, cached, full, graph
	SMs     int    `json:"sms"`
	Threads int    `json:"threads"`
	Copy    string `json:"copy,omitempty"` // dispatch's copy path
}

// intranodeGoroutines runs every rank as a goroutine of this process.
func intranodeGoroutines(ctx context.Context, o inOpts, stdout io.Writer) error {
	n, err := goroutineRanks("intranode", o.kind, o.ranks, 8, 1)
	if err != nil {
		return err
	}
	if _, err := ep.SizeHints(o.config(n), n); err != nil {
		return err
	}
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	if err != nil {
		return err
	}
	o.progress.printf("%d goroutine ranks, %s backend: setting up buffers", n, o.kind)
	if note := sharedGPUNote(o.kind, n); note != "" {
		fmt.Fprintln(stdout, "note:", note)
	}
	cache := &inputCache{o: o, ranks: n}
	outs := make([]inOutcome, n)
	errs := onGoroutineRanks(o.kind, boots, func(r int, dev device.Device) error {
		outs[r] = intranodeRank(ctx, boots[r], dev, o, cache, r == 0)
		if outs[r].Err != "" {
			return errors.New(outs[r].Err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil && outs[r].Err == "" {
			outs[r].Err = err.Error() // the device did not open
		}
	}
	if err := interrupted(ctx); err != nil {
		return err // the ranks' failures are the interruption's echoes
	}
	return reportIntranode(stdout, o, n, "goroutines", outs)
}

// intranodeProcess runs this process's rank of a launched job (one GPU per
// process, like DeepEP's test).
func intranodeProcess(ctx context.Context, env bootstrap.EnvInfo, o inOpts, stdout io.Writer) (err error) {
	if _, err := ep.SizeHints(o.config(env.Size), env.Size); err != nil {
		return err
	}
	bs, dev, release, err := joinProcess(ctx, env, o.kind)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, release()) }()
	if env.Rank == 0 {
		o.progress.printf("%s: %d ranks, %s backend: setting up buffers", launchedBy(env), env.Size, o.kind)
	}
	mine := intranodeRank(ctx, bs, dev, o, &inputCache{o: o, ranks: env.Size}, env.Rank == 0)
	if err := interrupted(ctx); err != nil {
		return err
	}
	outs, root, err := gatherOutcomes(ctx, bs, stdout, mine)
	if !root || err != nil {
		return err
	}
	return reportIntranode(stdout, o, env.Size, "processes", outs)
}

// inRank is one rank's benchmark state.
type inRank struct {
	ctx         context.Context
	o           inOpts
	bs          bootstrap.Bootstrap
	dev         device.Device
	buf         *ep.Buffer
	st          device.Stream
	flush       device.Buffer
	rank, ranks int
	lead        bool
	rep         *report
	figs        []inFigure
	bufs        []device.Buffer
	step        string
	// traceProxy: internode --trace-proxy; traces what it recorded;
	// traceKernels: internode --trace-kernels.
	traceProxy, traceKernels bool
	traces                   []interTrace
}

// intranodeRank checks and times on one rank. Every rank runs the same
// sequence of collective calls; after every check the ranks agree, so a
// failure on one stops all of them instead of leaving peers waiting.
func intranodeRank(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, o inOpts, cache *inputCache, lead bool) (out inOutcome) {
	info := dev.Info()
	out.Device, out.SMs = info.Name, info.SMs
	r := &inRank{ctx: ctx, o: o, bs: bs, dev: dev, rank: bs.Rank(), ranks: bs.Size(), lead: lead, rep: &report{}}
	defer func() { out.Checks, out.Figures = r.rep.Checks, r.figs }()
	var err error
	defer func() {
		if err != nil {
			out.Err = err.Error()
		}
	}()
	if r.buf, err = ep.NewBuffer(ctx, bs, dev, o.config(r.ranks)); err != nil {
		return out
	}
	out.Memory, out.Hint, out.WSBytes = r.buf.Memory(), r.buf.SizeHint().Device, r.buf.SizeHint().Workspace
	defer func() {
		if cerr := r.buf.Close(ctx); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if r.st, err = dev.NewStream(); err != nil {
		return out
	}
	defer r.st.Close()
	r.step = "setup"
	r.progress("buffers ready (%.1f MiB of device memory per rank)", float64(out.Memory.Device)/(1<<20))
	if o.flushMiB > 0 {
		if r.flush, err = dev.Alloc(o.flushMiB << 20); err != nil {
			return out
		}
		defer dev.Free(r.flush)
	}
	defer r.freeAll()
	for i, t := range o.tokens {
		r.step = fmt.Sprintf("T=%d (%d/%d)", t, i+1, len(o.tokens))
		// No interruption check of its own here: the inputs' agreement
		// below is where every rank learns of it together.
		r.progress("routing, data and the reference results")
		sh, gerr := cache.get(ctx, t)
		if err = r.agree("inputs", gerr); err != nil {
			return out
		}
		if err = r.runTokens(sh); err != nil {
			return out
		}
		r.freeAll()
	}
	return out
}

// agree tells every rank whether this one failed and returns an error if
// any did (naming them).
func (r *inRank) agree(what string, mine error) error {
	msg := ""
	if mine != nil {
		msg = mine.Error()
	}
	all, err := r.bs.AllGather(r.ctx, []byte(msg))
	if err != nil {
		return errors.Join(mine, fmt.Errorf("%s: agreeing with the other ranks: %w", what, err))
	}
	if mine != nil {
		return mine
	}
	var bad []string
	for i, m := range all {
		if len(m) > 0 {
			bad = append(bad, fmt.Sprintf("rank %d", i))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: stopped because %s failed", what, strings.Join(bad, ", "))
	}
	return nil
}

func (r *inRank) upload(data []byte) (uintptr, error) {
	b, err := r.dev.Alloc(max(len(data), 256))
	if err != nil {
		return 0, err
	}
	r.bufs = append(r.bufs, b)
	if len(data) > 0 {
		err = r.dev.CopyIn(b.Ptr, data)
	}
	return b.Ptr, err
}

func (r *inRank) freeAll() {
	for _, b := range r.bufs {
		_ = r.dev.Free(b)
	}
	r.bufs = nil
}

// progress prints a step of the lead rank (the others do the same steps).
func (r *inRank) progress(format string, a ...any) {
	if r.lead {
		r.o.progress.printf("%s: %s", r.step, fmt.Sprintf(format, a...))
	}
}

// runTokens checks, then times (or tunes), at one token count.
func (r *inRank) runTokens(sh *inShared) error {
	ctx, o, t := r.ctx, r.o, sh.tokens
	r.progress("inputs ready; checking dispatch (non-cached, cached) and combine against the reference")
	in, err := r.uploadInputs(sh)
	if err = r.agree("upload", err); err != nil {
		return err
	}
	want, wantC := sh.ref[r.rank], sh.comb[r.rank]

	// Correctness first: non-cached and cached dispatch, combine of the
	// received rows.
	var res ep.DispatchResult
	var comb ep.CombineResult
	err = func() error {
		var err error
		if res, err = r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, TopK: in.ids, Weights: in.w, Stream: r.st}); err != nil {
			return err
		}
		if err := r.checkDispatch("bf16 non-cached dispatch", res, want, false, true); err != nil {
			return err
		}
		if err := res.Handle.Pin(); err != nil {
			return err
		}
		poisonErr := r.dev.MemsetAsync(res.RecvX.Ptr, 0xEE, res.RecvX.Bytes(), r.st)
		if poisonErr != nil {
			return poisonErr
		}
		c, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, Weights: in.w, Handle: res.Handle, Stream: r.st})
		if err != nil {
			return err
		}
		if err := r.checkDispatch("bf16 cached dispatch", c, want, false, false); err != nil {
			return err
		}
		if comb, err = r.buf.Combine(ctx, ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: res.Handle, Stream: r.st}); err != nil {
			return err
		}
		return r.checkCombine("combine", comb, wantC)
	}()
	if err = r.agree("bf16 checks", err); err != nil {
		return err
	}
	r.rep.ok("checks", fmt.Sprintf("T=%d bf16", t), "dispatch (non-cached, cached) byte-exact, combine bit-exact; rank 0 received %d rows", res.NumRecv)
	r.progress("bf16 checks passed; timing")
	h := res.Handle
	defer h.Release()

	rowBytes := int64(2 * o.hidden)
	bytesBF16 := int64(res.NumRecv) * rowBytes
	bytesFP8 := int64(res.NumRecv) * int64(o.hidden+o.hidden/32)

	if o.tune {
		if err := r.tuneBF16(sh, in, res, bytesBF16); err != nil {
			return err
		}
	} else if err := r.timeBF16(sh, in, res, comb, bytesBF16); err != nil {
		return err
	}

	if !o.fp8 {
		return nil
	}
	var res8 ep.DispatchResult
	err = func() error {
		var err error
		if res8, err = r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x8, Scales: in.scales, TopK: in.ids, Stream: r.st}); err != nil {
			return err
		}
		if err := r.checkDispatch("fp8 non-cached dispatch", res8, sh.ref8[r.rank], true, true); err != nil {
			return err
		}
		if err := res8.Handle.Pin(); err != nil {
			return err
		}
		c, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res8.Handle, Stream: r.st})
		if err != nil {
			return err
		}
		return r.checkDispatch("fp8 cached dispatch", c, sh.ref8[r.rank], true, false)
	}()
	if err = r.agree("fp8 checks", err); err != nil {
		return err
	}
	defer res8.Handle.Release()
	r.rep.ok("checks", fmt.Sprintf("T=%d fp8", t), "dispatch (non-cached, cached) byte-exact, scales included")
	if o.tune {
		return r.tuneFP8(sh, in, res8, bytesFP8)
	}
	return r.timeFP8(sh, in, res8, bytesFP8)
}
