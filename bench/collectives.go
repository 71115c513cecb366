package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

func init() {
	register("collectives", "check, then time allreduce, allgather and reduce-scatter: ours against NCCL in the same run (--compare nccl), tuning table (--tune)", runCollectives)
}

// collOpts are the parsed flags of `ep-bench collectives`.
type collOpts struct {
	kind       device.Kind
	ranks      int
	colls      []collectives.Kind
	dt         ref.DataType
	op         ref.Op
	sizes      []int
	explicit   bool // --sizes given: run them all
	maxBytes   int
	compare    bool
	tune       bool
	tuneOut    string
	tuning     string
	algo       string
	iters      int
	graphCalls int
	replays    int
	flushIters int
	smallMax   int
	flushMiB   int
	blocks     []int
	timeout    time.Duration
	jsonPath   string
	plotPrefix string
}

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

func runCollectives(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("collectives", stderr)
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	ranks := fs.Int("ranks", 0, "goroutine ranks when run without a launcher (default: every GPU, or 4 host ranks)")
	colls := fs.String("colls", "allreduce,allgather,reducescatter", "collectives to run")
	dtype := fs.String("dtype", "bf16", "element type: bf16, fp16, fp32 (fp8_e4m3 for allgather)")
	op := fs.String("op", "sum", "reduction: sum, min, max")
	sizes := fs.String("sizes", "", "bytes per rank (the buffer for allreduce, one rank's part for allgather and reduce-scatter), e.g. 1K,64K,1M; default powers of two from 1 KiB to --max (GPU) or 1 MiB (host)")
	maxB := fs.String("max", "1G", "largest total buffer of the default sizes (allgather and reduce-scatter parts are at most this / ranks)")
	compare := fs.String("compare", "", "nccl: also time NCCL, in the same process on the same buffers, and print the ratio")
	tune := fs.Bool("tune", false, "time every algorithm (and NCCL with --compare nccl), write the fastest per size as a tuning table (--tune-out) and use it")
	tuneOut := fs.String("tune-out", "collectives-tuning.json", "where --tune writes the table (rank 0)")
	tuning := fs.String("tuning", "", "tuning table the selector uses (default $"+collectives.EnvTuning+")")
	algo := fs.String("algo", "", "force one algorithm for the \"ours\" measurement (ll, ll2, scratch, zc, nccl)")
	iters := fs.Int("iters", 0, "back-to-back calls timed per small size (default 200 on GPU, 5 on host)")
	graphCalls := fs.Int("graph-calls", 0, "calls captured per graph (default 50 on GPU, 3 on host)")
	replays := fs.Int("replays", 0, "graph replays timed (default 10 on GPU, 2 on host)")
	flushIters := fs.Int("flush-iters", 0, "single calls timed per large size, each after an L2 flush (default 10 on GPU, 2 on host)")
	smallMax := fs.String("small-max", "4M", "sizes up to this are timed back to back and in a graph; larger ones one call at a time after an L2 flush")
	flushMiB := fs.Int("flush-mib", 256, "MiB zeroed to flush L2 before each large-size call")
	blocks := fs.String("blocks", "", "grids of the scratch and zero-copy kernels tried by --tune (default 16,32,64 on GPU, 2 on host)")
	timeout := fs.Duration("timeout", 0, "device-side wait timeout (default $"+channels.TimeoutEnv+" or 60s)")
	jsonPath := fs.String("json", "", "write checks, measurements, the comparison and the tuning table as JSON (rank 0)")
	plotPrefix := fs.String("plot", "", "write bus bandwidth against size as PREFIX.png and PREFIX.svg")
	if err := parse(fs, args); err != nil {
		return err
	}
	kind, _, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	gpu := kind == device.CUDA
	o := collOpts{kind: kind, ranks: *ranks, tune: *tune, tuneOut: *tuneOut, tuning: *tuning, algo: *algo,
		iters: *iters, graphCalls: *graphCalls, replays: *replays, flushIters: *flushIters, flushMiB: *flushMiB,
		timeout: *timeout, jsonPath: *jsonPath, plotPrefix: *plotPrefix}
	switch *compare {
	case "":
	case "nccl":
		o.compare = true
	default:
		return fmt.Errorf("--compare %q: only nccl", *compare)
	}
	for _, s := range strings.Split(*colls, ",") {
		k, err := collectives.ParseKind(s)
		if err != nil {
			return fmt.Errorf("--colls: %w", err)
		}
		o.colls = append(o.colls, k)
	}
	if o.dt, err = ref.ParseDataType(*dtype); err != nil {
		return fmt.Errorf("--dtype: %w", err)
	}
	if o.op, err = ref.ParseOp(*op); err != nil {
		return fmt.Errorf("--op: %w", err)
	}
	mb, err := parseSizes(*maxB, "1G")
	if err != nil || len(mb) != 1 {
		return fmt.Errorf("--max: want one size")
	}
	o.maxBytes = mb[0]
	if !gpu && *maxB == "1G" {
		o.maxBytes = 1 << 20
	}
	if *sizes != "" {
		if o.sizes, err = parseSizes(*sizes, ""); err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		o.explicit = true
	} else {
		for s := 1 << 10; s <= o.maxBytes; s *= 2 {
			o.sizes = append(o.sizes, s)
		}
	}
	sm, err := parseSizes(*smallMax, "4M")
	if err != nil || len(sm) != 1 {
		return fmt.Errorf("--small-max: want one size")
	}
	o.smallMax = sm[0]
	if o.blocks, err = parseSizes(*blocks, pick(gpu, "16,32,64", "2")); err != nil {
		return fmt.Errorf("--blocks: %w", err)
	}
	defaults := func(v *int, onGPU, onHost int) {
		if *v == 0 {
			*v = pick(gpu, onGPU, onHost)
		}
	}
	defaults(&o.iters, 200, 5)
	defaults(&o.graphCalls, 50, 3)
	defaults(&o.replays, 10, 2)
	defaults(&o.flushIters, 10, 2)
	if o.iters < 1 || o.graphCalls < 1 || o.replays < 1 || o.flushIters < 1 || o.flushMiB < 0 {
		return errors.New("--iters, --graph-calls, --replays and --flush-iters must be positive")
	}
	if o.algo != "" && o.tune {
		return errors.New("--algo and --tune exclude each other")
	}
	env, err := bootstrap.FromEnv()
	if err != nil {
		return fmt.Errorf("launcher environment: %w", err)
	}
	if env.Size > 1 {
		if kind == device.Host {
			return fmt.Errorf("the host backend shares memory between goroutine ranks of one process only; run `ep-bench collectives --backend host` without a launcher")
		}
		return collProcess(ctx, env, o, stdout)
	}
	return collGoroutines(ctx, o, stdout)
}

func (o collOpts) config() collectives.Config {
	cfg := collectives.Config{Channels: channels.Config{Timeouts: channels.Timeouts{Wait: o.timeout}}}
	if o.compare {
		cfg.NCCL = collectives.NCCLEager
	}
	if o.kind == device.Host {
		cfg.ScratchBytes, cfg.PacketBytes, cfg.MaxBlocks, cfg.LLMaxBlocks, cfg.Threads = 1<<20, 2<<20, 4, 2, 64
	}
	return cfg
}

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
	n := o.ranks
	if n == 0 {
		n = 4
		if o.kind == device.CUDA {
			var err error
			if n, err = device.CUDADeviceCount(); err != nil {
				return err
			}
		}
	}
	if n < 2 {
		return fmt.Errorf("collectives needs at least 2 ranks (have %d)", n)
	}
	outs := make([]collOutcome, n)
	errs := colltest.RunLocal(ctx, o.kind, n, bootstrap.Config{}, o.config(), func(ctx context.Context, c *collectives.Communicator) error {
		outs[c.Rank()] = collRank(ctx, c, o)
		if e := outs[c.Rank()].Err; e != "" {
			return errors.New(e)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil && outs[r].Err == "" {
			outs[r].Err = err.Error()
		}
	}
	return reportColl(stdout, o, n, outs)
}

func collProcess(ctx context.Context, env bootstrap.EnvInfo, o collOpts, stdout io.Writer) (err error) {
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
	c, err := collectives.New(ctx, bs, dev, o.config())
	if err != nil {
		return err
	}
	mine := collRank(ctx, c, o)
	// Everyone is done with everyone's memory before anyone frees it.
	berr := bs.Barrier(ctx)
	err = errors.Join(err, c.Close())
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

// arenaBytes is what the largest case needs.
func (o collOpts) arenaBytes(world int) int {
	m := 0
	for _, k := range o.colls {
		for _, s := range o.sizesOf(k, world) {
			total := s
			if k != collectives.AllReduce {
				total *= world
			}
			m = max(m, total)
		}
	}
	return m + 64<<10
}

// sizesOf are the per-rank sizes of k: without --sizes, allgather and
// reduce-scatter parts stop where the whole buffer would pass --max.
func (o collOpts) sizesOf(k collectives.Kind, world int) []int {
	var out []int
	for _, s := range o.sizes {
		if s%o.dt.Size() != 0 {
			continue
		}
		if !o.explicit && k != collectives.AllReduce && s*world > o.maxBytes {
			continue
		}
		out = append(out, s)
	}
	return out
}

func collRank(ctx context.Context, c *collectives.Communicator, o collOpts) (out collOutcome) {
	r := &collRun{ctx: ctx, c: c, o: o, dev: c.Device(), s: c.Device().DefaultStream(), rep: &report{}, seed: 0x5eed,
		skip: map[string][]string{}}
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

// checkOnce runs one call of cs on fresh data and checks the whole output
// on the device; it returns the algorithm that ran.
func (r *collRun) checkOnce(cs colltest.Case) (string, error) {
	if err := r.b.Prepare(cs, r.s); err != nil {
		return "", err
	}
	if err := r.s.Synchronize(); err != nil {
		return "", err
	}
	if err := r.c.Barrier(r.ctx); err != nil {
		return "", err
	}
	w, err := r.b.Issue(r.ctx, cs, r.s)
	if err != nil {
		return "", err
	}
	if err := r.b.VerifyDevice(cs, r.s); err != nil {
		return "", err
	}
	return w.Algorithm(), w.Err()
}

// allPassed tells every rank whether every rank's check passed, so that
// all time the same things (a rank that skips a call would hang the
// others).
func (r *collRun) allPassed(ok bool) (bool, error) {
	v := byte(0)
	if ok {
		v = 1
	}
	all, err := r.c.Bootstrap().AllGather(r.ctx, []byte{v})
	if err != nil {
		return false, err
	}
	for _, b := range all {
		if len(b) != 1 || b[0] != 1 {
			return false, nil
		}
	}
	return true, nil
}

// slowest returns the largest per-call time over ranks (0 when any rank
// failed).
func (r *collRun) slowest(us float64, failed error) (float64, error) {
	if failed != nil {
		us = -1
	}
	all, err := r.c.Bootstrap().AllGather(r.ctx, binary.LittleEndian.AppendUint64(nil, math.Float64bits(us)))
	if err != nil {
		return 0, err
	}
	m := 0.0
	for _, b := range all {
		v := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if v < 0 {
			return 0, nil
		}
		m = max(m, v)
	}
	return m, nil
}

func bandwidth(k collectives.Kind, W, size int, us float64) (alg, bus float64) {
	if us <= 0 {
		return 0, 0
	}
	total := float64(size)
	factor := float64(W-1) / float64(W)
	if k == collectives.AllReduce {
		factor *= 2
	} else {
		total *= float64(W)
	}
	alg = total / (us * 1e3)
	return alg, alg * factor
}

// time measures cs in one mode and returns microseconds per call.
func (r *collRun) time(cs colltest.Case, mode string) (float64, int, error) {
	issue := func() error {
		_, err := r.b.Issue(r.ctx, cs, r.s)
		return err
	}
	elapsed := func(calls int) (float64, error) {
		if err := r.ev[1].Synchronize(); err != nil {
			return 0, err
		}
		if err := r.c.Check(); err != nil {
			return 0, err
		}
		d, err := r.dev.Elapsed(r.ev[0], r.ev[1])
		return float64(d) / float64(time.Microsecond) / float64(calls), err
	}
	switch mode {
	case "eager":
		for i := 0; i < min(5, r.o.iters); i++ {
			if err := issue(); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		for i := 0; i < r.o.iters; i++ {
			if err := issue(); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		us, err := elapsed(r.o.iters)
		return us, r.o.iters, err
	case "graph":
		g, err := r.dev.Capture(r.s, func() error {
			for i := 0; i < r.o.graphCalls; i++ {
				if err := issue(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
		defer g.Close()
		if err := g.Launch(r.s); err != nil {
			return 0, 0, err
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		for i := 0; i < r.o.replays; i++ {
			if err := g.Launch(r.s); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		calls := r.o.graphCalls * r.o.replays
		us, err := elapsed(calls)
		return us, calls, err
	}
	// flushed: each call alone, after an L2 flush and a device barrier
	// (an 8-byte LL allreduce), timed between its own events.
	if err := issue(); err != nil { // warm-up
		return 0, 0, err
	}
	total := 0.0
	for i := 0; i < r.o.flushIters; i++ {
		if r.flush.Ptr != 0 {
			if err := r.dev.MemsetAsync(r.flush.Ptr, byte(i), r.flush.Size, r.s); err != nil {
				return 0, 0, err
			}
		}
		if _, err := r.c.AllReduce(r.ctx, r.s, r.bar.Ptr, r.bar.Ptr, 8, ref.FP32, ref.Sum, collectives.WithAlgorithm(collectives.AlgoLL)); err != nil {
			return 0, 0, err
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		if err := issue(); err != nil {
			return 0, 0, err
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		us, err := elapsed(1)
		if err != nil {
			return 0, 0, err
		}
		total += us
	}
	return total / float64(r.o.flushIters), r.o.flushIters, nil
}

// buildTuning turns --tune's measurements into a table: for each
// collective and mode, the fastest candidate at each size, NCCL included
// (with --compare nccl); sizes between two measured ones use the larger's
// rule. Every rank builds the same table (times are the slowest rank's),
// applies it, and rank 0 writes it.
func (r *collRun) buildTuning() (*collectives.Tuning, error) {
	info := r.dev.Info()
	t := &collectives.Tuning{Version: collectives.TuningVersion, Device: info.Name, World: r.c.Size(),
		Created: time.Now().UTC().Format(time.RFC3339),
		Note:    fmt.Sprintf("ep-bench collectives --tune, %s %s; eager and flushed times make the mode-independent rules, graph times the graph rules", r.o.dt, r.o.op)}
	type key struct {
		coll, mode string
		bytes      int64
	}
	best := map[key]collRow{}
	bestReg := map[key]collRow{} // fastest that needs no registration
	for _, row := range r.rows {
		if row.US <= 0 || row.Error != "" || row.Mode == "check" {
			continue
		}
		mode := "graph"
		if row.Mode != "graph" {
			mode = ""
		}
		k := key{row.Collective, mode, row.Bytes}
		if b, ok := best[k]; !ok || row.US < b.US {
			best[k] = row
		}
		if row.Algorithm != collectives.AlgoZC {
			if b, ok := bestReg[k]; !ok || row.US < b.US {
				bestReg[k] = row
			}
		}
	}
	keys := make([]key, 0, len(best))
	for k := range best {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.coll != b.coll {
			return a.coll < b.coll
		}
		if a.mode != b.mode {
			return a.mode < b.mode
		}
		return a.bytes < b.bytes
	})
	for i, k := range keys {
		b := best[k]
		rule := collectives.Rule{Collective: k.coll, Mode: k.mode, MaxBytes: k.bytes, Algorithm: b.Algorithm, Blocks: b.Blocks}
		if u, ok := bestReg[k]; ok && b.Algorithm == collectives.AlgoZC {
			rule.Unregistered, rule.UnregisteredBlocks = u.Algorithm, u.Blocks
		}
		first := i == 0 || keys[i-1].coll != k.coll || keys[i-1].mode != k.mode
		if n := len(t.Rules); n > 0 && !first {
			p := &t.Rules[n-1]
			if p.Algorithm == rule.Algorithm && p.Blocks == rule.Blocks && p.Unregistered == rule.Unregistered &&
				p.UnregisteredBlocks == rule.UnregisteredBlocks {
				p.MaxBytes = rule.MaxBytes // the same choice: extend the previous rule
			} else {
				t.Rules = append(t.Rules, rule)
			}
		} else {
			t.Rules = append(t.Rules, rule)
		}
		last := i == len(keys)-1 || keys[i+1].coll != k.coll || keys[i+1].mode != k.mode
		if last && k.mode == "" {
			t.Rules[len(t.Rules)-1].MaxBytes = 0 // the largest size's choice covers everything above it
		}
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	r.c.SetTuning(t)
	if r.c.Rank() == 0 {
		if err := t.Save(r.o.tuneOut); err != nil {
			return nil, err
		}
	}
	// The selector now picks the fastest: confirm it on this rank.
	for _, k := range keys {
		kind, _ := collectives.ParseKind(k.coll)
		got, err := r.c.Select(kind, int(k.bytes)/r.o.dt.Size(), r.o.dt, r.o.op, true, k.mode == "graph")
		if err != nil {
			return nil, err
		}
		if want := best[k].Algorithm; got != want {
			return nil, fmt.Errorf("tuning table: %s %s %s selects %s, the fastest was %s", k.coll, k.mode, human(int(k.bytes)), got, want)
		}
	}
	return t, nil
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
	for r, oc := range outs {
		if oc.Err != "" {
			rep.Errors = append(rep.Errors, fmt.Sprintf("rank %d: %s", r, oc.Err))
		}
	}
	fmt.Fprintf(stdout, "collectives: %d ranks, %s backend, %s (%d SMs), %s %s", n, o.kind, rep.Device, rep.SMs, rep.DType, rep.Op)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%.2f\t%.1f\t%.1f\t%s\t\n", x.Collective, human(int(x.Bytes)), a,
			dash(x.Blocks > 0, strconv.Itoa(x.Blocks)), x.Mode, x.Calls, x.US, x.AlgGBps, x.BusGBps, note)
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

// evaluateTargets checks the issue's speed targets (8 ranks, bf16) on the
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

// plotColl draws bus bandwidth against bytes per rank, one line per
// collective and implementation (ours: the fastest native or selector's
// choice; NCCL), from the flushed and eager rows.
func plotColl(prefix string, rep collReport) error {
	type series struct {
		label string
		pts   plotter.XYs
	}
	var order []string
	byLabel := map[string]*series{}
	add := func(label string, x, y float64) {
		s := byLabel[label]
		if s == nil {
			s = &series{label: label}
			byLabel[label] = s
			order = append(order, label)
		}
		s.pts = append(s.pts, plotter.XY{X: x, Y: y})
	}
	if len(rep.Compare) > 0 {
		for _, c := range rep.Compare {
			if c.Mode == "graph" {
				continue
			}
			add(c.Collective+" goep", float64(c.Bytes), c.OursBus)
			add(c.Collective+" NCCL", float64(c.Bytes), c.NCCLBus)
		}
	} else {
		best := map[string]float64{}
		for _, r := range rep.Rows {
			if r.Mode == "graph" || r.BusGBps <= 0 {
				continue
			}
			k := fmt.Sprintf("%s|%d", r.Collective, r.Bytes)
			best[k] = max(best[k], r.BusGBps)
		}
		for k, v := range best {
			coll, b, _ := strings.Cut(k, "|")
			x, _ := strconv.ParseFloat(b, 64)
			add(coll+" goep", x, v)
		}
	}
	if len(order) == 0 {
		return errors.New("nothing to plot")
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("goep collectives, %d ranks, %s, %s %s", rep.Ranks, rep.Device, rep.DType, rep.Op)
	p.X.Label.Text = "bytes per rank"
	p.Y.Label.Text = "bus bandwidth GB/s (slowest rank)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	sort.Strings(order)
	for i, label := range order {
		s := byLabel[label]
		sort.Slice(s.pts, func(a, b int) bool { return s.pts[a].X < s.pts[b].X })
		line, points, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(label, line, points)
	}
	for _, ext := range []string{"png", "svg"} {
		if err := p.Save(10*vg.Inch, 6*vg.Inch, prefix+"."+ext); err != nil {
			return err
		}
	}
	return nil
}
