package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

func init() {
	register("layout", "check the dispatch layout kernel against the reference, then time it", runLayout)
}

// layoutOpts are the flags of ep-bench layout.
type layoutOpts struct {
	tokens                 []int
	shape                  routing.Shape // Tokens unset
	int32                  bool
	masked                 int
	seed                   uint64
	warmup, iters          int
	graphLaunches, replays int
	flushMiB               int
	cfg                    routing.LayoutConfig
	targetUS               float64
	backend, jsonPath      string
	gpu                    int
}

// layoutResult is one row of the table and of the JSON report.
type layoutResult struct {
	Backend string `json:"backend"`
	Device  string `json:"device"`
	routing.Shape
	Dtype  string `json:"dtype"`
	Grid   string `json:"grid"`
	Check  string `json:"check"`
	Warmup int    `json:"warmup"`
	// Per-launch timing: each launch between its own pair of events, issued
	// back to back (DeepEP's bench); the first is dropped.
	Iters  int     `json:"iters"`
	MeanUS float64 `json:"mean_us"`
	MinUS  float64 `json:"min_us"`
	MedUS  float64 `json:"median_us"`
	MaxUS  float64 `json:"max_us"`
	// Graph timing: GraphLaunches launches captured once, replayed Replays
	// times between two events; GraphUS is the time per launch.
	GraphLaunches int     `json:"graph_launches"`
	Replays       int     `json:"replays"`
	GraphUS       float64 `json:"graph_us_per_launch"`
}

func runLayout(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("layout", stderr)
	var o layoutOpts
	fs.StringVar(&o.backend, "backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	fs.IntVar(&o.gpu, "gpu", 0, "GPU ordinal (cuda backend)")
	tokens := fs.String("tokens", "4096", "tokens per rank, a comma-separated list")
	fs.IntVar(&o.shape.K, "topk", 8, "experts per token")
	fs.IntVar(&o.shape.Experts, "experts", 256, "experts in all")
	fs.IntVar(&o.shape.Ranks, "ranks", 8, "ranks the experts are spread over")
	fs.BoolVar(&o.int32, "int32", false, "topk_idx as int32 (default int64, as torch.topk returns)")
	fs.IntVar(&o.masked, "masked", 0, "random (token, slot) entries set to -1")
	fs.Uint64Var(&o.seed, "seed", 1, "routing seed")
	fs.IntVar(&o.warmup, "warmup", 50, "untimed launches first")
	fs.IntVar(&o.iters, "iters", 200, "launches timed one by one, each between two events")
	fs.IntVar(&o.graphLaunches, "graph-launches", 100, "launches captured in one graph (0: no graph timing)")
	fs.IntVar(&o.replays, "replays", 20, "graph replays timed")
	fs.IntVar(&o.flushMiB, "flush-mib", 256, "MiB zeroed to flush L2 after the warm-up, as DeepEP's bench does (0: none)")
	fs.IntVar(&o.cfg.Threads, "threads", 0, "threads per block (0: the library's default)")
	fs.IntVar(&o.cfg.MaxBlocks, "max-blocks", 0, "cap on blocks (0: the SM count)")
	fs.Float64Var(&o.targetUS, "target-us", 15, "say whether the mean per-launch time meets this")
	fs.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if o.tokens, err = parseIntList(*tokens); err != nil {
		return fmt.Errorf("--tokens: %w", err)
	}
	if o.iters < 2 || o.warmup < 0 || o.graphLaunches < 0 || o.replays < 1 || o.flushMiB < 0 || o.masked < 0 {
		return errors.New("want --iters >= 2, --replays >= 1 and non-negative --warmup, --graph-launches, --flush-mib, --masked")
	}
	if o.cfg.MaxBlocks < 0 {
		return fmt.Errorf("--max-blocks %d: want 0 (the SM count) or more", o.cfg.MaxBlocks)
	}
	for _, t := range o.tokens {
		s := o.shape
		s.Tokens = t
		if err := s.Validate(); err != nil {
			return err
		}
		if _, err := routing.PlanLayout(s, 0, o.cfg); err != nil {
			return fmt.Errorf("--threads: %w", err)
		}
	}
	if err := checkMasked(o.masked, o.shape.K, o.tokens); err != nil {
		return err
	}
	if err := checkOutput("json", o.jsonPath); err != nil {
		return err
	}
	kind, _, err := device.ParseKind(o.backend)
	if err != nil {
		return err
	}
	dev, err := device.Open(kind, o.gpu)
	if err != nil {
		return err
	}
	defer dev.Close()
	st, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer st.Close()

	info := dev.Info()
	devName := fmt.Sprintf("%s:%d", info.Kind, info.Ordinal)
	if info.Kind == device.CUDA {
		devName += fmt.Sprintf(" (%s, %d SMs)", info.Name, info.SMs)
	}
	fmt.Fprintf(stdout, "layout kernel on %s: K=%d E=%d R=%d %s; %d warm-ups, L2 flush %d MiB, %d launches each between events (first dropped), graph %d launches x %d replays\n",
		devName, o.shape.K, o.shape.Experts, o.shape.Ranks, dtypeName(o.int32), o.warmup, o.flushMiB, o.iters, o.graphLaunches, o.replays)

	var flush device.Buffer
	if o.flushMiB > 0 {
		if flush, err = dev.Alloc(o.flushMiB << 20); err != nil {
			return fmt.Errorf("L2 flush buffer: %w", err)
		}
		defer dev.Free(flush)
	}
	var results []layoutResult
	var errs []error
	prog := newProgress(stderr)
	for i, t := range o.tokens {
		if err := interrupted(ctx); err != nil {
			return err
		}
		prog.printf("T=%d (%d/%d): checking, then timing", t, i+1, len(o.tokens))
		res, err := layoutOne(dev, st, flush, o, t)
		res.Backend, res.Device = string(info.Kind), devName
		if err != nil {
			errs = append(errs, fmt.Errorf("T=%d: %w", t, err))
			res.Check = "FAIL"
		}
		results = append(results, res)
	}
	printLayout(stdout, results, o)
	if err := writeJSON(o.jsonPath, map[string]any{"layout": results}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func dtypeName(as32 bool) string {
	if as32 {
		return "int32"
	}
	return "int64"
}

// layoutOne checks the kernel on one routing, then times it.
func layoutOne(dev device.Device, st device.Stream, flush device.Buffer, o layoutOpts, tokens int) (layoutResult, error) {
	s := o.shape
	s.Tokens = tokens
	res := layoutResult{Shape: s, Dtype: dtypeName(o.int32), Warmup: o.warmup, Iters: o.iters - 1}
	plan, err := routing.PlanLayout(s, dev.Info().SMs, o.cfg)
	if err != nil {
		return res, err
	}
	res.Grid = plan.String()
	r, err := routing.Generate(s, routing.GenOptions{Seed: o.seed, Masked: o.masked})
	if err != nil {
		return res, err
	}
	want, err := r.Layout()
	if err != nil {
		return res, err
	}
	buf, in, err := routing.Upload(dev, r, o.int32)
	if err != nil {
		return res, err
	}
	defer dev.Free(buf)
	dl, err := routing.NewDeviceLayout(dev, s)
	if err != nil {
		return res, err
	}
	defer dl.Close()
	launch := func() error { return dl.Launch(st, in, o.cfg) }

	check := func(when string) error {
		if err := st.Synchronize(); err != nil {
			return err
		}
		got, invalid, err := dl.Read()
		if err != nil {
			return err
		}
		if err := want.Diff(got); err != nil {
			return fmt.Errorf("%s: %w", when, err)
		}
		if invalid != 0 {
			return fmt.Errorf("%s: kernel counted %d invalid entries in a valid routing", when, invalid)
		}
		return nil
	}
	if err := dl.Poison(0xA5); err != nil {
		return res, err
	}
	if err := launch(); err != nil {
		return res, err
	}
	if err := check("first launch"); err != nil {
		return res, err
	}
	res.Check = "ok"

	for i := 0; i < o.warmup; i++ {
		if err := launch(); err != nil {
			return res, err
		}
	}
	if flush.Size > 0 {
		if err := dev.MemsetAsync(flush.Ptr, 0, flush.Size, st); err != nil {
			return res, err
		}
	}
	times, err := timeEach(dev, st, o.iters, launch)
	if err != nil {
		return res, err
	}
	times = times[1:]
	res.MeanUS, res.MinUS, res.MedUS, res.MaxUS = stats(times)
	if err := check("after the timed launches"); err != nil {
		return res, err
	}

	if o.graphLaunches > 0 {
		per, err := timeGraph(dev, st, o.graphLaunches, o.replays, launch)
		if err != nil {
			return res, fmt.Errorf("graph: %w", err)
		}
		res.GraphLaunches, res.Replays, res.GraphUS = o.graphLaunches, o.replays, per
		if err := dl.Poison(0x5A); err != nil {
			return res, err
		}
		if err := launch(); err != nil {
			return res, err
		}
		if err := check("after the graph replays"); err != nil {
			return res, err
		}
	}
	return res, nil
}

// timeEach issues n launches back to back, each between its own two events,
// and returns each launch's time in microseconds.
func timeEach(dev device.Device, st device.Stream, n int, launch func() error) ([]float64, error) {
	evs := make([]device.Event, 2*n)
	defer func() {
		for _, e := range evs {
			if e != nil {
				e.Close()
			}
		}
	}()
	for i := range evs {
		e, err := dev.NewEvent()
		if err != nil {
			return nil, err
		}
		evs[i] = e
	}
	for i := 0; i < n; i++ {
		if err := evs[2*i].Record(st); err != nil {
			return nil, err
		}
		if err := launch(); err != nil {
			return nil, err
		}
		if err := evs[2*i+1].Record(st); err != nil {
			return nil, err
		}
	}
	if err := evs[2*n-1].Synchronize(); err != nil {
		return nil, err
	}
	out := make([]float64, n)
	for i := range out {
		el, err := dev.Elapsed(evs[2*i], evs[2*i+1])
		if err != nil {
			return nil, err
		}
		out[i] = float64(el) / float64(time.Microsecond)
	}
	return out, nil
}

// timeGraph captures perGraph launches into a graph, replays it twice to
// warm up, then times replays back to back; it returns microseconds per
// launch.
func timeGraph(dev device.Device, st device.Stream, perGraph, replays int, launch func() error) (float64, error) {
	g, err := dev.Capture(st, func() error {
		for i := 0; i < perGraph; i++ {
			if err := launch(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	defer g.Close()
	for i := 0; i < 2; i++ {
		if err := g.Launch(st); err != nil {
			return 0, err
		}
	}
	times, err := timeEach(dev, st, 1, func() error {
		for i := 0; i < replays; i++ {
			if err := g.Launch(st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return times[0] / float64(perGraph*replays), nil
}

// stats returns mean, min, median and max.
func stats(v []float64) (mean, lo, med, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	for _, x := range s {
		mean += x
	}
	return mean / float64(len(s)), s[0], s[len(s)/2], s[len(s)-1]
}

func printLayout(w io.Writer, results []layoutResult, o layoutOpts) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tokens\tgrid\tcheck\tmean us\tmin us\tmedian us\tmax us\tgraph us/launch\t")
	for _, r := range results {
		graph := "-"
		if r.Replays > 0 {
			graph = fmt.Sprintf("%.2f", r.GraphUS)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", r.Tokens, r.Grid, r.Check, r.MeanUS, r.MinUS, r.MedUS, r.MaxUS, graph)
	}
	tw.Flush()
	for _, r := range results {
		if r.Backend == string(device.CUDA) && r.Check == "ok" {
			verdict := "meets"
			if r.MeanUS > o.targetUS {
				verdict = "MISSES"
			}
			fmt.Fprintf(w, "T=%d: mean %.2f us %s the %.0f us target (DeepEP V1 on H200: 40 us at T=4096)\n", r.Tokens, r.MeanUS, verdict, o.targetUS)
		}
	}
}

// parseIntList parses "4096" or "128,512,4096".
func parseIntList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: want integers separated by commas", s)
		}
		out = append(out, n)
	}
	return out, nil
}
