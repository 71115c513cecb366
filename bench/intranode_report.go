package bench

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
)

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
	fmt.Fprintf(w, "intranode: %d ranks (%s), %s backend, %s; hidden %d, top-%d of %d experts, routing top-k of |randn|+1 (seed %d, %d masked)\n",
		rep.Ranks, rep.As, rep.Backend, deviceLabel(rep.Device, rep.SMs), o.hidden, o.topk, o.experts, o.seed, o.masked)
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
			dash(r.SMs > 0 && o.showLaunch, fmt.Sprint(r.SMs)), dash(r.Threads > 0 && o.showLaunch, fmt.Sprint(r.Threads)), dash(r.Recv > 0 || r.Bytes > 0, fmt.Sprint(r.Recv)),
			r.US, gb, r.MinUS, r.MaxUS, gbr, dash(r.WallUS > 0, fmt.Sprintf("%.1f", r.WallUS)), anchor)
	}
	tw.Flush()
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
}
