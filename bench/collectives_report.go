package bench

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/internal/device"
)

// collRow is one measurement (times are the slowest rank's).
type collRow struct {
	Collective string  `json:"collective"`
	Bytes      int64   `json:"bytes"`       // per rank: the buffer (allreduce), one rank's part (allgather, reduce-scatter)
	TotalBytes int64   `json:"total_bytes"` // allreduce: the buffer; allgather: the output; reduce-scatter: the input
	Algorithm  string  `json:"algorithm"`   // "auto" rows name the selector's choice in Chosen
	Chosen     string  `json:"chosen,omitempty"`
	Blocks     int     `json:"blocks,omitempty"`
	Mode       string  `json:"mode"` // eager, graph, flushed
	Calls      int     `json:"calls"`
	US         float64 `json:"us"`
	AlgGBps    float64 `json:"alg_gbps"`
	BusGBps    float64 `json:"bus_gbps"`
	Error      string  `json:"error,omitempty"`
}

// collCompare is ours against NCCL at one size and mode.
type collCompare struct {
	Collective string  `json:"collective"`
	Bytes      int64   `json:"bytes"`
	Mode       string  `json:"mode"`
	Ours       string  `json:"ours"` // best native algorithm (with --tune) or the selector's choice
	OursUS     float64 `json:"ours_us"`
	OursBus    float64 `json:"ours_bus_gbps"`
	NCCLUS     float64 `json:"nccl_us"`
	NCCLBus    float64 `json:"nccl_bus_gbps"`
	Ratio      float64 `json:"ratio"` // NCCL time / ours: > 1 means ours is faster
	Auto       string  `json:"auto"`  // what the selector uses (after --tune: the fastest, NCCL included)
	AutoUS     float64 `json:"auto_us"`
}

type collReport struct {
	Ranks   int                  `json:"ranks"`
	Backend string               `json:"backend"`
	Device  string               `json:"device"`
	SMs     int                  `json:"sms"`
	DType   string               `json:"dtype"`
	Op      string               `json:"op"`
	NCCL    string               `json:"nccl,omitempty"`
	Method  string               `json:"method"`
	Rows    []collRow            `json:"rows"`
	Compare []collCompare        `json:"compare,omitempty"`
	Tuning  *collectives.Tuning  `json:"tuning,omitempty"`
	Checks  []check              `json:"checks"`
	Errors  []string             `json:"errors,omitempty"`
	Skipped map[string][]string  `json:"skipped,omitempty"`
	Targets []collTargetEvaluate `json:"targets,omitempty"`
}

// ---------------------------------------------------------------------------
// Report.

// collTargetEvaluate is a target of the issue, evaluated on rank 0's rows.
type collTargetEvaluate struct {
	What   string `json:"what"`
	Target string `json:"target"`
	Got    string `json:"got"`
	Met    bool   `json:"met"`
}

func reportColl(stdout io.Writer, o collOpts, n int, outs []collOutcome) error {
	o0 := outs[0]
	rep := collReport{Ranks: n, Backend: string(o.kind), Device: o0.Device, SMs: o0.SMs, DType: o.dt.String(), Op: o.op.String(),
		NCCL: o0.NCCL, Rows: o0.Rows, Tuning: o0.Tuning, Checks: o0.Checks, Skipped: o0.Skipped}
	rep.Method = fmt.Sprintf("sizes <= %s: %d back-to-back calls between two events (eager), and %d calls captured in a CUDA graph replayed %d times (graph); "+
		"larger: %d single calls, each after an L2 flush (%d MiB memset) and a device barrier, between its own events; every figure is the slowest rank's mean per call; "+
		"data: integers in [-8, 8] (exact in every summation order), every output checked on the device before and after timing",
		human(o.smallMax), o.iters, o.graphCalls, o.replays, o.flushIters, o.flushMiB)
	if o.kind == device.Host {
		rep.Method = strings.Replace(rep.Method, fmt.Sprintf("an L2 flush (%d MiB memset)", o.flushMiB), "an L2 flush (none on the host backend)", 1)
	}
	for r, oc := range outs {
		if oc.Err != "" {
			rep.Errors = append(rep.Errors, fmt.Sprintf("rank %d: %s", r, oc.Err))
		}
	}
	fmt.Fprintf(stdout, "collectives: %d ranks, %s backend, %s, %s %s", n, o.kind, deviceLabel(rep.Device, rep.SMs), rep.DType, rep.Op)
	if rep.NCCL != "" {
		fmt.Fprintf(stdout, ", NCCL %s", rep.NCCL)
	}
	fmt.Fprintf(stdout, "\nmethod: %s\n", rep.Method)
	failed := 0
	for _, c := range rep.Checks {
		if c.Status == "fail" {
			failed++
		}
	}
	if failed > 0 {
		(&report{Checks: filterChecks(rep.Checks, "fail")}).print(stdout)
	}
	fmt.Fprintf(stdout, "checks: %d passed, %d failed (rank 0)\n", len(rep.Checks)-failed, failed)

	rep.Compare = compareRows(o, rep.Rows, rep.Tuning)
	printCollRows(stdout, o, rep.Rows)
	if len(rep.Compare) > 0 {
		printCompare(stdout, rep.Compare)
		rep.Targets = evaluateTargets(n, rep.Compare)
		printTargets(stdout, rep.Targets)
	}
	if rep.Tuning != nil {
		fmt.Fprintf(stdout, "tuning table: %d rules written to %s\n", len(rep.Tuning.Rules), o.tuneOut)
	}
	var errs []error
	if o.jsonPath != "" {
		if err := writeJSON(o.jsonPath, rep); err != nil {
			errs = append(errs, err)
		}
	}
	if o.plotPrefix != "" {
		if err := plotColl(o.plotPrefix, rep); err != nil {
			errs = append(errs, fmt.Errorf("plot: %w", err))
		} else {
			fmt.Fprintf(stdout, "plot: %s.png, %s.svg\n", o.plotPrefix, o.plotPrefix)
		}
	}
	if len(rep.Errors) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d ranks failed:\n  %s", len(rep.Errors), n, strings.Join(rep.Errors, "\n  ")))
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("%d checks failed", failed))
	}
	if len(errs) == 0 {
		fmt.Fprintln(stdout, "collectives: all checks passed")
	}
	return errors.Join(errs...)
}

func filterChecks(cs []check, status string) []check {
	var out []check
	for _, c := range cs {
		if c.Status == status {
			out = append(out, c)
		}
	}
	return out
}

func printCollRows(w io.Writer, o collOpts, rows []collRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "MEASUREMENTS (per call, slowest rank)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "collective\tbytes/rank\talgorithm\tblocks\tmode\tcalls\tus\talg GB/s\tbus GB/s\tnote\t")
	for _, x := range rows {
		a := x.Algorithm
		if a == "auto" && x.Chosen != "" {
			a = "auto=" + x.Chosen
		}
		note := ""
		if x.Error != "" {
			note = "FAILED: " + firstLine(x.Error)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%.2f\t%s\t%s\t%s\t\n", x.Collective, human(int(x.Bytes)), a,
			dash(x.Blocks > 0, strconv.Itoa(x.Blocks)), x.Mode, x.Calls, x.US, gbps(x.AlgGBps), gbps(x.BusGBps), note)
	}
	tw.Flush()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// compareRows pairs ours with NCCL per (collective, size, mode): "ours" is
// the fastest native candidate (with --tune) or the measured selector
// choice; "auto" is what the selector uses now (the table after --tune).
func compareRows(o collOpts, rows []collRow, t *collectives.Tuning) []collCompare {
	type key struct {
		coll, mode string
		bytes      int64
	}
	ours := map[key]collRow{}
	nccl := map[key]collRow{}
	var order []key
	for _, x := range rows {
		if x.US <= 0 || x.Error != "" {
			continue
		}
		k := key{x.Collective, x.Mode, x.Bytes}
		if x.Algorithm == collectives.AlgoNCCL {
			nccl[k] = x
			continue
		}
		if _, seen := ours[k]; !seen {
			order = append(order, k)
		}
		if b, ok := ours[k]; !ok || x.US < b.US {
			ours[k] = x
		}
	}
	var out []collCompare
	for _, k := range order {
		a, ok := ours[k]
		nc, ok2 := nccl[k]
		if !ok || !ok2 {
			continue
		}
		name := a.Algorithm
		if name == "auto" {
			name = a.Chosen
		}
		if a.Blocks > 0 {
			name += fmt.Sprintf("/%d", a.Blocks)
		}
		c := collCompare{Collective: k.coll, Bytes: k.bytes, Mode: k.mode, Ours: name, OursUS: a.US, OursBus: a.BusGBps,
			NCCLUS: nc.US, NCCLBus: nc.BusGBps, Ratio: nc.US / a.US, Auto: name, AutoUS: a.US}
		if a.Algorithm == "auto" && a.Chosen == collectives.AlgoNCCL {
			c.Ours = "nccl (selector)"
		}
		if t != nil && nc.US < a.US {
			c.Auto, c.AutoUS = collectives.AlgoNCCL, nc.US
		}
		out = append(out, c)
	}
	return out
}

func printCompare(w io.Writer, cs []collCompare) {
	fmt.Fprintln(w, "OURS AGAINST NCCL (same process, same buffers; ratio = NCCL time / ours, > 1: ours faster)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "collective\tbytes/rank\tmode\tours\tours us\tNCCL us\tratio\tours bus GB/s\tNCCL bus GB/s\tselector uses\t")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%s\t\n", c.Collective, human(int(c.Bytes)), c.Mode, c.Ours,
			c.OursUS, c.NCCLUS, c.Ratio, c.OursBus, c.NCCLBus, c.Auto)
	}
	tw.Flush()
}

// evaluateTargets checks the speed targets (8 ranks, bf16) on the
// comparison: graph-mode times for small sizes, bandwidth for large ones.
func evaluateTargets(world int, cs []collCompare) []collTargetEvaluate {
	find := func(coll, mode string, bytes int64) *collCompare {
		for i := range cs {
			if cs[i].Collective == coll && cs[i].Mode == mode && cs[i].Bytes == bytes {
				return &cs[i]
			}
		}
		return nil
	}
	var out []collTargetEvaluate
	lat := func(coll string, bytes int64, limit float64) {
		for _, mode := range []string{"graph", "eager"} {
			if c := find(coll, mode, bytes); c != nil {
				out = append(out, collTargetEvaluate{What: fmt.Sprintf("%s %s (%s)", coll, human(int(bytes)), mode),
					Target: fmt.Sprintf("<= %.0f us", limit), Got: fmt.Sprintf("%.2f us (%s); NCCL %.2f us", c.OursUS, c.Ours, c.NCCLUS),
					Met: c.OursUS <= limit})
			}
		}
	}
	for _, b := range []int64{1 << 10, 4 << 10, 16 << 10, 64 << 10} {
		lat("allreduce", b, 8)
		lat("allgather", b, 8)
	}
	lat("allreduce", 1<<20, 20)
	lat("allreduce", 8<<20, 70)
	for _, c := range cs {
		if c.Mode != "flushed" {
			continue
		}
		if (c.Collective == "allreduce" && c.Bytes >= 64<<20) || (c.Collective == "allgather" && c.Bytes >= 8<<20) {
			out = append(out, collTargetEvaluate{What: fmt.Sprintf("%s %s bus bandwidth", c.Collective, human(int(c.Bytes))),
				Target: ">= NCCL's", Got: fmt.Sprintf("%.1f GB/s (%s); NCCL %.1f GB/s", c.OursBus, c.Ours, c.NCCLBus),
				Met: c.OursBus >= c.NCCLBus})
		}
	}
	for _, c := range cs {
		out = append(out, collTargetEvaluate{What: fmt.Sprintf("%s %s (%s) not slower than NCCL", c.Collective, human(int(c.Bytes)), c.Mode),
			Target: "selector's choice <= NCCL", Got: fmt.Sprintf("%s %.2f us; NCCL %.2f us", c.Auto, c.AutoUS, c.NCCLUS),
			Met: c.AutoUS <= c.NCCLUS*1.0001})
	}
	if world != 8 {
		for i := range out {
			out[i].What += fmt.Sprintf(" [targets are for 8 ranks; this run has %d]", world)
		}
	}
	return out
}

func printTargets(w io.Writer, ts []collTargetEvaluate) {
	met := 0
	for _, t := range ts {
		if t.Met {
			met++
		}
	}
	fmt.Fprintf(w, "TARGETS: %d of %d met\n", met, len(ts))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range ts {
		mark := "met"
		if !t.Met {
			mark = "MISSED"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.What, t.Target, mark, t.Got)
	}
	tw.Flush()
}
