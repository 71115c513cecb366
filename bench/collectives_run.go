package bench

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// collOutcome is one rank's result, gathered on rank 0.
type collOutcome struct {
	Rows    []collRow           `json:"rows"`
	Checks  []check             `json:"checks"`
	Tuning  *collectives.Tuning `json:"tuning,omitempty"`
	Device  string              `json:"device"`
	SMs     int                 `json:"sms"`
	NCCL    string              `json:"nccl,omitempty"`
	Skipped map[string][]string `json:"skipped,omitempty"`
	Err     string              `json:"error,omitempty"`
}

func collGoroutines(ctx context.Context, o collOpts, stdout io.Writer) error {
	n, err := goroutineRanks("collectives", o.kind, o.ranks, 0, 2)
	if err != nil {
		return err
	}
	o.progress.printf("%d goroutine ranks, %s backend: connecting", n, o.kind)
	if note := sharedGPUNote(o.kind, n); note != "" {
		fmt.Fprintln(stdout, "note:", note)
	}
	outs := make([]collOutcome, n)
	errs := colltest.RunLocal(ctx, o.kind, n, bootstrap.Config{}, o.config(), func(ctx context.Context, c *collectives.Communicator) error {
		outs[c.Rank()] = collRank(ctx, c, o)
		if e := outs[c.Rank()].Err; e != "" {
			return errors.New(e)
		}
		return nil
	})
	if err := interrupted(ctx); err != nil {
		return err // the ranks' failures are the interruption's echoes
	}
	for r, err := range errs {
		if err != nil && outs[r].Err == "" {
			outs[r].Err = err.Error()
		}
	}
	return reportColl(stdout, o, n, outs)
}

func collProcess(ctx context.Context, env bootstrap.EnvInfo, o collOpts, stdout io.Writer) (err error) {
	bs, dev, release, err := joinProcess(ctx, env, o.kind)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, release()) }()
	c, err := collectives.New(ctx, bs, dev, o.config())
	if err != nil {
		return err
	}
	if env.Rank == 0 {
		o.progress.printf("%s: %d ranks, %s backend", launchedBy(env), env.Size, o.kind)
	} else {
		o.progress = nil // rank 0 speaks for all
	}
	mine := collRank(ctx, c, o)
	// Everyone is done with everyone's memory before anyone frees it.
	berr := bs.Barrier(ctx)
	err = errors.Join(err, c.Close())
	if ierr := interrupted(ctx); ierr != nil {
		return ierr
	}
	outs, root, gerr := gatherOutcomes(ctx, bs, stdout, mine)
	if !root || gerr != nil {
		return errors.Join(err, berr, gerr)
	}
	return errors.Join(err, reportColl(stdout, o, env.Size, outs))
}

// collRun is one rank's benchmark state.
type collRun struct {
	ctx   context.Context
	c     *collectives.Communicator
	o     collOpts
	dev   device.Device
	s     device.Stream
	b     *colltest.Buffers
	flush device.Buffer
	bar   device.Buffer // 8 floats for the device barrier before flushed calls
	ev    [2]device.Event
	rep   *report
	rows  []collRow
	seed  uint32
	skip  map[string][]string
}

func collRank(ctx context.Context, c *collectives.Communicator, o collOpts) (out collOutcome) {
	r := &collRun{ctx: ctx, c: c, o: o, dev: c.Device(), s: c.Device().DefaultStream(), rep: &report{}, seed: 0x5eed,
		skip: map[string][]string{}}
	defer abortOnCancel(ctx, c.Abort)()
	info := r.dev.Info()
	out.Device, out.SMs = info.Name, info.SMs
	defer func() {
		out.Rows, out.Checks, out.Skipped = r.rows, r.rep.Checks, r.skip
		if lib := c.NCCLLibrary(); lib != nil {
			out.NCCL = lib.VersionString() + " (" + lib.Path + ")"
		}
	}()
	fail := func(err error) collOutcome {
		out.Err = err.Error()
		return out
	}
	if o.tuning != "" {
		t, err := collectives.LoadTuning(o.tuning)
		if err != nil {
			return fail(err)
		}
		c.SetTuning(t)
	}
	var err error
	if r.b, err = colltest.NewBuffers(ctx, c, o.arenaBytes(c.Size()), true); err != nil {
		return fail(err)
	}
	defer r.b.Free()
	if r.bar, err = r.dev.Alloc(64); err != nil {
		return fail(err)
	}
	defer r.dev.Free(r.bar)
	if o.flushMiB > 0 && o.kind == device.CUDA {
		if r.flush, err = r.dev.Alloc(o.flushMiB << 20); err != nil {
			return fail(err)
		}
		defer r.dev.Free(r.flush)
	}
	for i := range r.ev {
		if r.ev[i], err = r.dev.NewEvent(); err != nil {
			return fail(err)
		}
		defer r.ev[i].Close()
	}
	for _, k := range o.colls {
		if err := r.collective(k); err != nil {
			return fail(err)
		}
	}
	if o.tune {
		t, err := r.buildTuning()
		if err != nil {
			return fail(err)
		}
		out.Tuning = t
	}
	return out
}

// candidates are what is timed at one size: with --tune every algorithm
// that can run it (bulk ones at each --blocks), else the selector's choice
// (or --algo); NCCL with --compare.
type candidate struct {
	algo   string
	blocks int
}

func (r *collRun) candidates(k collectives.Kind, count int) []candidate {
	var out []candidate
	switch {
	case r.o.tune:
		for _, a := range collectives.Algorithms(k) {
			if a == collectives.AlgoNCCL {
				continue
			}
			if err := r.c.CanRun(k, a, count, r.o.dt, r.o.op, true); err != nil {
				key := k.String() + "/" + a
				r.skip[key] = append(r.skip[key], human(count*r.o.dt.Size()))
				continue
			}
			if a == collectives.AlgoScratch || a == collectives.AlgoZC {
				for _, nb := range r.o.blocks {
					if nb <= r.c.Config().MaxBlocks {
						out = append(out, candidate{a, nb})
					}
				}
				continue
			}
			out = append(out, candidate{a, 0})
		}
	case r.o.algo != "":
		out = append(out, candidate{r.o.algo, 0})
	default:
		out = append(out, candidate{"", 0}) // auto
	}
	if r.o.compare && r.o.algo != collectives.AlgoNCCL {
		out = append(out, candidate{collectives.AlgoNCCL, 0})
	}
	return out
}

func (r *collRun) collective(k collectives.Kind) error {
	W := r.c.Size()
	for _, size := range r.o.sizesOf(k, W) {
		count := size / r.o.dt.Size()
		for _, cand := range r.candidates(k, count) {
			r.seed++
			cs := colltest.Case{Kind: k, Algorithm: cand.algo, Blocks: cand.blocks, Count: count, DType: r.o.dt, Op: r.o.op,
				Fill: ref.FillSmallInt, Seed: r.seed}
			row := collRow{Collective: k.String(), Bytes: int64(size), TotalBytes: int64(size), Algorithm: cand.algo, Blocks: cand.blocks}
			if k != collectives.AllReduce {
				row.TotalBytes *= int64(W)
			}
			if row.Algorithm == "" {
				row.Algorithm = "auto"
			}
			name := fmt.Sprintf("%s %s %s", k, human(size), row.Algorithm)
			if cand.blocks > 0 {
				name += fmt.Sprintf("/%d", cand.blocks)
			}
			if err := interrupted(r.ctx); err != nil {
				return err
			}
			if r.c.Rank() == 0 {
				r.o.progress.printf("%s: checking, then timing", name)
			}
			chosen, err := r.checkOnce(cs)
			allOK, aerr := r.allPassed(err == nil)
			if aerr != nil {
				return aerr
			}
			if !allOK {
				if err == nil {
					err = errors.New("another rank's check failed")
				}
				r.rep.fail("checks", name, "%v", err)
				row.Error, row.Mode = err.Error(), "check"
				r.rows = append(r.rows, row)
				continue
			}
			row.Chosen = chosen
			modes := []string{"flushed"}
			if size <= r.o.smallMax {
				modes = []string{"eager", "graph"}
			}
			for _, mode := range modes {
				us, calls, err := r.time(cs, mode)
				if err == nil {
					err = r.b.VerifyDevice(cs, r.s) // still right after back-to-back calls
				}
				m := row
				m.Mode, m.Calls = mode, calls
				if err != nil {
					m.Error = err.Error()
					r.rep.fail("checks", name+" "+mode, "%v", err)
				}
				if m.US, err = r.slowest(us, err); err != nil {
					return err
				}
				m.AlgGBps, m.BusGBps = bandwidth(k, W, size, m.US)
				r.rows = append(r.rows, m)
			}
			r.rep.ok("checks", name, "ran %s; output exact against the reference before and after timing", chosen)
		}
	}
	return nil
}
