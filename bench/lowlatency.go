package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/lowlatency"
)

func init() {
	register("lowlatency", "check low-latency (decode) dispatch/combine through the ep API against the reference (BF16, FP8, UE8M0, a masked rank), then time them as DeepEP's test does, plain and graph-captured", runLowLatency)
}

// llOpts are the flags of `ep-bench lowlatency`.
type llOpts struct {
	kind                  device.Kind
	tokens                []int
	formats               []ep.LLFormat
	hidden, topk, experts int
	mask                  int
	seed                  uint64
	graph                 bool
	// burst: also time this many calls captured back to back in one graph
	// (per-call mean of a replay; 0: not): no host pacing between them, so
	// the figure shows the kernels' own time without the ranks' launch skew.
	burst         int
	warmup, iters int
	flushMiB      int
	ranks, sms    int
	// nodes splits the ranks into virtual nodes (0: $GOEP_VIRTUAL_NODES,
	// else one node): the other nodes' rows go over port channels.
	nodes                int
	timeout              time.Duration
	jsonPath, plotPrefix string
	progress             *progress
	// shared: ranks share a GPU; every timed call is then synchronised
	// before the next is issued (lowlatency's DESIGN.md: queued launches of
	// ranks sharing hardware queues must not wait on one another).
	shared bool
	// trace: after the timings, one traced call per shape (kernels built
	// with the phase trace: lowlatency_trace.go); traced: the build is.
	trace, traced bool
}

func runLowLatency(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("lowlatency", stderr)
	var o llOpts
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	tokens := fs.String("tokens", "1,8,32,64,128,256", "tokens per rank, a comma-separated list (the buffer is sized for the largest)")
	formats := fs.String("formats", "bf16,fp8,ue8m0", "dispatch formats, comma-separated: bf16, fp8, ue8m0")
	fs.IntVar(&o.hidden, "hidden", 7168, "hidden size")
	fs.IntVar(&o.topk, "topk", 8, "experts per token")
	fs.IntVar(&o.experts, "experts", 256, "experts in all")
	fs.IntVar(&o.mask, "mask", 1, "rank masked in the mask check (-1: no mask check)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the routing and the data")
	fs.BoolVar(&o.graph, "graph", true, "also time dispatch+combine captured in a CUDA graph and replayed")
	fs.IntVar(&o.burst, "burst", 8, "also time N calls captured back to back in one graph (per-call mean; needs --graph, not where ranks share a GPU; 0: off)")
	hostTiming := addTimingFlags(fs, &o.warmup, &o.iters, &o.flushMiB, timingDefaults{warmup: 20, iters: 50, hostWarmup: 1, hostIters: 3})
	fs.IntVar(&o.ranks, "ranks", 0, "goroutine ranks (default: every GPU up to 8, or 4 host ranks); more ranks than GPUs share them")
	fs.IntVar(&o.nodes, "nodes", 0, "virtual nodes the ranks split into (0: $GOEP_VIRTUAL_NODES, else one node); other nodes are reached over port channels")
	fs.IntVar(&o.sms, "sms", 0, "grid of every launch (0: the library's default within this rank's share of its GPU)")
	gpus := addGPUsFlag(fs)
	fs.DurationVar(&o.timeout, "timeout", 0, "device-side wait timeout (default $GOEP_CHANNEL_TIMEOUT or 60s)")
	fs.StringVar(&o.jsonPath, "json", "", "also write checks and figures as JSON to this file")
	fs.StringVar(&o.plotPrefix, "plot", "", "write us per call vs tokens as PREFIX.png and PREFIX.svg (with a --tokens sweep)")
	fs.BoolVar(&o.trace, "trace", false, "compile the kernels with their phase trace ("+kernelflags.EnvLLTrace+"=1, measurement only) and, after the timings, "+
		"print per shape where one dispatch and one combine spend their time, phase by phase (rank 0 and the slowest rank)")
	kind, set, err := parseBackend(fs, args, backend, gpus)
	if err != nil {
		return err
	}
	o.kind = kind
	if o.trace && kind != device.CUDA {
		return fmt.Errorf("--trace needs the cuda backend: the %s backend runs the kernels' Go twins, which record no trace", kind)
	}
	hostTiming(kind, set)
	if o.tokens, err = parseIntList(*tokens); err != nil {
		return fmt.Errorf("--tokens: %w", err)
	}
	for _, f := range strings.Split(*formats, ",") {
		switch strings.TrimSpace(f) {
		case "bf16":
			o.formats = append(o.formats, ep.LLBF16)
		case "fp8":
			o.formats = append(o.formats, ep.LLFP8)
		case "ue8m0":
			o.formats = append(o.formats, ep.LLUE8M0)
		default:
			return fmt.Errorf("--formats: %q: want bf16, fp8 or ue8m0", f)
		}
	}
	for _, t := range o.tokens {
		if t < 0 {
			return fmt.Errorf("--tokens: %d is negative", t)
		}
	}
	if o.iters < 2 || o.warmup < 0 || o.ranks < 0 || o.sms < 0 || o.timeout < 0 || o.flushMiB < 0 || o.nodes < 0 || o.burst < 0 {
		return errors.New("want --iters >= 2 and non-negative --warmup, --ranks, --nodes, --sms, --timeout, --flush-mib, --burst")
	}
	if o.burst > 64 {
		return fmt.Errorf("--burst %d: want at most 64 calls in one graph", o.burst)
	}
	if o.flushMiB > 1<<20 {
		return fmt.Errorf("--flush-mib %d: want at most %d", o.flushMiB, 1<<20)
	}
	if o.plotPrefix != "" {
		if n := len(positiveSet(o.tokens)); n < 2 {
			return fmt.Errorf("--plot needs a --tokens sweep of at least two positive token counts (have %d)", n)
		}
		if err := checkOutput("plot", o.plotPrefix+".png"); err != nil {
			return err
		}
	}
	if err := checkOutput("json", o.jsonPath); err != nil {
		return err
	}
	env, err := launcherEnv("lowlatency", o.kind)
	if err != nil {
		return err
	}
	if env.Size > 1 {
		return errors.New("lowlatency runs goroutine ranks in one process (give --ranks; ranks may share a GPU), not under a launcher yet")
	}
	n, err := goroutineRanks("lowlatency", o.kind, o.ranks, 8, 1)
	if err != nil {
		return err
	}
	if o.nodes == 0 {
		t, err := internode.ParseVirtualNodes(envVirtualNodes(), n)
		if err != nil {
			return err
		}
		if t.Nodes > 1 {
			o.nodes = t.Nodes
		}
	}
	if o.nodes > 1 && n%o.nodes != 0 {
		return fmt.Errorf("--nodes %d does not divide %d ranks", o.nodes, n)
	}
	if o.mask >= n {
		return fmt.Errorf("--mask %d: outside the world of %d ranks", o.mask, n)
	}
	if _, err := ep.LowLatencySizeHint(o.config(), n); err != nil {
		return err
	}
	// Before any kernel is compiled: the trace build (--trace, or
	// $GOEP_LL_TRACE=1 alone) is frozen with the first compile.
	if o.traced, err = applyLLTrace(o.trace); err != nil {
		return err
	}
	o.progress = newProgress(stderr)
	o.progress.printf("%d goroutine ranks, %s backend: setting up low-latency buffers", n, o.kind)
	note := sharedGPUNote(o.kind, n)
	o.shared = note != ""
	if note != "" {
		fmt.Fprintln(stdout, "note:", note)
	}
	if o.traced {
		fmt.Fprintln(stdout, "note:", llTraceNote)
	}
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	if err != nil {
		return err
	}
	step := newLockstep(n)
	ranks := make([]*llRank, n)
	errs := onGoroutineRanks(o.kind, boots, func(r int, dev device.Device) error {
		ranks[r] = &llRank{o: o, rank: r, ranks: n, dev: dev, step: step, shapes: map[[2]int]*llShape{}}
		err := ranks[r].run(ctx, boots[r])
		if err != nil {
			step.leave() // the others stop at their next step
		}
		return err
	})
	if err := interrupted(ctx); err != nil {
		return err
	}
	rep := newLLReport(o, n, note, ranks)
	if err := rep.write(stdout, o); err != nil {
		errs = append(errs, err)
	}
	// errs holds one entry per rank, nil where the rank succeeded.
	if o.trace && errors.Join(errs...) == nil {
		if err := writeLLTraces(stdout, o.kind, o.shared, ranks); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if f := (&report{Checks: rep.Checks}).failures(); len(f) > 0 {
		return fmt.Errorf("%d checks failed: %s", len(f), strings.Join(f, "; "))
	}
	return nil
}

func (o llOpts) config() ep.LowLatencyConfig {
	mt := 1
	for _, t := range o.tokens {
		mt = max(mt, t)
	}
	fp8 := false
	for _, f := range o.formats {
		fp8 = fp8 || f != ep.LLBF16
	}
	return ep.LowLatencyConfig{MaxTokens: mt, Hidden: o.hidden, TopK: o.topk, Experts: o.experts, FP8: fp8, NumSMs: o.sms,
		Timeout: o.timeout, VirtualNodes: o.nodes}
}

// llRank is one rank's benchmark state.
type llRank struct {
	o           llOpts
	rank, ranks int
	dev         device.Device
	buf         *ep.LowLatencyBuffer
	step        *lockstep
	rep         report
	figs        []llFigure
	bufs        []device.Buffer
	flush       device.Buffer
	shapes      map[[2]int]*llShape // checked shapes by (tokens, format), for their timing
	traces      []llTraced          // --trace: this rank's traced calls, in order
}

func (r *llRank) upload(b []byte) (uintptr, error) {
	buf, err := r.dev.Alloc(max(256, len(b)))
	if err != nil {
		return 0, err
	}
	r.bufs = append(r.bufs, buf)
	if len(b) > 0 {
		if err := r.dev.CopyIn(buf.Ptr, b); err != nil {
			return 0, err
		}
	}
	return buf.Ptr, nil
}

func llAsBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// input is rank src's input for t tokens: the same on every rank (each
// computes the reference itself).
func (o llOpts) input(src, t int) lowlatency.RankInput {
	rng := rand.New(rand.NewPCG(o.seed, uint64(src)<<32|uint64(t)))
	in := lowlatency.RankInput{X: make([]uint16, t*o.hidden), TopK: make([]int64, t*o.topk), Weights: make([]float32, t*o.topk)}
	for i := range in.X {
		in.X[i] = kernels.Float32ToBF16(float32(rng.NormFloat64()))
	}
	for tok := 0; tok < t; tok++ {
		// Distinct experts, as top-k of scores gives.
		perm := rng.Perm(o.experts)
		for j := 0; j < o.topk; j++ {
			in.TopK[tok*o.topk+j] = int64(perm[j%len(perm)])
			in.Weights[tok*o.topk+j] = rng.Float32()
		}
	}
	return in
}

// expertOutput is what the benchmark's experts "compute" for received row
// p: the row (dequantized) scaled by (p%3+1)/4, in BF16.
func expertOutput(f ep.LLFormat, row lowlatency.RecvRow, p, hidden int) []uint16 {
	y := make([]uint16, hidden)
	for i := range y {
		var v float32
		if f == ep.LLBF16 {
			v = kernels.BF16ToFloat32(row.X[i])
		} else {
			v = kernels.FP8E4M3ToFloat32(row.X8[i]) * row.Scales[i/lowlatency.FP8Block]
		}
		y[i] = kernels.Float32ToBF16(v * float32(p%3+1) / 4)
	}
	return y
}

func (r *llRank) run(ctx context.Context, bs bootstrap.Bootstrap) (err error) {
	o := r.o
	if r.buf, err = ep.NewLowLatencyBuffer(ctx, bs, r.dev, o.config()); err != nil {
		return err
	}
	defer func() {
		if e := r.buf.Stream().Synchronize(); e != nil {
			err = errors.Join(err, e)
		}
		err = errors.Join(err, r.buf.Close(context.Background()))
		for _, b := range append(r.bufs, r.flush) {
			if b.Ptr != 0 {
				err = errors.Join(err, r.dev.Free(b))
			}
		}
	}()
	if o.flushMiB > 0 {
		if r.flush, err = r.dev.Alloc(o.flushMiB << 20); err != nil {
			return err
		}
	}
	// Checks first (every shape and format, then the mask), timings after.
	timed := map[[2]int]bool{}
	for _, t := range o.tokens {
		for _, f := range o.formats {
			ok, err := r.shape(t, f, 0)
			if err != nil {
				return err
			}
			timed[[2]int{t, int(f)}] = ok
		}
	}
	if o.mask >= 0 && len(o.tokens) > 0 {
		if err := r.buf.UpdateMask(nil, o.mask); err != nil {
			return err
		}
		mt := 0
		for _, t := range o.tokens {
			mt = max(mt, t)
		}
		if _, err := r.shape(mt, ep.LLBF16, 1<<uint(o.mask)); err != nil {
			return err
		}
		got, err := r.buf.MaskedRanks()
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != o.mask {
			r.rep.fail("mask", "report", "masked ranks %v, want [%d]", got, o.mask)
		} else {
			r.rep.ok("mask", "report", "rank %d reported masked", o.mask)
		}
		if err := r.buf.ClearMask(nil); err != nil {
			return err
		}
	}
	for _, t := range o.tokens {
		for _, f := range o.formats {
			if !timed[[2]int{t, int(f)}] {
				continue // a shape that failed its check on some rank is not timed on any
			}
			if err := r.time(t, f); err != nil {
				return err
			}
		}
	}
	if !o.trace {
		return nil
	}
	for _, t := range o.tokens {
		for _, f := range o.formats {
			if !timed[[2]int{t, int(f)}] {
				continue
			}
			if err := r.traceShape(t, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// llShape is one (tokens, format)'s inputs and outputs on this rank.
type llShape struct {
	dargs  ep.LLDispatchArgs
	y, out ep.Tensor
}

func (r *llRank) newShape(t int, f ep.LLFormat, mine lowlatency.RankInput) (*llShape, error) {
	o := r.o
	var ptrs [4]uintptr
	for i, b := range [][]byte{llAsBytes(mine.X), llAsBytes(mine.TopK), llAsBytes(mine.Weights), make([]byte, 2*t*o.hidden)} {
		var err error
		if ptrs[i], err = r.upload(b); err != nil {
			return nil, err
		}
	}
	return &llShape{
		dargs: ep.LLDispatchArgs{X: ep.NewTensor(ptrs[0], ep.BF16, t, o.hidden), TopKIdx: ep.NewTensor(ptrs[1], ep.I64, t, o.topk),
			TopKWeights: ep.NewTensor(ptrs[2], ep.F32, t, o.topk), Format: f},
		out: ep.NewTensor(ptrs[3], ep.BF16, t, o.hidden),
	}, nil
}

// shape checks one (tokens, format) against the reference (masked: with
// those ranks masked) and reports whether every rank passed.
func (r *llRank) shape(t int, f ep.LLFormat, masked uint32) (bool, error) {
	o := r.o
	ins := make([]lowlatency.RankInput, r.ranks)
	for s := range ins {
		ins[s] = o.input(s, t)
	}
	sh, err := r.newShape(t, f, ins[r.rank])
	if err != nil {
		return false, err
	}
	name := fmt.Sprintf("T=%d %s", t, f)
	section := "check"
	if masked != 0 {
		section, name = "mask", fmt.Sprintf("T=%d rank %d masked", t, o.mask)
	}
	lc := lowlatency.Config{Ranks: r.ranks, MaxTokens: o.config().MaxTokens, Hidden: o.hidden, TopK: o.topk,
		LocalExperts: o.experts / r.ranks, FP8: o.config().FP8}
	want, err := lowlatency.ReferenceDispatch(lc, ins, lowlatency.Options{Format: lowlatency.Format(f), Masked: masked})
	if err != nil {
		return false, err
	}
	res, err := r.buf.Dispatch(sh.dargs)
	if err != nil {
		return false, err
	}
	if err := r.buf.Stream().Synchronize(); err != nil {
		return false, err
	}
	if err := r.buf.Check(); err != nil {
		return false, err
	}
	// Dispatch: counts, every received row (and scales), no invalid ids.
	got, err := r.buf.HostCounts(res.Handle)
	if err != nil {
		return false, err
	}
	rv := want[r.rank]
	slots := r.buf.Slots()
	rowBytes := lc.RowBytes(lowlatency.Format(f))
	bad := ""
	if err := r.buf.InvalidIDs(res.Handle); err != nil {
		bad = err.Error()
	}
	if sh.y, err = r.buf.NextCombineBuffer(res.Handle); err != nil {
		return false, err
	}
	for l, rows := range rv.Experts {
		if got[l] != len(rows) {
			bad = fmt.Sprintf("expert %d: %d rows, want %d", l, got[l], len(rows))
			break
		}
		if len(rows) == 0 {
			continue
		}
		raw := make([]byte, len(rows)*rowBytes)
		if err := r.dev.CopyOut(raw, res.RecvX.Ptr+uintptr(l*slots*rowBytes)); err != nil {
			return false, err
		}
		for p, row := range rows {
			wantRow := row.X8
			if f == ep.LLBF16 {
				wantRow = llAsBytes(row.X)
			}
			if string(raw[p*rowBytes:(p+1)*rowBytes]) != string(wantRow) && bad == "" {
				bad = fmt.Sprintf("expert %d row %d differs", l, p)
			}
		}
		if f == ep.LLUE8M0 || f == ep.LLFP8 {
			per := res.RecvScales.Shape[2]
			sc := make([]uint32, len(rows)*per)
			if err := r.dev.CopyOut(llAsBytes(sc), res.RecvScales.Ptr+uintptr(4*l*slots*per)); err != nil {
				return false, err
			}
			for p, row := range rows {
				ws := llAsBytesU32(row.Scales)
				if f == ep.LLUE8M0 {
					ws = lowlatency.PackExps(row.Exps)
				}
				for i := range ws {
					if ws[i] != sc[p*per+i] && bad == "" {
						bad = fmt.Sprintf("expert %d row %d: scale %d differs", l, p, i)
					}
				}
			}
		}
		// The experts' outputs, into the zero-copy buffer.
		y := make([]uint16, 0, len(rows)*o.hidden)
		for p, row := range rows {
			y = append(y, expertOutput(f, row, p, o.hidden)...)
		}
		if err := r.dev.CopyIn(sh.y.Ptr+uintptr(2*l*slots*o.hidden), llAsBytes(y)); err != nil {
			return false, err
		}
	}
	if bad == "" {
		r.rep.ok(section, name+" dispatch", "%d rows received, every one as the reference", sumInts(got))
	} else {
		r.rep.fail(section, name+" dispatch", "%s", bad)
	}
	// Every rank's combine input, for the reference (the same rule).
	cins := make([]lowlatency.CombineInput, r.ranks)
	for d := range cins {
		cins[d].Y = make([][][]uint16, len(want[d].Experts))
		for l, rows := range want[d].Experts {
			for p, row := range rows {
				cins[d].Y[l] = append(cins[d].Y[l], expertOutput(f, row, p, o.hidden))
			}
		}
	}
	wantOut, err := lowlatency.ReferenceCombine(lc, ins, want, cins, false, lowlatency.Options{Masked: masked})
	if err != nil {
		return false, err
	}
	if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: res.Handle, Y: sh.y, Out: sh.out}); err != nil {
		return false, err
	}
	if err := r.buf.Stream().Synchronize(); err != nil {
		return false, err
	}
	gotOut := make([]uint16, t*o.hidden)
	if err := r.dev.CopyOut(llAsBytes(gotOut), sh.out.Ptr); err != nil {
		return false, err
	}
	diff := 0
	for i := range gotOut {
		if gotOut[i] != wantOut[r.rank][i] {
			diff++
		}
	}
	if diff == 0 {
		r.rep.ok(section, name+" combine", "%d tokens, bit for bit as the reference", t)
	} else {
		r.rep.fail(section, name+" combine", "%d of %d elements differ", diff, len(gotOut))
	}
	if masked == 0 {
		r.shapes[[2]int{t, int(f)}] = sh
	}
	// Every rank takes the same branch: a shape some rank failed is not
	// timed anywhere (a rank that skips calls would leave peers waiting).
	return r.step.all(bad == "" && diff == 0)
}

func llAsBytesU32(s []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

func sumInts(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// time measures one checked shape by llTimingRules: dispatch alone,
// combine (after an untimed dispatch), then the same captured in CUDA
// graphs and replayed: dispatch, combine, dispatch+combine.
func (r *llRank) time(t int, f ep.LLFormat) error {
	sh := r.shapes[[2]int{t, int(f)}]
	var last *ep.LLDispatchResult
	dispatch := func() error {
		res, err := r.buf.Dispatch(sh.dargs)
		if err == nil {
			last = res
		}
		return err
	}
	// Y: the check's zero-copy buffer (any device memory of the rank
	// serves; the send step reads it locally).
	combine := func() error {
		_, err := r.buf.Combine(ep.LLCombineArgs{Handle: last.Handle, Y: sh.y, Out: sh.out})
		return err
	}
	both := func() error {
		if err := dispatch(); err != nil {
			return err
		}
		return combine()
	}
	us, err := r.timeCalls(nil, dispatch)
	if err != nil {
		return err
	}
	r.record(t, f, "dispatch", false, us)
	if us, err = r.timeCalls(dispatch, combine); err != nil {
		return err
	}
	r.record(t, f, "combine", false, us)
	if !r.o.graph {
		return nil
	}
	// The dispatch graph replays one dispatch on one set; the combine
	// graph combines that set, so it runs after a dispatch replay.
	st := r.buf.Stream()
	var graphs []device.Graph
	defer func() {
		for _, g := range graphs {
			_ = g.Close()
		}
	}()
	for _, issue := range []func() error{dispatch, combine, both} {
		g, err := r.dev.Capture(st, issue)
		if err != nil {
			return err
		}
		graphs = append(graphs, g)
	}
	launch := func(g device.Graph) func() error { return func() error { return g.Launch(st) } }
	if us, err = r.timeCalls(nil, launch(graphs[0])); err != nil {
		return err
	}
	r.record(t, f, "dispatch", true, us)
	if us, err = r.timeCalls(launch(graphs[0]), launch(graphs[1])); err != nil {
		return err
	}
	r.record(t, f, "combine", true, us)
	if us, err = r.timeCalls(nil, launch(graphs[2])); err != nil {
		return err
	}
	r.record(t, f, "dispatch+combine", true, us)
	return r.timeBurst(t, f, dispatch, both)
}

// timeBurst times o.burst dispatches, then o.burst dispatch+combine
// pairs, each captured back to back in one graph (the sets alternate as
// they do call by call), and records the per-call mean of a replay. The
// figures above pace every call on the host, so a call's time includes
// waiting for the last rank's launch; inside one replay the calls follow
// each other on the GPU, as in an engine's captured decode step. Not where
// ranks share a GPU (many dependent launches queued by every rank: the
// head-of-line risk of DESIGN.md).
func (r *llRank) timeBurst(t int, f ep.LLFormat, dispatch, both func() error) error {
	n := r.o.burst
	if n == 0 || r.o.shared {
		return nil
	}
	st := r.buf.Stream()
	for _, c := range []struct {
		op   string
		call func() error
	}{{"dispatch", dispatch}, {"dispatch+combine", both}} {
		g, err := r.dev.Capture(st, func() error {
			for i := 0; i < n; i++ {
				if err := c.call(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		us, err := r.timeCalls(nil, func() error { return g.Launch(st) })
		if cerr := g.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		r.record(t, f, fmt.Sprintf("%s x%d", c.op, n), true, us/float64(n))
	}
	return nil
}

func (r *llRank) record(t int, f ep.LLFormat, op string, graph bool, us float64) {
	r.figs = append(r.figs, llFigure{Tokens: t, Format: f.String(), Op: op, Graph: graph, US: us})
	if r.rank == 0 {
		g := ""
		if graph {
			g = " (graph)"
		}
		r.o.progress.printf("T=%d %s %s%s: %.1f us (rank 0)", t, f, op, g, us)
	}
}

// pace ends one issued step: ranks sharing a GPU synchronise their stream
// first (a launch queued behind a rank's spinning kernel must not be one
// that kernel waits for: lowlatency's DESIGN.md), and no rank issues its
// next step before every rank has issued this one.
func (r *llRank) pace() error {
	if r.o.shared {
		if err := r.buf.Stream().Synchronize(); err != nil {
			return err
		}
	}
	_, err := r.step.all(true)
	return err
}

// timeCalls runs the warm-ups, flushes L2, then runs iters calls each
// between its own two events (before runs untimed first, outside the
// events) and returns the mean GPU time of all but the first.
func (r *llRank) timeCalls(before, call func() error) (float64, error) {
	o := r.o
	st := r.buf.Stream()
	evs := make([]device.Event, 2*o.iters)
	defer func() {
		for _, e := range evs {
			if e != nil {
				e.Close()
			}
		}
	}()
	for i := range evs {
		var err error
		if evs[i], err = r.dev.NewEvent(); err != nil {
			return 0, err
		}
	}
	// i < 0: a warm-up.
	step := func(i int) error {
		if before != nil {
			if err := before(); err != nil {
				return err
			}
		}
		if i >= 0 {
			if err := evs[2*i].Record(st); err != nil {
				return err
			}
		}
		if err := call(); err != nil {
			return err
		}
		if i >= 0 {
			if err := evs[2*i+1].Record(st); err != nil {
				return err
			}
		}
		return r.pace()
	}
	for i := 0; i < o.warmup; i++ {
		if err := step(-1); err != nil {
			return 0, err
		}
	}
	if r.flush.Size > 0 {
		if err := r.dev.MemsetAsync(r.flush.Ptr, 0, r.flush.Size, st); err != nil {
			return 0, err
		}
	}
	for i := 0; i < o.iters; i++ {
		if err := step(i); err != nil {
			return 0, err
		}
	}
	if err := evs[2*o.iters-1].Synchronize(); err != nil {
		return 0, err
	}
	if err := r.buf.Check(); err != nil {
		return 0, err
	}
	us := 0.0
	for i := 1; i < o.iters; i++ {
		el, err := r.dev.Elapsed(evs[2*i], evs[2*i+1])
		if err != nil {
			return 0, err
		}
		us += float64(el) / float64(time.Microsecond)
	}
	return us / float64(o.iters-1), nil
}
