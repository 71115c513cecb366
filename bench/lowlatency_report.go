package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
)

// llFigure is one timing: rank 0's mean GPU time per call by
// llTimingRules, min and max over ranks beside.
type llFigure struct {
	Tokens int     `json:"tokens"`
	Format string  `json:"format"`
	Op     string  `json:"op"` // dispatch, combine, dispatch+combine; "dispatch x8": per-call mean of 8 in one graph (--burst)
	Graph  bool    `json:"graph"`
	US     float64 `json:"us"`
	MinUS  float64 `json:"min_us"`
	MaxUS  float64 `json:"max_us"`
}

func (f llFigure) mode() string {
	if f.Graph {
		return "graph"
	}
	return "plain"
}

// llReport is what --json writes.
type llReport struct {
	Command   string     `json:"command"`
	Backend   string     `json:"backend"`
	Ranks     int        `json:"ranks"`
	Nodes     int        `json:"nodes,omitempty"` // virtual nodes (port channels between them); 0: one node
	MaxTokens int        `json:"max_tokens"`
	Hidden    int        `json:"hidden"`
	TopK      int        `json:"topk"`
	Experts   int        `json:"experts"`
	Seed      uint64     `json:"seed"`
	Warmup    int        `json:"warmup"`
	Iters     int        `json:"iters"`
	FlushMiB  int        `json:"flush_mib"`
	Timing    string     `json:"timing"`
	Note      string     `json:"note,omitempty"` // ranks share GPUs: not NVLink figures
	Checks    []check    `json:"checks"`
	Figures   []llFigure `json:"figures"`
}

// llTimingRules says how the figures are taken: DeepEP's rules
// (shared/reference/deepep-v1.md: warm-ups, one L2 flush, the mean of the
// last N-1 of N back-to-back calls each between its own two events, local
// rank 0's own figure), and where ranks share a GPU what differs.
func llTimingRules(o llOpts) string {
	s := fmt.Sprintf("DeepEP's timing rules: %d warm-ups, L2 flush %d MiB, then the mean of the last %d of %d back-to-back calls, "+
		"each between its own two events; rank 0's own figure (min..max over ranks beside); combine = a combine after an "+
		"untimed dispatch outside the events; graph = the call captured once in a CUDA graph and replayed (graph combine after "+
		"an untimed dispatch replay)", o.warmup, o.flushMiB, o.iters-1, o.iters)
	if o.graph && o.burst > 0 && !o.shared {
		s += fmt.Sprintf("; \"x%d\" = %d calls captured back to back in one graph, the replay's time divided by %d (no host "+
			"pacing between them: no launch skew between ranks)", o.burst, o.burst, o.burst)
	}
	s += "; every rank issues a call before any issues the next (host-side pacing, outside the events)"
	switch {
	case o.shared:
		s += "; ranks share a GPU, so each call is also synchronised before the next is issued, and the figures are not NVLink figures"
	case o.kind == device.Host:
		s += "; host backend: a graph replay issues the calls again, and the figures only show that timing works"
	}
	return s
}

func newLLReport(o llOpts, n int, note string, ranks []*llRank) *llReport {
	rep := &llReport{Command: "lowlatency", Backend: string(o.kind), Ranks: n, Nodes: o.nodes, MaxTokens: o.config().MaxTokens, Hidden: o.hidden,
		TopK: o.topk, Experts: o.experts, Seed: o.seed, Warmup: o.warmup, Iters: o.iters, FlushMiB: o.flushMiB,
		Timing: llTimingRules(o), Note: note}
	if ranks[0] != nil {
		rep.Checks = ranks[0].rep.Checks
		rep.Figures = append(rep.Figures, ranks[0].figs...)
	}
	for r := 1; r < n; r++ {
		if ranks[r] == nil {
			continue
		}
		for _, c := range ranks[r].rep.Checks {
			if c.Status == "fail" {
				c.Name = fmt.Sprintf("%s (rank %d)", c.Name, r)
				rep.Checks = append(rep.Checks, c)
			}
		}
	}
	for i := range rep.Figures {
		f := &rep.Figures[i]
		f.MinUS, f.MaxUS = f.US, f.US
		for _, lr := range ranks[1:] {
			// Every rank times the same calls in the same order.
			if lr != nil && i < len(lr.figs) {
				f.MinUS, f.MaxUS = min(f.MinUS, lr.figs[i].US), max(f.MaxUS, lr.figs[i].US)
			}
		}
	}
	return rep
}

// llGoals are issue 15's goals (EP8, 128 tokens, hidden 7168, top-8 of
// 256 experts, one GPU a rank), in us.
var llGoals = map[string]float64{"dispatch bf16": 25, "dispatch fp8": 20, "combine bf16": 30, "combine fp8": 30,
	"dispatch ue8m0": 20, "combine ue8m0": 30}

func (rep *llReport) goal(o llOpts, f llFigure) string {
	if o.kind != device.CUDA || o.shared || o.nodes > 1 || rep.Ranks != 8 || f.Tokens != 128 || o.hidden != 7168 || o.topk != 8 || o.experts != 256 {
		return "-"
	}
	if g, ok := llGoals[f.Op+" "+f.Format]; ok {
		return fmt.Sprintf("<= %.0f", g)
	}
	return "-"
}

// write prints the checks, then the timings, and writes --json and --plot.
func (rep *llReport) write(w io.Writer, o llOpts) error {
	nodes := ""
	if rep.Nodes > 1 {
		nodes = fmt.Sprintf(" in %d virtual nodes (port channels between them)", rep.Nodes)
	}
	fmt.Fprintf(w, "lowlatency: %d ranks (goroutines)%s, %s backend; MaxTokens %d, hidden %d, top-%d of %d experts, "+
		"routing %d distinct random experts per token (seed %d); formats %s\n",
		rep.Ranks, nodes, rep.Backend, rep.MaxTokens, o.hidden, o.topk, o.experts, o.topk, o.seed, llFormatNames(o.formats))
	fmt.Fprintln(w, "CHECKS (every rank against the reference; rank 0's lines, other ranks' failures)")
	(&report{Checks: rep.Checks}).print(w)
	if len(rep.Figures) > 0 {
		fmt.Fprintln(w, "TIMINGS:", rep.Timing)
		if rep.Note != "" {
			fmt.Fprintln(w, "note:", rep.Note)
		}
		figs := append([]llFigure(nil), rep.Figures...)
		sort.SliceStable(figs, func(i, j int) bool { return figs[i].Tokens < figs[j].Tokens })
		tw := newTable(w)
		fmt.Fprintln(tw, "tokens\tformat\top\tmode\tus\tmin..max us\tgoal us\t")
		for _, f := range figs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1f\t%.1f..%.1f\t%s\t\n", f.Tokens, f.Format, f.Op, f.mode(), f.US, f.MinUS, f.MaxUS,
				rep.goal(o, f))
		}
		tw.Flush()
	}
	if err := writeJSON(o.jsonPath, rep); err != nil {
		return err
	}
	if o.plotPrefix != "" {
		if err := plotLowLatency(o.plotPrefix, rep); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		fmt.Fprintf(w, "plot: %s.png, %s.svg\n", o.plotPrefix, o.plotPrefix)
	}
	return nil
}

func llFormatNames(fs []ep.LLFormat) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.String()
	}
	return strings.Join(names, ", ")
}

// positiveSet is the distinct positive values of v.
func positiveSet(v []int) map[int]bool {
	s := map[int]bool{}
	for _, x := range v {
		if x > 0 {
			s[x] = true
		}
	}
	return s
}

// plotLowLatency draws us per call (rank 0's) against tokens per rank, one
// line per (format, op, mode), as prefix.png and prefix.svg.
func plotLowLatency(prefix string, rep *llReport) error {
	var ls lineSet
	tokens := map[int]bool{}
	for _, f := range rep.Figures {
		if f.Tokens <= 0 || f.US <= 0 {
			continue
		}
		tokens[f.Tokens] = true
		ls.add(fmt.Sprintf("%s %s (%s)", f.Format, f.Op, f.mode()), float64(f.Tokens), f.US)
	}
	if len(tokens) < 2 {
		return fmt.Errorf("a plot needs figures at two positive token counts at least (have %d)", len(tokens))
	}
	title := fmt.Sprintf("goep low-latency, %d ranks, %s: hidden %d, top-%d of %d experts", rep.Ranks, rep.Backend, rep.Hidden,
		rep.TopK, rep.Experts)
	if rep.Note != "" {
		title += " (ranks share GPUs: not NVLink figures)"
	}
	p, err := tokensPlot(title, "us per call (rank 0, DeepEP's timing rules)", &ls, tokens)
	if err != nil {
		return err
	}
	return savePlot(p, prefix)
}
