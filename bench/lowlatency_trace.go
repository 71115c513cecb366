package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/lowlatency"
)

// `ep-bench lowlatency --trace`: the kernels compiled with their phase
// trace (internal/kernelflags, GOEP_LL_TRACE=1), and after the timings,
// per (tokens, format), one traced dispatch and combine (issued plainly,
// then from a graph replay) whose per-block phase stamps are read back and
// summarised: where the time of a call goes, phase by phase.

// llTraceWarmups are the untraced calls before each traced one (warm
// caches, TLBs, the peers' first-touch costs).
const llTraceWarmups = 3

// llTraceNote is printed when the trace build is on.
const llTraceNote = "kernels compiled with the phase trace (" + kernelflags.EnvLLTrace + "=1): thread 0 of every block " +
	"stamps the GPU timer at each phase point; timings include those stamps (measurement only)"

// applyLLTrace turns the trace build on for --trace (whatever
// $GOEP_LL_TRACE says, which is then only checked for a valid value), else
// follows $GOEP_LL_TRACE; before any kernel is compiled. It reports whether
// the build is traced.
func applyLLTrace(flag bool) (bool, error) {
	on, err := kernelflags.LLTraceEnv()
	if err != nil {
		return false, err
	}
	if flag {
		on = true
	}
	if err := kernelflags.SetLLTrace(on); err != nil {
		return false, err
	}
	return on, nil
}

// llTraced is one rank's trace of one call.
type llTraced struct {
	tokens int
	format ep.LLFormat
	graph  bool
	trace  lowlatency.Trace
}

// traceShape issues llTraceWarmups dispatch+combine pairs, then one
// traced pair, reads this rank's trace, and (with --graph, unless ranks
// share a GPU) the same from a captured pair's replays. Every rank issues
// the same calls in lockstep (pace).
func (r *llRank) traceShape(t int, f ep.LLFormat) error {
	sh := r.shapes[[2]int{t, int(f)}]
	pair := func() error {
		res, err := r.buf.Dispatch(sh.dargs)
		if err != nil {
			return err
		}
		_, err = r.buf.Combine(ep.LLCombineArgs{Handle: res.Handle, Y: sh.y, Out: sh.out})
		return err
	}
	read := func(graph bool, issue func() error) error {
		for i := 0; i <= llTraceWarmups; i++ {
			if err := issue(); err != nil {
				return err
			}
			if err := r.pace(); err != nil {
				return err
			}
		}
		if err := r.buf.Stream().Synchronize(); err != nil {
			return err
		}
		if err := r.buf.Check(); err != nil {
			return err
		}
		raw, err := r.buf.PhaseTrace()
		if err != nil {
			return err
		}
		tr, err := lowlatency.ParseTrace(raw)
		if err != nil {
			return fmt.Errorf("rank %d: %w", r.rank, err)
		}
		if len(tr.Dispatch.Latest()) == 0 || len(tr.Combine.Latest()) == 0 {
			return fmt.Errorf("rank %d: the phase trace is empty: were the kernels compiled before --trace took effect?", r.rank)
		}
		r.traces = append(r.traces, llTraced{tokens: t, format: f, graph: graph, trace: tr})
		return nil
	}
	if err := read(false, pair); err != nil {
		return err
	}
	if !r.o.graph || r.o.shared {
		return nil
	}
	st := r.buf.Stream()
	g, err := r.dev.Capture(st, pair)
	if err != nil {
		return err
	}
	err = read(true, func() error { return g.Launch(st) })
	if cerr := g.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeLLTraces prints, per traced call, rank 0's and the slowest rank's
// phase tables and the spread of the ranks' entry stamps.
func writeLLTraces(w io.Writer, kind device.Kind, shared bool, ranks []*llRank) error {
	if len(ranks) == 0 || ranks[0] == nil || len(ranks[0].traces) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nphase trace (one call after warm-ups; us after the rank's earliest block entry of that kernel;"+
		" each stamp taken by a block's thread 0 after the barrier that ends the phase):")
	for i := range ranks[0].traces {
		calls := make([]llTraced, 0, len(ranks))
		for _, r := range ranks {
			if r == nil || i >= len(r.traces) {
				return fmt.Errorf("trace: rank traces differ in number")
			}
			calls = append(calls, r.traces[i])
		}
		c := calls[0]
		mode := "plain"
		if c.graph {
			mode = "graph replay"
		}
		for _, k := range []struct {
			name string
			get  func(lowlatency.Trace) lowlatency.KernelTrace
		}{
			{"dispatch", func(t lowlatency.Trace) lowlatency.KernelTrace { return t.Dispatch }},
			{"combine", func(t lowlatency.Trace) lowlatency.KernelTrace { return t.Combine }},
		} {
			slow, span := 0, -1.0
			bases := make([]uint64, len(calls))
			for r, cl := range calls {
				kt := k.get(cl.trace)
				bases[r] = kt.Base()
				if s := kt.Span(); s > span {
					slow, span = r, s
				}
			}
			fmt.Fprintf(w, "\nT=%d %s %s, %s: span (first entry to last stamp) rank 0 %.2f us, slowest rank %d %.2f us\n",
				c.tokens, c.format, mode, k.name, k.get(calls[0].trace).Span(), slow, span)
			fmt.Fprintf(w, "  entry spread across ranks: %s\n", entrySpread(bases, kind, shared))
			shown := []int{0}
			if slow != 0 {
				shown = append(shown, slow)
			}
			for _, r := range shown {
				if err := writeKernelTrace(w, r, k.get(calls[r].trace)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// entrySpread is max - min of the ranks' earliest entry stamps, with what
// it means: GPUs' global timers are not calibrated against each other.
func entrySpread(bases []uint64, kind device.Kind, shared bool) string {
	lo, hi := bases[0], bases[0]
	for _, b := range bases {
		lo, hi = min(lo, b), max(hi, b)
	}
	rel := make([]string, len(bases))
	for r, b := range bases {
		rel[r] = fmt.Sprintf("r%d %+.2f", r, float64(int64(b-lo))/1e3)
	}
	note := "the GPUs' global timers are not calibrated against each other: the spread includes their clock offsets"
	if shared {
		note = "ranks sharing a GPU share its timer; across GPUs the clocks are not calibrated against each other"
	}
	if kind != device.CUDA {
		note = "not a GPU: host clock"
	}
	return fmt.Sprintf("%.2f us (%s; %s)", float64(int64(hi-lo))/1e3, strings.Join(rel, ", "), note)
}

func writeKernelTrace(w io.Writer, rank int, kt lowlatency.KernelTrace) error {
	latest := kt.Latest()
	send, recv := make([]float64, len(latest)), make([]float64, len(latest))
	for i, b := range latest {
		send[i], recv[i] = float64(b.SendWork), float64(b.RecvWork)
	}
	fmt.Fprintf(w, "  rank %d, %d blocks; work a block (min/median/max): send units %s, receive %s %s\n", rank, len(latest),
		mmm(send), map[string]string{lowlatency.KernelDispatch: "rows", lowlatency.KernelCombine: "units"}[kt.Kernel], mmm(recv))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  event\tblocks\tmin us\tmedian us\tmax us\t")
	for _, s := range kt.Summary() {
		fmt.Fprintf(tw, "  %s\t%d\t%.2f\t%.2f\t%.2f\t\n", s.Event, s.Blocks, s.Min, s.Median, s.Max)
	}
	return tw.Flush()
}

// mmm is "min/median/max" of v.
func mmm(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	return fmt.Sprintf("%g/%g/%g", s[0], (s[(n-1)/2]+s[n/2])/2, s[n-1])
}
