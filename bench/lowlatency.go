package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
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
	warmup, iters         int
	ranks, sms            int
	timeout               time.Duration
	jsonPath              string
	progress              *progress
}

// llFigure is one timing (rank 0's): mean GPU time per call, DeepEP's rule
// (each call between its own two events, back to back, the first dropped).
type llFigure struct {
	Tokens int     `json:"tokens"`
	Format string  `json:"format"`
	Op     string  `json:"op"` // dispatch, combine, dispatch+combine
	Graph  bool    `json:"graph"`
	US     float64 `json:"us"`
}

type llReport struct {
	Command string     `json:"command"`
	Backend string     `json:"backend"`
	Ranks   int        `json:"ranks"`
	Hidden  int        `json:"hidden"`
	TopK    int        `json:"topk"`
	Experts int        `json:"experts"`
	Note    string     `json:"note,omitempty"`
	Checks  []check    `json:"checks"`
	Figures []llFigure `json:"figures"`
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
	fs.IntVar(&o.warmup, "warmup", 20, "untimed calls before the timed ones (host backend: 1 unless given)")
	fs.IntVar(&o.iters, "iters", 50, "timed calls; the first is dropped (host backend: 3 unless given)")
	fs.IntVar(&o.ranks, "ranks", 0, "goroutine ranks (default: every GPU up to 8, or 4 host ranks); more ranks than GPUs share them")
	fs.IntVar(&o.sms, "sms", 0, "grid of every launch (0: the library's default within this rank's share of its GPU)")
	gpus := addGPUsFlag(fs)
	fs.DurationVar(&o.timeout, "timeout", 0, "device-side wait timeout (default $GOEP_CHANNEL_TIMEOUT or 60s)")
	fs.StringVar(&o.jsonPath, "json", "", "also write checks and figures as JSON to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	var err error
	if o.kind, _, err = device.ParseKind(*backend); err != nil {
		return err
	}
	if err := gpus.apply(o.kind); err != nil {
		return err
	}
	set := given(fs)
	if o.kind == device.Host {
		if !set["warmup"] {
			o.warmup = 1
		}
		if !set["iters"] {
			o.iters = 3
		}
	}
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
	if o.iters < 2 || o.warmup < 0 || o.ranks < 0 || o.sms < 0 || o.timeout < 0 {
		return errors.New("want --iters >= 2 and non-negative --warmup, --ranks, --sms, --timeout")
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
	if o.mask >= n {
		return fmt.Errorf("--mask %d: outside the world of %d ranks", o.mask, n)
	}
	if _, err := ep.LowLatencySizeHint(o.config(), n); err != nil {
		return err
	}
	o.progress = newProgress(stderr)
	o.progress.printf("%d goroutine ranks, %s backend: setting up low-latency buffers", n, o.kind)
	rep := llReport{Command: "lowlatency", Backend: string(o.kind), Ranks: n, Hidden: o.hidden, TopK: o.topk, Experts: o.experts,
		Note: sharedGPUNote(o.kind, n)}
	if rep.Note != "" {
		fmt.Fprintln(stdout, "note:", rep.Note)
	}
	boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
	if err != nil {
		return err
	}
	reps := make([]report, n)
	figs := make([][]llFigure, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer boots[r].Close()
			dev, err := device.OpenRank(o.kind, r)
			if err != nil {
				errs[r] = err
				_ = boots[r].Close()
				return
			}
			defer dev.Close()
			lr := &llRank{o: o, rank: r, ranks: n, dev: dev, rep: &reps[r]}
			errs[r] = lr.run(ctx, boots[r])
			figs[r] = lr.figs
			if errs[r] != nil {
				_ = boots[r].Close() // the others fail fast
			}
		}()
	}
	wg.Wait()
	if err := interrupted(ctx); err != nil {
		return err
	}
	rep.Checks, rep.Figures = reps[0].Checks, figs[0]
	for r := 1; r < n; r++ {
		for _, c := range reps[r].Checks {
			if c.Status == "fail" {
				rep.Checks = append(rep.Checks, c)
			}
		}
	}
	for _, f := range rep.Figures {
		g := ""
		if f.Graph {
			g = " (graph)"
		}
		rep.Checks = append(rep.Checks, check{Section: "timing", Name: fmt.Sprintf("T=%d %s %s%s", f.Tokens, f.Format, f.Op, g),
			Result: fmt.Sprintf("%.1f us (rank 0)", f.US), Status: "info"})
	}
	(&report{Checks: rep.Checks}).print(stdout)
	if err := writeJSON(o.jsonPath, rep); err != nil {
		return err
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
		Timeout: o.timeout}
}

// llRank is one rank's benchmark state.
type llRank struct {
	o           llOpts
	rank, ranks int
	dev         device.Device
	buf         *ep.LowLatencyBuffer
	rep         *report
	figs        []llFigure
	bufs        []device.Buffer
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
		for _, b := range r.bufs {
			err = errors.Join(err, r.dev.Free(b))
		}
	}()
	for _, t := range o.tokens {
		for _, f := range o.formats {
			if err := r.shape(t, f, 0); err != nil {
				return err
			}
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
		if err := r.shape(mt, ep.LLBF16, 1<<uint(o.mask)); err != nil {
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
	return nil
}

// shape checks one (tokens, format) against the reference, then times it
// (unless masked: the mask check only checks).
func (r *llRank) shape(t int, f ep.LLFormat, masked uint32) error {
	o := r.o
	ins := make([]lowlatency.RankInput, r.ranks)
	for s := range ins {
		ins[s] = o.input(s, t)
	}
	mine := ins[r.rank]
	xp, err := r.upload(llAsBytes(mine.X))
	if err != nil {
		return err
	}
	ip, err := r.upload(llAsBytes(mine.TopK))
	if err != nil {
		return err
	}
	wp, err := r.upload(llAsBytes(mine.Weights))
	if err != nil {
		return err
	}
	op, err := r.upload(make([]byte, 2*t*o.hidden))
	if err != nil {
		return err
	}
	x := ep.NewTensor(xp, ep.BF16, t, o.hidden)
	ids := ep.NewTensor(ip, ep.I64, t, o.topk)
	w := ep.NewTensor(wp, ep.F32, t, o.topk)
	out := ep.NewTensor(op, ep.BF16, t, o.hidden)
	dargs := ep.LLDispatchArgs{X: x, TopKIdx: ids, TopKWeights: w, Format: f}
	name := fmt.Sprintf("T=%d %s", t, f)
	section := "check"
	if masked != 0 {
		section, name = "mask", fmt.Sprintf("T=%d rank %d masked", t, o.mask)
	}
	lc := lowlatency.Config{Ranks: r.ranks, MaxTokens: o.config().MaxTokens, Hidden: o.hidden, TopK: o.topk,
		LocalExperts: o.experts / r.ranks, FP8: o.config().FP8}
	want, err := lowlatency.ReferenceDispatch(lc, ins, lowlatency.Options{Format: lowlatency.Format(f), Masked: masked})
	if err != nil {
		return err
	}
	res, err := r.buf.Dispatch(dargs)
	if err != nil {
		return err
	}
	if err := r.buf.Stream().Synchronize(); err != nil {
		return err
	}
	if err := r.buf.Check(); err != nil {
		return err
	}
	// Dispatch: counts and every received row (and scales).
	got, err := r.buf.HostCounts(res.Handle)
	if err != nil {
		return err
	}
	rv := want[r.rank]
	slots := r.buf.Slots()
	rowBytes := lc.RowBytes(lowlatency.Format(f))
	bad := ""
	y := make([]uint16, 0)
	cin := lowlatency.CombineInput{Y: make([][][]uint16, len(rv.Experts))}
	yt, err := r.buf.NextCombineBuffer(res.Handle)
	if err != nil {
		return err
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
			return err
		}
		for p, row := range rows {
			var wantRow []byte
			if f == ep.LLBF16 {
				wantRow = llAsBytes(row.X)
			} else {
				wantRow = row.X8
			}
			if string(raw[p*rowBytes:(p+1)*rowBytes]) != string(wantRow) && bad == "" {
				bad = fmt.Sprintf("expert %d row %d differs", l, p)
			}
		}
		if f == ep.LLUE8M0 || f == ep.LLFP8 {
			per := res.RecvScales.Shape[2]
			sc := make([]uint32, len(rows)*per)
			if err := r.dev.CopyOut(llAsBytes(sc), res.RecvScales.Ptr+uintptr(4*l*slots*per)); err != nil {
				return err
			}
			for p, row := range rows {
				var ws []uint32
				if f == ep.LLUE8M0 {
					ws = lowlatency.PackExps(row.Exps)
				} else {
					ws = llAsBytesU32(row.Scales)
				}
				for i := range ws {
					if ws[i] != sc[p*per+i] && bad == "" {
						bad = fmt.Sprintf("expert %d row %d: scale %d differs", l, p, i)
					}
				}
			}
		}
		// The experts' outputs: y = row p scaled by (p%3+1)/4, into the
		// zero-copy buffer.
		y = y[:0]
		for p, row := range rows {
			yr := make([]uint16, o.hidden)
			for i := range yr {
				var v float32
				if f == ep.LLBF16 {
					v = kernels.BF16ToFloat32(row.X[i])
				} else {
					v = kernels.FP8E4M3ToFloat32(row.X8[i]) * row.Scales[i/lowlatency.FP8Block]
				}
				yr[i] = kernels.Float32ToBF16(v * float32(p%3+1) / 4)
			}
			cin.Y[l] = append(cin.Y[l], yr)
			y = append(y, yr...)
		}
		if err := r.dev.CopyIn(yt.Ptr+uintptr(2*l*slots*o.hidden), llAsBytes(y)); err != nil {
			return err
		}
	}
	if bad == "" {
		r.rep.ok(section, name+" dispatch", "%d rows received, every one as the reference", sumInts(got))
	} else {
		r.rep.fail(section, name+" dispatch", "%s", bad)
	}
	// Every rank's combine input, for the reference (the same y rule).
	cins := make([]lowlatency.CombineInput, r.ranks)
	for d := range cins {
		cins[d].Y = make([][][]uint16, len(want[d].Experts))
		for l, rows := range want[d].Experts {
			for p, row := range rows {
				yr := make([]uint16, o.hidden)
				for i := range yr {
					var v float32
					if f == ep.LLBF16 {
						v = kernels.BF16ToFloat32(row.X[i])
					} else {
						v = kernels.FP8E4M3ToFloat32(row.X8[i]) * row.Scales[i/lowlatency.FP8Block]
					}
					yr[i] = kernels.Float32ToBF16(v * float32(p%3+1) / 4)
				}
				cins[d].Y[l] = append(cins[d].Y[l], yr)
			}
		}
	}
	wantOut, err := lowlatency.ReferenceCombine(lc, ins, want, cins, false, lowlatency.Options{Masked: masked})
	if err != nil {
		return err
	}
	if _, err := r.buf.Combine(ep.LLCombineArgs{Handle: res.Handle, Y: yt, Out: out}); err != nil {
		return err
	}
	if err := r.buf.Stream().Synchronize(); err != nil {
		return err
	}
	gotOut := make([]uint16, t*o.hidden)
	if err := r.dev.CopyOut(llAsBytes(gotOut), op); err != nil {
		return err
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
	if masked != 0 || bad != "" || diff != 0 {
		return nil
	}
	return r.time(t, f, dargs, yt, out)
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

// time measures dispatch, combine (each after an untimed dispatch) and, on
// request, dispatch+combine captured in a graph.
func (r *llRank) time(t int, f ep.LLFormat, dargs ep.LLDispatchArgs, y, out ep.Tensor) error {
	o := r.o
	st := r.buf.Stream()
	var last *ep.LLDispatchResult
	dispatch := func() error {
		res, err := r.buf.Dispatch(dargs)
		last = res
		return err
	}
	combine := func() error {
		_, err := r.buf.Combine(ep.LLCombineArgs{Handle: last.Handle, Y: y, Out: out})
		return err
	}
	us, err := r.timeCalls(st, nil, dispatch)
	if err != nil {
		return err
	}
	r.record(t, f, "dispatch", false, us)
	if us, err = r.timeCalls(st, dispatch, combine); err != nil {
		return err
	}
	r.record(t, f, "combine", false, us)
	if !o.graph {
		return nil
	}
	g, err := r.dev.Capture(st, func() error {
		if err := dispatch(); err != nil {
			return err
		}
		return combine()
	})
	if err != nil {
		return err
	}
	defer g.Close()
	if us, err = r.timeCalls(st, nil, func() error { return g.Launch(st) }); err != nil {
		return err
	}
	r.record(t, f, "dispatch+combine", true, us)
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

// timeCalls runs warmup calls, then iters calls each between its own two
// events (before runs untimed first, outside the events), and returns the
// mean GPU time of all but the first.
func (r *llRank) timeCalls(st device.Stream, before, call func() error) (float64, error) {
	o := r.o
	step := func() error {
		if before != nil {
			if err := before(); err != nil {
				return err
			}
		}
		return call()
	}
	for i := 0; i < o.warmup; i++ {
		if err := step(); err != nil {
			return 0, err
		}
	}
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
	for i := 0; i < o.iters; i++ {
		if before != nil {
			if err := before(); err != nil {
				return 0, err
			}
		}
		if err := evs[2*i].Record(st); err != nil {
			return 0, err
		}
		if err := call(); err != nil {
			return 0, err
		}
		if err := evs[2*i+1].Record(st); err != nil {
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
