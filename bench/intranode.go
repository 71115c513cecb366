package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

func init() {
	register("intranode", "check intranode dispatch/combine through the ep API against the reference, then time them as DeepEP's test does (--tune: sweep launch parameters)", runIntranode)
}

// inOpts are the flags of `ep-bench intranode`.
type inOpts struct {
	kind                  device.Kind
	tokens                []int
	hidden, topk, experts int
	masked                int
	seed                  uint64
	fp8, graph            bool
	sms                   []int // 0: the Buffer's default
	dispatchThreads       int
	copyMode              ep.CopyMode
	combineThreads        int
	warmup, iters         int
	flushMiB              int
	tune                  bool
	tuneSMs               []int
	tuneWarmup, tuneIters int
	ranks                 int
	timeout               time.Duration
	jsonPath, plotPrefix  string
	progress              io.Writer
}

func runIntranode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("intranode", stderr)
	var o inOpts
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	tokens := fs.String("tokens", "4096", "tokens per rank, a comma-separated list (a sweep)")
	fs.IntVar(&o.hidden, "hidden", 7168, "hidden size")
	fs.IntVar(&o.topk, "topk", 8, "experts per token")
	fs.IntVar(&o.experts, "experts", 256, "experts in all")
	fs.IntVar(&o.masked, "masked", 0, "random (token, slot) entries set to -1")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the routing (top-k of |randn|+1 scores, as DeepEP's test) and the data")
	fs.BoolVar(&o.fp8, "fp8", false, "also dispatch FP8 rows (float32 scale per 128 elements)")
	fs.BoolVar(&o.graph, "graph", true, "also time the calls captured in a CUDA graph (worst-case mode) and replayed")
	sms := fs.String("sms", "", "SM counts for dispatch and combine, a comma-separated list (default: the library's per-rank-count default)")
	fs.IntVar(&o.dispatchThreads, "dispatch-threads", 0, "dispatch threads per block (0: the copy path's default)")
	copyMode := fs.String("copy", "default", "dispatch copy path: default, plain, wide or tma")
	fs.IntVar(&o.combineThreads, "combine-threads", 0, "combine threads per block (0: default)")
	fs.IntVar(&o.warmup, "warmup", 50, "untimed calls before the timed ones")
	fs.IntVar(&o.iters, "iters", 50, "timed calls, each between its own two events, back to back; the first is dropped")
	fs.IntVar(&o.flushMiB, "flush-mib", 256, "MiB zeroed to flush L2 after the warm-ups (0: none)")
	fs.BoolVar(&o.tune, "tune", false, "sweep SMs and threads per block for cached dispatch and combine and print the best per (ranks, op), instead of the timings")
	tuneSMs := fs.String("tune-sms", "8,12,16,20,24,28,32", "SM counts the tuning sweeps")
	fs.IntVar(&o.tuneWarmup, "tune-warmup", 10, "warm-ups per tuning point")
	fs.IntVar(&o.tuneIters, "tune-iters", 20, "timed calls per tuning point")
	fs.IntVar(&o.ranks, "ranks", 0, "goroutine ranks when run without a launcher (default: every GPU up to 8, or 4 host ranks)")
	fs.DurationVar(&o.timeout, "timeout", 0, "device-side wait timeout (default $GOEP_CHANNEL_TIMEOUT or 60s)")
	fs.StringVar(&o.jsonPath, "json", "", "also write checks and figures as JSON to this file (rank 0)")
	fs.StringVar(&o.plotPrefix, "plot", "", "write GB/s vs tokens as PREFIX.png and PREFIX.svg (with a --tokens sweep)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if o.kind, _, err = device.ParseKind(*backend); err != nil {
		return err
	}
	if o.tokens, err = parseIntList(*tokens); err != nil {
		return fmt.Errorf("--tokens: %w", err)
	}
	if o.copyMode, err = parseCopy(*copyMode); err != nil {
		return err
	}
	if *sms != "" {
		if o.sms, err = parseIntList(*sms); err != nil {
			return fmt.Errorf("--sms: %w", err)
		}
	} else {
		o.sms = []int{0}
	}
	if o.tuneSMs, err = parseIntList(*tuneSMs); err != nil {
		return fmt.Errorf("--tune-sms: %w", err)
	}
	for _, v := range append(append([]int{}, o.sms...), o.tuneSMs...) {
		if v < 0 {
			return fmt.Errorf("SM counts must be positive")
		}
	}
	for _, t := range o.tokens {
		if t < 0 {
			return fmt.Errorf("--tokens: %d is negative", t)
		}
	}
	if o.iters < 2 || o.warmup < 0 || o.flushMiB < 0 || o.masked < 0 || o.tuneIters < 2 || o.tuneWarmup < 0 || o.ranks < 0 {
		return errors.New("want --iters and --tune-iters >= 2 and non-negative --warmup, --tune-warmup, --flush-mib, --masked, --ranks")
	}
	if o.timeout < 0 {
		return errors.New("--timeout must be positive")
	}
	o.progress = stderr

	env, err := bootstrap.FromEnv()
	if err != nil {
		return fmt.Errorf("launcher environment: %w", err)
	}
	if env.Size > 1 {
		return intranodeProcess(ctx, env, o, stdout)
	}
	return intranodeGoroutines(ctx, o, stdout)
}

// config is the Buffer configuration for ranks ranks.
func (o inOpts) config(ranks int) ep.Config {
	mt := 1
	for _, t := range o.tokens {
		mt = max(mt, t)
	}
	return ep.Config{MaxTokens: mt, Hidden: o.hidden, TopK: o.topk, Experts: o.experts, FP8: o.fp8, Handles: 6,
		Timeout: o.timeout, Dispatch: ep.LaunchConfig{Threads: o.dispatchThreads, Copy: o.copyMode},
		Combine: ep.LaunchConfig{Threads: o.combineThreads}}
}

func parseCopy(s string) (ep.CopyMode, error) {
	for _, m := range append([]ep.CopyMode{ep.CopyDefault}, ep.CopyModes...) {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("--copy %q: want default, plain, wide or tma", s)
}

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
	n := o.ranks
	if n == 0 {
		n = 4
		if o.kind == device.CUDA {
			gpus, err := device.CUDADeviceCount()
			if err != nil {
				return err
			}
			n = min(gpus, 8)
		}
	}
	if _, err := ep.SizeHints(o.config(n), n); err != nil {
		return err
	}
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	if err != nil {
		return err
	}
	cache := &inputCache{o: o, ranks: n}
	outs := make([]inOutcome, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer boots[r].Close()
			dev, err := device.Open(o.kind, r)
			if err != nil {
				outs[r].Err = err.Error()
				_ = boots[r].Close() // the others fail fast
				return
			}
			defer dev.Close()
			outs[r] = intranodeRank(ctx, boots[r], dev, o, cache, r == 0)
			if outs[r].Err != "" {
				_ = boots[r].Close()
			}
		}()
	}
	wg.Wait()
	return reportIntranode(stdout, o, n, "goroutines", outs)
}

// intranodeProcess runs this process's rank of a launched job (one GPU per
// process, like DeepEP's test).
func intranodeProcess(ctx context.Context, env bootstrap.EnvInfo, o inOpts, stdout io.Writer) (err error) {
	if o.kind == device.Host {
		return fmt.Errorf("the host backend shares memory between goroutine ranks of one process only; run `ep-bench intranode --backend host` without a launcher")
	}
	if _, err := ep.SizeHints(o.config(env.Size), env.Size); err != nil {
		return err
	}
	bs, err := bootstrap.ConnectFromEnv(ctx, env, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, bs.Close()) }()
	dev, err := device.Open(o.kind, env.LocalRank)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	mine := intranodeRank(ctx, bs, dev, o, &inputCache{o: o, ranks: env.Size}, env.Rank == 0)
	outs, root, err := gatherOutcomes(ctx, bs, stdout, mine)
	if !root || err != nil {
		return err
	}
	return reportIntranode(stdout, o, env.Size, "processes", outs)
}

// inRow is one line of the table and of the JSON report: rank 0's figure
// and the spread over ranks.
type inRow struct {
	inKey
	US      float64 `json:"us"`
	GBps    float64 `json:"gbps,omitempty"`
	WallUS  float64 `json:"wall_us,omitempty"`
	MinUS   float64 `json:"min_us"`
	MaxUS   float64 `json:"max_us"`
	MinGBps float64 `json:"min_gbps,omitempty"`
	MaxGBps float64 `json:"max_gbps,omitempty"`
	Bytes   int64   `json:"bytes"`
	Recv    int     `json:"recv_rows"`
}

// inReport is what --json writes.
type inReport struct {
	Ranks   int       `json:"ranks"`
	As      string    `json:"ranks_as"`
	Backend string    `json:"backend"`
	Device  string    `json:"device"`
	SMs     int       `json:"device_sms"`
	Hidden  int       `json:"hidden"`
	TopK    int       `json:"topk"`
	Experts int       `json:"experts"`
	Masked  int       `json:"masked"`
	Seed    uint64    `json:"seed"`
	Warmup  int       `json:"warmup"`
	Iters   int       `json:"iters"`
	Flush   int       `json:"flush_mib"`
	Memory  ep.Memory `json:"buffer_memory"`
	Checks  []check   `json:"checks"`
	Rows    []inRow   `json:"results"`
	Tuning  []inRow   `json:"tuning,omitempty"`
	Best    []inRow   `json:"best,omitempty"`
	Errors  []string  `json:"errors,omitempty"`
	wsBytes int
}

// rows merges every rank's figures: rank 0's value, min and max over ranks.
func mergeFigures(outs []inOutcome, tuning bool) []inRow {
	var keys []inKey
	byKey := map[inKey][]inFigure{}
	for r, oc := range outs {
		for _, f := range oc.Figures {
			if f.Tuning != tuning {
				continue
			}
			if _, ok := byKey[f.Key]; !ok && r == 0 {
				keys = append(keys, f.Key)
			}
			byKey[f.Key] = append(byKey[f.Key], f)
		}
	}
	rows := make([]inRow, 0, len(keys))
	for _, k := range keys {
		fs := byKey[k]
		r0 := fs[0]
		row := inRow{inKey: k, US: r0.US, WallUS: r0.WallUS, MinUS: r0.US, MaxUS: r0.US, Bytes: r0.Bytes, Recv: r0.Recv}
		gb := func(f inFigure) float64 {
			if f.Bytes == 0 || f.US <= 0 {
				return 0
			}
			return float64(f.Bytes) / f.US / 1e3
		}
		row.GBps, row.MinGBps, row.MaxGBps = gb(r0), gb(r0), gb(r0)
		for _, f := range fs[1:] {
			row.MinUS, row.MaxUS = min(row.MinUS, f.US), max(row.MaxUS, f.US)
			row.MinGBps, row.MaxGBps = min(row.MinGBps, gb(f)), max(row.MaxGBps, gb(f))
		}
		rows = append(rows, row)
	}
	return rows
}

// bestPoints picks, per (tokens, op, dtype), the launch whose slowest rank
// is fastest.
func bestPoints(rows []inRow) []inRow {
	type group struct {
		tokens    int
		op, dtype string
	}
	best := map[group]inRow{}
	var order []group
	for _, r := range rows {
		g := group{r.Tokens, r.Op, r.Dtype}
		b, ok := best[g]
		if !ok {
			order = append(order, g)
		}
		if !ok || r.MaxUS < b.MaxUS {
			best[g] = r
		}
	}
	out := make([]inRow, len(order))
	for i, g := range order {
		out[i] = best[g]
	}
	return out
}

func reportIntranode(stdout io.Writer, o inOpts, n int, as string, outs []inOutcome) error {
	rep := inReport{Ranks: n, As: as, Backend: string(o.kind), Device: outs[0].Device, SMs: outs[0].SMs, Hidden: o.hidden,
		TopK: o.topk, Experts: o.experts, Masked: o.masked, Seed: o.seed, Warmup: o.warmup, Iters: o.iters, Flush: o.flushMiB,
		Checks: outs[0].Checks, Memory: outs[0].Memory, wsBytes: outs[0].WSBytes}
	for r, oc := range outs {
		if oc.Err != "" {
			rep.Errors = append(rep.Errors, fmt.Sprintf("rank %d: %s", r, oc.Err))
		}
	}
	rep.Rows = mergeFigures(outs, false)
	rep.Tuning = mergeFigures(outs, true)
	rep.Best = bestPoints(rep.Tuning)
	printIntranode(stdout, o, rep)
	var errs []error
	if o.jsonPath != "" {
		errs = append(errs, writeJSON(o.jsonPath, rep))
	}
	if o.plotPrefix != "" {
		if err := plotIntranode(o.plotPrefix, rep); err != nil {
			errs = append(errs, fmt.Errorf("plot: %w", err))
		} else if len(rep.Rows) > 0 {
			fmt.Fprintf(stdout, "plot: %s.png, %s.svg\n", o.plotPrefix, o.plotPrefix)
		}
	}
	if len(rep.Errors) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d ranks failed:\n  %s", len(rep.Errors), n, strings.Join(rep.Errors, "\n  ")))
	}
	return errors.Join(errs...)
}

// deepEPAnchors are DeepEP V1's intranode figures on 8x H200 (hidden 7168,
// top-8 of 256, 24 SMs, best tuned chunk; shared/reference/anchors.md).
var deepEPAnchors = map[int]map[string]float64{ // tokens -> "op dtype" -> us
	128:  {"dispatch fp8": 62.0, "dispatch bf16": 59.2, "combine bf16": 79.1, "layout i64": 23},
	512:  {"dispatch fp8": 91.4, "dispatch bf16": 147.3, "combine bf16": 178.9, "layout i64": 27},
	4096: {"dispatch fp8": 499.7, "dispatch bf16": 935.0, "combine bf16": 966.3, "layout i64": 40},
	8192: {"dispatch fp8": 965.3, "dispatch bf16": 1816.4, "combine bf16": 1837.3},
}

func anchorFor(o inOpts, ranks int, r inRow) (float64, bool) {
	if o.kind != device.CUDA || ranks != 8 || o.hidden != 7168 || o.topk != 8 || o.experts != 256 {
		return 0, false
	}
	if r.Mode == "graph" || r.Mode == "full" || (r.Op != "layout" && r.SMs != 24) {
		return 0, false
	}
	us, ok := deepEPAnchors[r.Tokens][r.Op+" "+r.Dtype]
	return us, ok
}

func printIntranode(w io.Writer, o inOpts, rep inReport) {
	fmt.Fprintf(w, "intranode: %d ranks (%s), %s backend, %s (%d SMs); hidden %d, top-%d of %d experts, routing top-k of |randn|+1 (seed %d, %d masked)\n",
		rep.Ranks, rep.As, rep.Backend, rep.Device, rep.SMs, o.hidden, o.topk, o.experts, o.seed, o.masked)
	if o.tune {
		fmt.Fprintf(w, "tuning: %d warm-ups, L2 flush %d MiB, mean of the last %d of %d calls per point; best = fastest slowest rank\n",
			o.tuneWarmup, o.flushMiB, o.tuneIters-1, o.tuneIters)
	} else {
		fmt.Fprintf(w, "timing as DeepEP's test: %d warm-ups, L2 flush %d MiB, mean of the last %d of %d back-to-back calls each between two events; "+
			"bytes = received BF16 rows x hidden x 2 incl. self (FP8 x (1+4/128)/2; combine = BF16 dispatch bytes); figures are local rank 0's own, min..max over ranks beside\n",
			o.warmup, o.flushMiB, o.iters-1, o.iters)
	}
	if m := rep.Memory; m.Allocations > 0 {
		fmt.Fprintf(w, "buffer (rank 0, MaxTokens %d%s): NVLink workspace %.1f MiB; device memory %.1f MiB in %d allocations, host-mapped %.1f KiB\n",
			o.config(rep.Ranks).MaxTokens, map[bool]string{true: ", FP8", false: ""}[o.fp8], float64(rep.wsBytes)/(1<<20),
			float64(m.Device)/(1<<20), m.Allocations, float64(m.HostMapped)/1024)
	}
	(&report{Checks: rep.Checks}).print(w)
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "FAIL %s\n", e)
	}
	if len(rep.Rows) > 0 {
		fmt.Fprintln(w, "TIMINGS")
		printRows(w, o, rep.Ranks, rep.Rows)
	}
	if len(rep.Tuning) > 0 {
		fmt.Fprintln(w, "TUNING")
		printRows(w, o, rep.Ranks, rep.Tuning)
		fmt.Fprintf(w, "BEST per (ranks, op), by the slowest rank:\n")
		for _, b := range rep.Best {
			copyPath := ""
			if b.Copy != "" {
				copyPath = ", copy " + b.Copy
			}
			fmt.Fprintf(w, "  ranks=%d T=%d %s %s: %d SMs x %d threads%s: %.1f us (rank 0 %.1f us, %.1f GB/s)\n",
				rep.Ranks, b.Tokens, b.Op, b.Dtype, b.SMs, b.Threads, copyPath, b.MaxUS, b.US, b.GBps)
		}
	}
	if len(rep.Errors) == 0 {
		fmt.Fprintln(w, "intranode: all checks passed")
	}
}

func printRows(w io.Writer, o inOpts, ranks int, rows []inRow) {
	rows = append([]inRow(nil), rows...)
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Tokens < rows[j].Tokens })
	tw := newTable(w)
	fmt.Fprintln(tw, "tokens\top\tdtype\tmode\tcopy\tSMs\tthreads\trecv rows\tus\tGB/s\tmin..max us\tmin..max GB/s\thost us\tDeepEP V1 us\t")
	for _, r := range rows {
		gb, gbr := "-", "-"
		if r.Bytes > 0 {
			gb = fmt.Sprintf("%.1f", r.GBps)
			gbr = fmt.Sprintf("%.1f..%.1f", r.MinGBps, r.MaxGBps)
		}
		anchor := "-"
		if us, ok := anchorFor(o, ranks, r); ok {
			anchor = fmt.Sprintf("%.1f", us)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%.1f..%.1f\t%s\t%s\t%s\t\n", r.Tokens, r.Op, r.Dtype, r.Mode, dash(r.Copy != "", r.Copy),
			dash(r.SMs > 0, fmt.Sprint(r.SMs)), dash(r.Threads > 0, fmt.Sprint(r.Threads)), dash(r.Recv > 0 || r.Bytes > 0, fmt.Sprint(r.Recv)),
			r.US, gb, r.MinUS, r.MaxUS, gbr, dash(r.WallUS > 0, fmt.Sprintf("%.1f", r.WallUS)), anchor)
	}
	tw.Flush()
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
}

// inShared is every rank's input at one token count and the reference
// results, computed once per process (goroutine ranks share it; launched
// ranks each compute it from the same seed).
type inShared struct {
	tokens int
	shape  intranode.Shape
	in     []intranode.RankInput // BF16 rows with weights
	in8    []intranode.RankInput // the same routing with FP8 rows (--fp8)
	ref    []intranode.RankOutput
	ref8   []intranode.RankOutput
	comb   []intranode.CombineOutput // combine of the received rows with their weights
}

// inputCache holds the current token count's inputs.
type inputCache struct {
	o     inOpts
	ranks int
	mu    sync.Mutex
	cur   *inShared
	err   error
}

func (c *inputCache) get(tokens int) (*inShared, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.tokens == tokens {
		return c.cur, c.err
	}
	c.cur = nil // let the last one go first
	c.cur, c.err = prepareInputs(c.o, c.ranks, tokens)
	return c.cur, c.err
}

// prepareInputs draws every rank's routing (DeepEP's: top-k of |randn|+1),
// rows and weights from the seed, and computes the reference dispatch and
// combine (combine of the received rows, with their weights, as DeepEP's
// test checks it).
func prepareInputs(o inOpts, ranks, tokens int) (*inShared, error) {
	sh := &inShared{tokens: tokens, shape: intranode.Shape{Hidden: o.hidden, TopK: o.topk, Experts: o.experts, Ranks: ranks},
		in: make([]intranode.RankInput, ranks)}
	for r := range ranks {
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: o.topk, Experts: o.experts, Ranks: ranks},
			routing.GenOptions{Seed: o.seed*1000 + uint64(r), Masked: o.masked})
		if err != nil {
			return nil, err
		}
		rng := rand.New(rand.NewPCG(o.seed, uint64(r)))
		sh.in[r] = intranode.RankInput{TopK: rt.Idx, X: randomBF16(rng, tokens*o.hidden), Weights: randomF32(rng, tokens*o.topk)}
	}
	var err error
	if sh.ref, err = intranode.ReferenceDispatch(sh.shape, sh.in, 0); err != nil {
		return nil, err
	}
	cins := make([]intranode.CombineInput, ranks)
	toks := make([]int, ranks)
	for r := range ranks {
		cins[r] = intranode.CombineInput{Y: sh.ref[r].RecvX, Weights: sh.ref[r].RecvWeights}
		toks[r] = tokens
	}
	if sh.comb, err = intranode.ReferenceCombine(sh.shape, toks, sh.ref, cins); err != nil {
		return nil, err
	}
	if o.fp8 {
		sh.in8 = make([]intranode.RankInput, ranks)
		for r := range ranks {
			rng := rand.New(rand.NewPCG(o.seed+1, uint64(r)))
			q := make([]uint8, tokens*o.hidden)
			for i := 0; i < len(q); i += 8 {
				v := rng.Uint64()
				for j := i; j < min(i+8, len(q)); j++ {
					q[j] = uint8(v>>(8*(j-i))) & 0x7e // finite E4M3
				}
			}
			sh.in8[r] = intranode.RankInput{TopK: sh.in[r].TopK, XFP8: q, Scales: randomF32(rng, tokens*o.hidden/128)}
		}
		if sh.ref8, err = intranode.ReferenceDispatch(sh.shape, sh.in8, 0); err != nil {
			return nil, err
		}
	}
	return sh, nil
}

// randomBF16 draws BF16 values of either sign with magnitudes 2^-8..2^8,
// four per 64-bit draw.
func randomBF16(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	var bits uint64
	for i := range x {
		if i%4 == 0 {
			bits = rng.Uint64()
		}
		v := uint16(bits)
		bits >>= 16
		x[i] = v&0x8000 | (119+(v>>8)&15)<<7 | v&0x7f
	}
	return x
}

func randomF32(rng *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return w
}

func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
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
	if o.flushMiB > 0 {
		if r.flush, err = dev.Alloc(o.flushMiB << 20); err != nil {
			return out
		}
		defer dev.Free(r.flush)
	}
	defer r.freeAll()
	for i, t := range o.tokens {
		r.step = fmt.Sprintf("T=%d (%d/%d)", t, i+1, len(o.tokens))
		sh, gerr := cache.get(t)
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

func (r *inRank) progress(format string, a ...any) {
	if r.lead && (len(r.o.tokens) > 1 || len(r.o.sms) > 1 || r.o.tune) {
		fmt.Fprintf(r.o.progress, "progress: %s: %s\n", r.step, fmt.Sprintf(format, a...))
	}
}

// compare downloads len(want) bytes at p and compares them with want.
func (r *inRank) compare(what string, want []byte, p uintptr) error {
	if len(want) == 0 {
		return nil
	}
	got := make([]byte, len(want))
	if err := r.dev.CopyOut(got, p); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if bytes.Equal(got, want) {
		return nil
	}
	i, n := -1, 0
	for j := range want {
		if want[j] != got[j] {
			if i < 0 {
				i = j
			}
			n++
		}
	}
	return fmt.Errorf("rank %d: %s: %d of %d bytes differ from the reference, the first at byte %d (want %#02x, got %#02x)",
		r.rank, what, n, len(want), i, want[i], got[i])
}

// checkDispatch compares a dispatch's outputs with the reference, byte for
// byte.
func (r *inRank) checkDispatch(what string, res ep.DispatchResult, want intranode.RankOutput, fp8, nonCached bool) error {
	if err := r.st.Synchronize(); err != nil {
		return err
	}
	n := want.Received()
	if res.NumRecv != n {
		return fmt.Errorf("rank %d: %s: received %d rows, the reference %d", r.rank, what, res.NumRecv, n)
	}
	if nonCached && !equalInts(res.TokensPerExpert, want.TokensPerLocalExpert) {
		return fmt.Errorf("rank %d: %s: tokens per local expert %v, the reference %v", r.rank, what, res.TokensPerExpert, want.TokensPerLocalExpert)
	}
	type part struct {
		name string
		want []byte
		p    uintptr
	}
	checks := []part{
		{"rank prefix", asBytes(want.RankPrefix), res.RankPrefix.Ptr},
		{"top-k ids", asBytes(want.RecvTopK), res.RecvTopK.Ptr},
		{"source tokens", asBytes(want.RecvSrcToken), res.RecvSrcToken.Ptr},
	}
	if fp8 {
		checks = append(checks, part{"fp8 rows", asBytes(want.RecvXFP8), res.RecvX.Ptr},
			part{"scales", asBytes(want.RecvScales), res.RecvScales.Ptr})
	} else {
		checks = append(checks, part{"rows", asBytes(want.RecvX), res.RecvX.Ptr})
	}
	if res.RecvWeights.Present() {
		checks = append(checks, part{"weights", asBytes(want.RecvWeights), res.RecvWeights.Ptr})
	}
	for _, c := range checks {
		if err := r.compare(what+": "+c.name, c.want, c.p); err != nil {
			return err
		}
	}
	return nil
}

func (r *inRank) checkCombine(what string, res ep.CombineResult, want intranode.CombineOutput) error {
	if err := r.st.Synchronize(); err != nil {
		return err
	}
	if err := r.compare(what+": combined rows", asBytes(want.X), res.X.Ptr); err != nil {
		return err
	}
	return r.compare(what+": combined weights", asBytes(want.Weights), res.Weights.Ptr)
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// inTensors are one rank's inputs on the device.
type inTensors struct {
	x, ids, w, x8, scales ep.Tensor
}

func (r *inRank) uploadInputs(sh *inShared) (in inTensors, err error) {
	t, o := sh.tokens, r.o
	my := sh.in[r.rank]
	var p uintptr
	if p, err = r.upload(asBytes(my.X)); err != nil {
		return in, err
	}
	in.x = ep.NewTensor(p, ep.BF16, t, o.hidden)
	if p, err = r.upload(asBytes(my.TopK)); err != nil {
		return in, err
	}
	in.ids = ep.NewTensor(p, ep.I64, t, o.topk)
	if p, err = r.upload(asBytes(my.Weights)); err != nil {
		return in, err
	}
	in.w = ep.NewTensor(p, ep.F32, t, o.topk)
	if o.fp8 {
		my8 := sh.in8[r.rank]
		if p, err = r.upload(asBytes(my8.XFP8)); err != nil {
			return in, err
		}
		in.x8 = ep.NewTensor(p, ep.FP8E4M3, t, o.hidden)
		if p, err = r.upload(asBytes(my8.Scales)); err != nil {
			return in, err
		}
		in.scales = ep.NewTensor(p, ep.F32, t, o.hidden/128)
	}
	return in, nil
}

// runTokens checks, then times (or tunes), at one token count.
func (r *inRank) runTokens(sh *inShared) error {
	ctx, o, t := r.ctx, r.o, sh.tokens
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
	for i := 0; i < warmup; i++ {
		if err := call(); err != nil {
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
	r.progress("%s %s %s (%d SMs x %d threads%s): %.1f us%s (rank 0)", k.Op, k.Dtype, k.Mode, k.SMs, k.Threads,
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
			_, err := r.buf.Layout(ep.LayoutArgs{TopK: in.ids, Stream: r.st})
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
			return func() error { _, err := r.buf.Dispatch(ctx, a); return err }
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
			return func() error { _, err := r.buf.Dispatch(ctx, a); return err }
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

// Tuning: the block sizes swept for each copy path and SM count.
var (
	tuneDispatchThreads = map[ep.CopyMode][]int{
		ep.CopyPlain: {256, 512, 768, 1024},
		ep.CopyWide:  {128, 256, 384, 512},
		ep.CopyTMA:   {128, 256, 512},
	}
	tuneCombineThreads = []int{128, 256, 384, 512}
)

func (r *inRank) tuneSMs() []int {
	var out []int
	for _, s := range r.o.tuneSMs {
		if sms := r.dev.Info().SMs; sms == 0 || s <= sms {
			out = append(out, s)
		}
	}
	return out
}

// tuneDispatch times cached dispatch at every (copy path, SMs, threads).
func (r *inRank) tuneDispatch(t int, dtype string, base ep.DispatchArgs, bytes int64, recv int) error {
	for _, mode := range ep.CopyModes {
		for _, sms := range r.tuneSMs() {
			for _, thr := range tuneDispatchThreads[mode] {
				a := base
				var k inKey
				var err error
				if a.Launch, k, err = r.launch(ep.OpDispatch, sms, thr, mode); err != nil {
					return err
				}
				if err := r.measure(k.with(t, "dispatch", dtype, "cached"), bytes, recv, true, func() (float64, float64, error) {
					return r.timeCalls(r.o.tuneWarmup, r.o.tuneIters, func() error { _, err := r.buf.Dispatch(r.ctx, a); return err })
				}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (r *inRank) tuneBF16(sh *inShared, in inTensors, res ep.DispatchResult, bytes int64) error {
	t, n := sh.tokens, res.NumRecv
	if err := r.tuneDispatch(t, "bf16", ep.DispatchArgs{X: in.x, Handle: res.Handle, Stream: r.st}, bytes, n); err != nil {
		return err
	}
	if err := r.agree("bf16 check after tuning", r.checkDispatch("bf16 dispatch after tuning", res, sh.ref[r.rank], false, false)); err != nil {
		return err
	}
	for _, sms := range r.tuneSMs() {
		for _, thr := range tuneCombineThreads {
			l, k, err := r.launch(ep.OpCombine, sms, thr, ep.CopyDefault)
			if err != nil {
				return err
			}
			a := ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: res.Handle, Stream: r.st, Launch: l}
			if err := r.measure(k.with(t, "combine", "bf16", "events"), bytes, n, true, func() (float64, float64, error) {
				return r.timeCalls(r.o.tuneWarmup, r.o.tuneIters, func() error { _, err := r.buf.Combine(r.ctx, a); return err })
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *inRank) tuneFP8(sh *inShared, in inTensors, res ep.DispatchResult, bytes int64) error {
	if err := r.tuneDispatch(sh.tokens, "fp8", ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res.Handle, Stream: r.st}, bytes, res.NumRecv); err != nil {
		return err
	}
	return r.agree("fp8 check after tuning", r.checkDispatch("fp8 dispatch after tuning", res, sh.ref8[r.rank], true, false))
}
