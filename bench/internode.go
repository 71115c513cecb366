package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/goep-dev/goep/buffer"
	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/routing"
)

func init() {
	register("internode", "check internode dispatch/combine (virtual nodes: --nodes) through the ep API against the reference, then time them; network and NVLink bytes apart, as DeepEP reports", runInternode)
}

// `ep-bench internode`: the ranks split into nodes (--nodes k virtual
// nodes of this host, or the hosts of a launch), so the Buffer runs the
// internode mode. Checks first (non-cached and cached dispatch byte for
// byte against internode.ReferenceDispatch, combine bit for bit against
// internode.ReferenceCombine), then timings. Bytes per call come from the
// reference's Traffic: network (rows that cross between nodes) and NVLink
// (rows between two ranks of a node), and DeepEP's own figures (RDMA send
// and NVL receive, which count a rank's traffic with itself).

// interOpts are `ep-bench internode`'s flags: the intranode subcommand's
// and its own.
type interOpts struct {
	inOpts
	// split is --split (internode.ParseSplit's forms; "" leaves
	// $GOEP_INTERNODE_SPLIT as it is), sweep is --sweep.
	split string
	sweep bool
	// splitTag marks the figures of one sweep candidate; noPut skips the
	// port put timing (sweep runs after the first).
	splitTag string
	noPut    bool
	// traceProxy is --trace-proxy; traceKernels --trace-kernels (implies
	// traceProxy).
	traceProxy, traceKernels bool
}

// interOutcome is one rank's result, gathered on rank 0.
type interOutcome struct {
	Device string    `json:"device"`
	Mode   string    `json:"mode"`
	Split  string    `json:"split"` // the grid's split into roles in use (rank's)
	Memory ep.Memory `json:"buffer_memory"`
	// NetworkStaging is the Buffer's SizeHint.NetworkStaging.
	NetworkStaging int           `json:"network_staging_bytes"`
	Checks         []check       `json:"checks"`
	Figures        []interFigure `json:"figures"`
	Traces         []interTrace  `json:"proxy_traces,omitempty"`
	Err            string        `json:"error,omitempty"`
}

func (o interOutcome) failure() string      { return o.Err }
func (o *interOutcome) setFailure(m string) { o.Err = m }

// interFigure is one timed quantity on one rank with its bytes per link.
type interFigure struct {
	Key     inKey   `json:"key"`
	US      float64 `json:"us"`
	Traffic interBytes
	// Put is rank 0's port-channel put timing of the same network bytes
	// (measureInterPuts; zero elsewhere and when not measured).
	Put interPut
}

// interBytes are one call's payload bytes on one rank (internode.Traffic).
type interBytes struct {
	Network    int64 `json:"network_bytes"`    // dispatch: sent to other nodes; combine: partials sent
	NVLink     int64 `json:"nvlink_bytes"`     // dispatch: received from another rank's forwarding; combine: sent to a forwarder
	DeepEPRDMA int64 `json:"deepep_rdma_send"` // every (token, node) pair, own node included
	DeepEPNVL  int64 `json:"deepep_nvl_recv"`  // every row received (dispatch) or reduced (combine)
}

func dispatchBytes(t internode.Traffic) interBytes {
	return interBytes{Network: t.NetworkSend.Bytes, NVLink: t.NVLinkRecv.Bytes, DeepEPRDMA: t.RDMASend.Bytes, DeepEPNVL: t.NVLRecv.Bytes}
}

func combineBytes(t internode.Traffic) interBytes {
	return interBytes{Network: t.NetworkSend.Bytes, NVLink: t.NVLinkSend.Bytes, DeepEPRDMA: t.RDMASend.Bytes, DeepEPNVL: t.NVLRecv.Bytes}
}

func runInternode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("internode", stderr)
	var xo interOpts
	o := &xo.inOpts
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	tokens := fs.String("tokens", "4096", "tokens per rank, a comma-separated list (a sweep)")
	fs.IntVar(&o.hidden, "hidden", 7168, "hidden size")
	fs.IntVar(&o.topk, "topk", 8, "experts per token")
	fs.IntVar(&o.experts, "experts", 256, "experts in all")
	fs.IntVar(&o.masked, "masked", 0, "random (token, slot) entries set to -1")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the routing (top-k of |randn|+1 scores, as DeepEP's test) and the data")
	fs.BoolVar(&o.fp8, "fp8", false, "also dispatch FP8 rows (float32 scale per 128 elements)")
	hostTiming := addTimingFlags(fs, &o.warmup, &o.iters, &o.flushMiB, timingDefaults{warmup: 50, iters: 50, hostWarmup: 2, hostIters: 5})
	fs.IntVar(&o.ranks, "ranks", 0, "goroutine ranks when run without a launcher (default: every GPU up to 8, or 4 host ranks); more ranks than GPUs share them")
	fs.IntVar(&o.nodes, "nodes", 0, "virtual nodes of this host the ranks split into (must divide the ranks; 0: $GOEP_VIRTUAL_NODES, else 2 for goroutine ranks; a launch's hosts are nodes of their own)")
	gpus := addGPUsFlag(fs)
	fs.DurationVar(&o.timeout, "timeout", 0, "device-side wait timeout (default $GOEP_CHANNEL_TIMEOUT or 60s)")
	fs.StringVar(&o.jsonPath, "json", "", "also write checks and figures as JSON to this file (rank 0)")
	interSMs := fs.Int("sms", 0, "blocks of the internode dispatch and combine kernels (0: the Buffer's default over the network transport, internode.DefaultSMsOver, within the spin budget of ranks sharing a GPU)")
	interThreads := fs.Int("threads", 0, "threads per block of the internode dispatch and combine kernels (0: internode.DefaultThreads)")
	fs.StringVar(&xo.split, "split", "", "the internode grid's blocks as senders,forwarders,receivers (e.g. 4,8,4: the grid is their total), shared (every block every role) or default (internode.DefaultSplit of the grid); empty: $"+internode.SplitEnv+" or the default")
	fs.BoolVar(&xo.traceProxy, "trace-proxy", false, "after the timings, trace one cached dispatch, one combine and one all-ranks port put with the channels proxy trace on and print where the network leg's time goes (rank 0 and the slowest rank)")
	fs.BoolVar(&xo.traceKernels, "trace-kernels", false, "compile the internode kernels with their phase trace ("+kernelflags.EnvInnTrace+"=1, measurement only; implies --trace-proxy) and print each traced call's per-block phase stamps")
	fs.BoolVar(&xo.sweep, "sweep", false, "after the run, time cached dispatch and combine (first --tokens, BF16) under a small grid of splits of the --sms grid and print the best")
	kind, set, err := parseBackend(fs, args, backend, gpus)
	if err != nil {
		return err
	}
	o.kind = kind
	hostTiming(kind, set)
	if o.tokens, err = parseIntList(*tokens); err != nil {
		return fmt.Errorf("--tokens: %w", err)
	}
	o.tuneIters, o.sms, o.tuneSMs = 2, []int{0}, nil
	if *interSMs < 0 || *interThreads < 0 {
		return fmt.Errorf("--sms %d, --threads %d: want >= 0", *interSMs, *interThreads)
	}
	o.interSMs, o.interThreads = *interSMs, *interThreads
	if err := o.validate(); err != nil {
		return err
	}
	// Before any kernel is compiled: the trace build (--trace-kernels, or
	// $GOEP_INN_TRACE=1 alone) is frozen with the first compile.
	if xo.traceKernels, err = applyInnTrace(xo.traceKernels); err != nil {
		return err
	}
	xo.traceProxy = xo.traceProxy || xo.traceKernels
	if xo.split != "" {
		sp, err := internode.ParseSplit(xo.split)
		if err != nil {
			return fmt.Errorf("--split: %w", err)
		}
		if t := sp.Total(); t > 0 && o.interSMs != 0 && o.interSMs != t {
			return fmt.Errorf("--split %s is a grid of %d blocks, --sms %d: give one, or the same total", sp, t, o.interSMs)
		}
		// The Buffer reads its split from the environment (package
		// buffer); set before any rank makes one.
		if err := os.Setenv(internode.SplitEnv, sp.String()); err != nil {
			return err
		}
	}
	if xo.sweep && len(sweepSplits(o.interSMs)) == 0 {
		return fmt.Errorf("--sweep: no split of %d blocks", o.interSMs)
	}
	if o.nodes < 0 {
		return fmt.Errorf("--nodes %d: want a count that divides the ranks", o.nodes)
	}
	o.progress = newProgress(stderr)
	env, err := launcherEnv("internode", o.kind)
	if err != nil {
		return err
	}
	if env.Size > 1 {
		return internodeProcess(ctx, env, xo, stdout)
	}
	n, err := goroutineRanks("internode", o.kind, o.ranks, 8, 2)
	if err != nil {
		return err
	}
	if o.nodes == 0 {
		// Goroutine ranks share one host: without a split they would be
		// one node, which is the intranode subcommand's work.
		if t, err := internode.ParseVirtualNodes(envVirtualNodes(), n); err != nil {
			return err
		} else if o.nodes = t.Nodes; o.nodes == 1 {
			o.nodes = 2
		}
	}
	if _, err := internode.VirtualNodes(n, o.nodes); err != nil {
		return fmt.Errorf("--nodes: %w", err)
	}
	if _, err := ep.SizeHints(o.interConfig(n), n); err != nil {
		return err
	}
	cache := &interCache{o: *o, ranks: n, nodes: o.nodes}
	runAll := func(xo interOpts) ([]interOutcome, error) {
		boots, err := bootstrap.NewInProcess(n, bootstrap.Config{})
		if err != nil {
			return nil, err
		}
		outs := make([]interOutcome, n)
		errs := onGoroutineRanks(xo.kind, boots, func(r int, dev device.Device) error {
			outs[r] = internodeRank(ctx, boots[r], dev, xo, cache, r == 0)
			if outs[r].Err != "" {
				return errors.New(outs[r].Err)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil && outs[r].Err == "" {
				outs[r].Err = err.Error()
			}
		}
		return outs, interrupted(ctx)
	}
	o.progress.printf("%d goroutine ranks in %d virtual nodes, %s backend: setting up buffers", n, o.nodes, o.kind)
	outs, err := runAll(xo)
	if err != nil {
		return err
	}
	sweep, err := runSweep(xo, func(c interOpts) ([]interOutcome, error) { return runAll(c) })
	if err != nil {
		return err
	}
	return reportInternode(stdout, xo, n, fmt.Sprintf("goroutines, %d virtual nodes", o.nodes), outs, sweep)
}

// sweepSplits are the splits --sweep times for a grid of sms blocks (0:
// the Buffer's default grid over the network transport in use,
// buffer.NetworkTuningFromEnv's SMs): shared, then senders and receivers
// of an eighth, a quarter and three eighths of the grid each (at least
// one), the rest forwarders (at least one).
func sweepSplits(sms int) []internode.Split {
	g := sms
	if g == 0 {
		g = internode.DefaultSMs
		if nw, err := buffer.NetworkTuningFromEnv(); err == nil {
			g = nw.SMs
		}
	}
	out := []internode.Split{{Shared: true}}
	seen := map[internode.Split]bool{}
	for _, s := range []int{g / 8, g / 4, 3 * g / 8} {
		for _, r := range []int{g / 8, g / 4} {
			sp := internode.Split{Senders: max(1, s), Receivers: max(1, r)}
			sp.Forwarders = g - sp.Senders - sp.Receivers
			if sp.Forwarders < 1 || seen[sp] {
				continue
			}
			seen[sp] = true
			out = append(out, sp)
		}
	}
	return out
}

// interSweepRow is one split's rank-0 timings of cached dispatch and
// combine (BF16).
type interSweepRow struct {
	Split      string  `json:"split"`
	Tokens     int     `json:"tokens"`
	DispatchUS float64 `json:"dispatch_us"`
	CombineUS  float64 `json:"combine_us"`
	Err        string  `json:"error,omitempty"`
}

// runSweep runs every sweep split (nothing without --sweep): each a fresh
// Buffer of that split (the environment variable the Buffer reads, set
// between runs while no rank runs), checked and timed at the first token
// count, BF16, without the port put timing.
func runSweep(xo interOpts, run func(interOpts) ([]interOutcome, error)) ([]interSweepRow, error) {
	if !xo.sweep {
		return nil, nil
	}
	prev, had := os.LookupEnv(internode.SplitEnv)
	defer func() {
		if had {
			_ = os.Setenv(internode.SplitEnv, prev)
		} else {
			_ = os.Unsetenv(internode.SplitEnv)
		}
	}()
	var rows []interSweepRow
	for _, sp := range sweepSplits(xo.interSMs) {
		c := xo
		c.tokens, c.fp8, c.noPut, c.splitTag = xo.tokens[:1], false, true, sp.String()
		if sp.Total() > 0 {
			c.interSMs = 0 // the split names the grid
		}
		if err := os.Setenv(internode.SplitEnv, sp.String()); err != nil {
			return nil, err
		}
		xo.progress.printf("sweep: split %s", sp)
		outs, err := run(c)
		if err != nil {
			return nil, err
		}
		row := interSweepRow{Split: sp.String(), Tokens: c.tokens[0]}
		for r, oc := range outs {
			if oc.Err != "" && row.Err == "" {
				row.Err = fmt.Sprintf("rank %d: %s", r, oc.Err)
			}
		}
		if len(outs) > 0 {
			for _, f := range outs[0].Figures {
				switch {
				case f.Key.Op == "dispatch" && strings.HasPrefix(f.Key.Mode, "cached"):
					row.DispatchUS = f.US
				case f.Key.Op == "combine":
					row.CombineUS = f.US
				}
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// bestSplit is the sweep row with the least dispatch + combine time.
func bestSplit(rows []interSweepRow) (interSweepRow, bool) {
	var best interSweepRow
	ok := false
	for _, r := range rows {
		if r.Err != "" || r.DispatchUS <= 0 || r.CombineUS <= 0 {
			continue
		}
		if !ok || r.DispatchUS+r.CombineUS < best.DispatchUS+best.CombineUS {
			best, ok = r, true
		}
	}
	return best, ok
}

// envVirtualNodes is $GOEP_VIRTUAL_NODES.
func envVirtualNodes() string { return os.Getenv(internode.VirtualNodesEnv) }

// interConfig is the Buffer configuration for ranks ranks.
func (o inOpts) interConfig(ranks int) ep.Config {
	c := o.config(ranks)
	c.VirtualNodes = o.nodes
	// The internode kernels' one grid (buffer passes Dispatch's on).
	c.Dispatch.SMs, c.Dispatch.Threads = o.interSMs, o.interThreads
	return c
}

// internodeProcess runs this process's rank of a launched job: the nodes
// are the hosts, or --nodes (launch --nodes) virtual nodes of one.
func internodeProcess(ctx context.Context, env bootstrap.EnvInfo, xo interOpts, stdout io.Writer) (err error) {
	o := xo.inOpts
	if _, err := ep.SizeHints(o.interConfig(env.Size), env.Size); err != nil {
		return err
	}
	bs, dev, release, err := joinProcess(ctx, env, o.kind)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, release()) }()
	nodes := o.nodes
	if nodes == 0 {
		t, err := internode.ParseVirtualNodes(envVirtualNodes(), env.Size)
		if err != nil {
			return err
		}
		nodes = t.Nodes
	}
	cache := &interCache{o: o, ranks: env.Size, nodes: nodes}
	mine := internodeRank(ctx, bs, dev, xo, cache, env.Rank == 0)
	if err := interrupted(ctx); err != nil {
		return err
	}
	outs, root, err := gatherOutcomes(ctx, bs, stdout, mine)
	if err != nil {
		return err
	}
	// Every process runs the sweep's Buffers in the same order (each
	// sets its own environment between them); rank 0 reports.
	sweep, err := runSweep(xo, func(c interOpts) ([]interOutcome, error) {
		m := internodeRank(ctx, bs, dev, c, cache, env.Rank == 0)
		if err := interrupted(ctx); err != nil {
			return nil, err
		}
		outs, _, err := gatherOutcomes(ctx, bs, discardWriter{}, m)
		return outs, err
	})
	if !root || err != nil {
		return err
	}
	return reportInternode(stdout, xo, env.Size, "processes", outs, sweep)
}

// discardWriter swallows what gatherOutcomes prints for a sweep run.
type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

// interShared is every rank's input at one token count and the reference
// results, computed once per process.
type interShared struct {
	tokens   int
	shape    internode.Shape
	in, in8  []internode.RankInput
	ref      []internode.RankOutput
	ref8     []internode.RankOutput
	comb     []internode.CombineOutput
	bf16Tr   []internode.Traffic
	fp8Tr    []internode.Traffic
	combTr   []internode.Traffic
	topology internode.Topology
}

type interCache struct {
	o            inOpts
	ranks, nodes int
	mu           sync.Mutex
	cur          *interShared
	err          error
}

func (c *interCache) get(ctx context.Context, tokens int) (*interShared, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.tokens == tokens {
		return c.cur, c.err
	}
	c.cur = nil
	c.cur, c.err = prepareInterInputs(ctx, c.o, c.ranks, c.nodes, tokens)
	return c.cur, c.err
}

// prepareInterInputs draws the inputs as the intranode subcommand does
// (the same routing and rows for the same seed) and computes the internode
// reference's dispatch and combine (BF16 partials, as the Buffer sends
// them) and their traffic.
func prepareInterInputs(ctx context.Context, o inOpts, ranks, nodes, tokens int) (*interShared, error) {
	topo, err := internode.VirtualNodes(ranks, nodes)
	if err != nil {
		return nil, err
	}
	sh := &interShared{tokens: tokens, topology: topo, shape: internode.Shape{Topology: topo, Hidden: o.hidden, TopK: o.topk, Experts: o.experts},
		in: make([]internode.RankInput, ranks)}
	for r := range ranks {
		if err := interrupted(ctx); err != nil {
			return nil, err
		}
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: o.topk, Experts: o.experts, Ranks: ranks},
			routing.GenOptions{Seed: rankSeed(o.seed, r), Masked: o.masked})
		if err != nil {
			return nil, err
		}
		rng := rand.New(rand.NewPCG(o.seed, uint64(r)))
		sh.in[r] = internode.RankInput{TopK: rt.Idx, X: randomBF16(rng, tokens*o.hidden), Weights: randomF32(rng, tokens*o.topk)}
	}
	if sh.ref, err = internode.ReferenceDispatch(sh.shape, sh.in, 0); err != nil {
		return nil, err
	}
	cins := make([]internode.CombineInput, ranks)
	toks := make([]int, ranks)
	for r := range ranks {
		cins[r] = internode.CombineInput{Y: sh.ref[r].RecvX, Weights: sh.ref[r].RecvWeights}
		toks[r] = tokens
		sh.bf16Tr = append(sh.bf16Tr, sh.ref[r].Traffic)
	}
	if sh.comb, err = internode.ReferenceCombine(sh.shape, toks, sh.ref, cins, internode.CombineOptions{Partial: internode.PartialBF16}); err != nil {
		return nil, err
	}
	for r := range ranks {
		sh.combTr = append(sh.combTr, sh.comb[r].Traffic)
	}
	if o.fp8 {
		sh.in8 = make([]internode.RankInput, ranks)
		for r := range ranks {
			rng := rand.New(rand.NewPCG(o.seed+1, uint64(r)))
			q := make([]uint8, tokens*o.hidden)
			for i := range q {
				q[i] = uint8(rng.Uint32()) & 0x7e // finite E4M3
			}
			sh.in8[r] = internode.RankInput{TopK: sh.in[r].TopK, XFP8: q, Scales: randomF32(rng, tokens*o.hidden/128)}
		}
		if sh.ref8, err = internode.ReferenceDispatch(sh.shape, sh.in8, 0); err != nil {
			return nil, err
		}
		for r := range ranks {
			sh.fp8Tr = append(sh.fp8Tr, sh.ref8[r].Traffic)
		}
	}
	return sh, nil
}

// internodeRank checks and times on one rank (the intranode subcommand's
// rank state and helpers, with internode's reference).
func internodeRank(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, xo interOpts, cache *interCache, lead bool) (out interOutcome) {
	o := xo.inOpts
	out.Device = deviceLabel(dev.Info().Name, dev.Info().SMs)
	out.Split = xo.splitTag
	if out.Split == "" {
		out.Split = os.Getenv(internode.SplitEnv)
	}
	r := &inRank{ctx: ctx, o: o, bs: bs, dev: dev, rank: bs.Rank(), ranks: bs.Size(), lead: lead, rep: &report{}, traceProxy: xo.traceProxy,
		traceKernels: xo.traceKernels}
	var figs []interFigure
	var err error
	defer func() {
		out.Checks, out.Figures, out.Traces = r.rep.Checks, figs, r.traces
		if err != nil {
			out.Err = err.Error()
		}
	}()
	// The transport's put bandwidth first, for every token count's network
	// bytes (rank 0's), before the Buffer exists: its own communicator.
	puts := map[[2]int]interPut{} // (tokens, 0 dispatch BF16 / 1 combine / 2 dispatch FP8)
	if !xo.noPut {
		r.progress("timing the transport's port-channel puts of the network bytes (rank 0 to its forwarder on node 1)")
		var sizes []int64
		var keys [][2]int
		for _, t := range o.tokens {
			sh, gerr := cache.get(ctx, t)
			if err = r.agree("inputs", gerr); err != nil {
				return out
			}
			sizes = append(sizes, sh.bf16Tr[0].NetworkSend.Bytes, sh.combTr[0].NetworkSend.Bytes)
			keys = append(keys, [2]int{t, 0}, [2]int{t, 1})
			if o.fp8 {
				sizes = append(sizes, sh.fp8Tr[0].NetworkSend.Bytes)
				keys = append(keys, [2]int{t, 2})
			}
		}
		topo, terr := internode.VirtualNodes(r.ranks, cache.nodes)
		if err = r.agree("topology", terr); err != nil {
			return out
		}
		from, serr := internode.ParseSendMemory(os.Getenv(internode.SendMemoryEnv))
		if err = r.agree("send memory", serr); err != nil {
			return out
		}
		ps, traces, perr := measureInterPuts(ctx, bs, dev, topo, o.timeout, sizes, max(3, o.iters/5), from, xo.traceProxy)
		r.traces = append(r.traces, traces...)
		if err = r.agree("port puts", perr); err != nil {
			return out
		}
		for j, k := range keys {
			puts[k] = ps[j]
		}
	}
	if r.buf, err = ep.NewBuffer(ctx, bs, dev, o.interConfig(r.ranks)); err != nil {
		return out
	}
	out.Mode, out.Memory, out.NetworkStaging = string(r.buf.Mode()), r.buf.Memory(), r.buf.SizeHint().NetworkStaging
	defer func() {
		if cerr := r.buf.Close(ctx); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if r.buf.Mode() != ep.ModeInternode {
		err = fmt.Errorf("rank %d: the Buffer runs %s, not internode: the ranks are on one node (give --nodes)", r.rank, r.buf.Mode())
		return out
	}
	if r.st, err = dev.NewStream(); err != nil {
		return out
	}
	defer r.st.Close()
	defer r.freeAll()
	for i, t := range o.tokens {
		r.step = fmt.Sprintf("T=%d (%d/%d)", t, i+1, len(o.tokens))
		r.progress("routing, data and the reference results")
		sh, gerr := cache.get(ctx, t)
		if err = r.agree("inputs", gerr); err != nil {
			return out
		}
		var f []interFigure
		if f, err = r.runInterTokens(sh, xo.splitTag); err != nil {
			return out
		}
		for j := range f {
			kind := -1
			switch {
			case f[j].Key.Op == "combine":
				kind = 1
			case f[j].Key.Dtype == "bf16":
				kind = 0
			case f[j].Key.Dtype == "fp8":
				kind = 2
			}
			f[j].Put = puts[[2]int{t, kind}]
		}
		figs = append(figs, f...)
		r.freeAll()
	}
	return out
}

// runInterTokens checks, then times, at one token count.
func (r *inRank) runInterTokens(sh *interShared, splitTag string) ([]interFigure, error) {
	ctx, o, t := r.ctx, r.o, sh.tokens
	r.progress("checking internode dispatch (non-cached, cached) and combine against the reference")
	in, err := r.uploadInputs(&inShared{tokens: t, in: sh.in, in8: sh.in8})
	if err = r.agree("upload", err); err != nil {
		return nil, err
	}
	want, wantC := sh.ref[r.rank], sh.comb[r.rank]
	var res ep.DispatchResult
	err = func() error {
		var err error
		if res, err = r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, TopK: in.ids, Weights: in.w, Stream: r.st}); err != nil {
			return err
		}
		if err := r.checkDispatch("bf16 non-cached dispatch", res, want.RankOutput, false, true); err != nil {
			return err
		}
		if err := r.dev.MemsetAsync(res.RecvX.Ptr, 0xEE, res.RecvX.Bytes(), r.st); err != nil {
			return err
		}
		c, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, Weights: in.w, Handle: res.Handle, Stream: r.st})
		if err != nil {
			return err
		}
		if err := r.checkDispatch("bf16 cached dispatch", c, want.RankOutput, false, false); err != nil {
			return err
		}
		comb, err := r.buf.Combine(ctx, ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: res.Handle, Stream: r.st})
		if err != nil {
			return err
		}
		return r.checkCombine("combine", comb, wantC.CombineOutput)
	}()
	if err = r.agree("bf16 checks", err); err != nil {
		return nil, err
	}
	h := res.Handle
	defer h.Release()
	r.rep.ok("checks", fmt.Sprintf("T=%d bf16", t), "internode dispatch (non-cached, cached) byte-exact, combine (BF16 partials) bit-exact; rank 0 received %d rows", res.NumRecv)

	var figs []interFigure
	timeOne := func(k inKey, b interBytes, before, call func() error) error {
		if splitTag != "" {
			k.Mode += " split=" + splitTag
		}
		us, _, err := r.timeCallsAfter(o.warmup, o.iters, before, call)
		if err = r.agree(fmt.Sprintf("T=%d %s %s %s", k.Tokens, k.Op, k.Dtype, k.Mode), err); err != nil {
			return err
		}
		figs = append(figs, interFigure{Key: k, US: us, Traffic: b})
		r.progress("%s %s %s: %.1f us, network %s, NVLink %s (rank 0)", k.Op, k.Dtype, k.Mode, us, rateOf(b.Network, us), rateOf(b.NVLink, us))
		return nil
	}
	r.progress("bf16 checks passed; timing")
	bd, bc := dispatchBytes(sh.bf16Tr[r.rank]), combineBytes(sh.combTr[r.rank])
	cachedDispatch := func() error {
		_, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, Weights: in.w, Handle: h, Stream: r.st, Done: nil})
		return err
	}
	// Combine is timed as an engine runs it, right after its dispatch
	// (issued before the first event, untimed): a second combine of one
	// handle would first replay the handle's route-only dispatch inside
	// the call (buffer/internode_device.go), network round trip included,
	// which is not the combine's cost.
	steps := []struct {
		k      inKey
		b      interBytes
		before func() error
		call   func() error
	}{
		{inKey{Tokens: t, Op: "dispatch", Dtype: "bf16", Mode: "cached"}, bd, nil, cachedDispatch},
		{inKey{Tokens: t, Op: "combine", Dtype: "bf16", Mode: "after-dispatch"}, bc, cachedDispatch, func() error {
			_, err := r.buf.Combine(ctx, ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: h, Stream: r.st})
			return err
		}},
		{inKey{Tokens: t, Op: "notify+dispatch", Dtype: "bf16", Mode: "full"}, bd, nil, func() error {
			d, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, TopK: in.ids, Weights: in.w, Stream: r.st})
			d.Handle.Release()
			return err
		}},
	}
	for _, s := range steps[:2] {
		if err := timeOne(s.k, s.b, s.before, s.call); err != nil {
			return nil, err
		}
	}
	// Traced before the full step: after its notify rounds, a cached
	// dispatch of h would first replay h's notify inside the call (a
	// network round trip before the dispatch kernel starts, which is not
	// the dispatch's cost).
	if r.traceProxy {
		for i, s := range steps[:2] { // cached dispatch, combine
			label := fmt.Sprintf("T=%d %s %s (network %.1f MB)", t, s.k.Op, s.k.Mode, float64(s.b.Network)/1e6)
			if s.before != nil {
				if err := r.agree("before traced "+label, s.before()); err != nil {
					return nil, err
				}
			}
			var kern func() (internode.KernelTrace, error)
			if r.traceKernels {
				kern = func() (internode.KernelTrace, error) { return r.kernelTrace(i == 1) }
			}
			tr, err := traceCall(r.rank, r.dev, r.st, label, func() error { return r.agree(label, nil) }, s.call, kern)
			if err = r.agree("traced "+label, err); err != nil {
				return nil, err
			}
			r.traces = append(r.traces, tr)
		}
	}
	for _, s := range steps[2:] {
		if err := timeOne(s.k, s.b, s.before, s.call); err != nil {
			return nil, err
		}
	}
	// A cached dispatch of a handle other than the last one dispatched (an
	// engine alternating micro-batches, training's backward): before each
	// call, untimed, a cached dispatch of a second handle of the same
	// routing. On GPUs the Buffer resumes h's kept layout (no notify round).
	other, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, TopK: in.ids, Weights: in.w, Stream: r.st})
	if err = r.agree("second handle", err); err != nil {
		return nil, err
	}
	defer other.Handle.Release()
	dispatchOther := func() error {
		_, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, Weights: in.w, Handle: other.Handle, Stream: r.st})
		return err
	}
	// Checked once before it is timed, the receive rows poisoned between
	// the two dispatches.
	err = func() error {
		if err := dispatchOther(); err != nil {
			return err
		}
		if err := r.dev.MemsetAsync(res.RecvX.Ptr, 0xEE, res.RecvX.Bytes(), r.st); err != nil {
			return err
		}
		c, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x, Weights: in.w, Handle: h, Stream: r.st})
		if err != nil {
			return err
		}
		return r.checkDispatch("bf16 cached dispatch of an older handle", c, want.RankOutput, false, false)
	}()
	if err = r.agree("older-handle check", err); err != nil {
		return nil, err
	}
	if err := timeOne(inKey{Tokens: t, Op: "dispatch", Dtype: "bf16", Mode: "older-handle"}, bd, dispatchOther, cachedDispatch); err != nil {
		return nil, err
	}
	if !o.fp8 {
		return figs, nil
	}
	var res8 ep.DispatchResult
	err = func() error {
		var err error
		if res8, err = r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x8, Scales: in.scales, TopK: in.ids, Stream: r.st}); err != nil {
			return err
		}
		if err := r.checkDispatch("fp8 non-cached dispatch", res8, sh.ref8[r.rank].RankOutput, true, true); err != nil {
			return err
		}
		c, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res8.Handle, Stream: r.st})
		if err != nil {
			return err
		}
		return r.checkDispatch("fp8 cached dispatch", c, sh.ref8[r.rank].RankOutput, true, false)
	}()
	if err = r.agree("fp8 checks", err); err != nil {
		return nil, err
	}
	defer res8.Handle.Release()
	r.rep.ok("checks", fmt.Sprintf("T=%d fp8", t), "internode dispatch (non-cached, cached) byte-exact, scales included")
	err = timeOne(inKey{Tokens: t, Op: "dispatch", Dtype: "fp8", Mode: "cached"}, dispatchBytes(sh.fp8Tr[r.rank]), nil, func() error {
		_, err := r.buf.Dispatch(ctx, ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res8.Handle, Stream: r.st})
		return err
	})
	return figs, err
}

func rateOf(bytes int64, us float64) string {
	if bytes == 0 || us <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f GB/s", float64(bytes)/us/1e3)
}

// interRow is one line of the table and of the JSON report: rank 0's
// figure, and the slowest rank.
type interRow struct {
	inKey
	US      float64    `json:"us"`
	MaxUS   float64    `json:"max_us"`
	Traffic interBytes `json:"rank0_bytes"`
	NetGBps float64    `json:"network_gbps"`
	NVLGBps float64    `json:"nvlink_gbps"`
	// DeepEP's figures of rank 0 (RDMA send, NVL receive bytes per us).
	RDMAGBps float64 `json:"deepep_rdma_gbps"`
	NVLRGBps float64 `json:"deepep_nvl_gbps"`
	// The transport's port-channel put of the same network bytes between
	// the same ranks (rank 0 to its forwarder on node 1) and the network
	// leg's share of it (percent; issue 14's goal: >= 90).
	Put      interPut `json:"port_put"`
	NetOfPut float64  `json:"network_of_put_pct"`
	// The same against the put timed with every rank putting at once
	// (interPut.AllGBps): what the transport gives under the network leg's
	// load.
	NetOfPutAll float64 `json:"network_of_put_all_pct,omitempty"`
	// The same against one put of the count at a time with every rank
	// putting (interPut.OnceGBps): a single transfer, as a call is.
	NetOfPutOnce float64 `json:"network_of_put_once_pct,omitempty"`
}

type interReport struct {
	Ranks   int       `json:"ranks"`
	As      string    `json:"ranks_as"`
	Backend string    `json:"backend"`
	Device  string    `json:"device"`
	Mode    string    `json:"mode"`
	Hidden  int       `json:"hidden"`
	TopK    int       `json:"topk"`
	Experts int       `json:"experts"`
	Seed    uint64    `json:"seed"`
	Warmup  int       `json:"warmup"`
	Iters   int       `json:"iters"`
	Memory  ep.Memory `json:"buffer_memory"`
	// NetworkStaging is the pinned host memory rank 0's TCP connections
	// to other nodes stage through where traffic is staged (GPUs).
	NetworkStaging int    `json:"network_staging_bytes"`
	Split          string `json:"split"`
	// PutBytes is $GOEP_INTERNODE_PUT_BYTES as the Buffer read it (empty:
	// internode.DefaultPutBytes).
	PutBytes string `json:"put_bytes,omitempty"`
	// PutBytesUsed is the put size the Buffers asked for: PutBytes, or
	// the network transport's default (internode.DefaultPutBytesOver); 0
	// is one put per node and block.
	PutBytesUsed int `json:"put_bytes_used"`
	// PutGroups is how many puts the Buffers asked the blocks' rows to
	// each node to go in ($GOEP_INTERNODE_PUT_GROUPS, or
	// internode.DefaultPutGroupsOver the transport), where each block puts
	// once (0: a put per block).
	PutGroups int `json:"put_groups"`
	// Forward is when the dispatch's forwarders started on another node's
	// rows ($GOEP_INTERNODE_FORWARD, or the transport's default:
	// internode.DefaultForwardOver): "nodes" once all landed, "blocks" as
	// each sender block's landed, "auto" by block for large calls.
	Forward string `json:"forward"`
	// ReduceUnits is when the combine summed each token
	// ($GOEP_INTERNODE_REDUCE_UNITS, or internode.DefaultReduceUnitsOver the
	// transport and rate): "off" after the last partial landed, "units" as
	// its partials landed.
	ReduceUnits string `json:"reduce_units"`
	// SMs is the grid asked for: --sms, or where 0 the Buffer's default
	// over the transport (internode.DefaultSMsOver; the launch caps it by
	// the GPU's SMs and the spin budget of ranks sharing a GPU).
	SMs int `json:"sms"`
	// ProxyPending is $GOEP_INTERNODE_PROXY_PENDING as the Buffer read it
	// (empty: channels' default).
	ProxyPending string `json:"proxy_pending,omitempty"`
	// ReduceSMs is $GOEP_INTERNODE_REDUCE_SMS as the Buffer read it
	// (empty: the combine's final reduce on every SM, after its kernel).
	ReduceSMs string `json:"reduce_sms,omitempty"`
	// SendMemory is $GOEP_INTERNODE_SEND_MEMORY (empty: auto).
	SendMemory string `json:"send_memory,omitempty"`
	// Network is the transport between the nodes as channels resolves it
	// from the environment (NetworkConfig.Resolve): "tcp", or "cuda-ipc"
	// (the port over CUDA IPC between virtual nodes, $GOEP_NET_TRANSPORT=ipc).
	Network string `json:"network_transport,omitempty"`
	// TCP is the TCP transport's settings between the nodes (sockets a
	// connection, chunk bytes, receive read-ahead), or why they did not
	// resolve; empty over another transport.
	TCP string `json:"tcp,omitempty"`
	// EmulatedGBps is the line rate the proxies pace each rank's puts over
	// the network to ($GOEP_NET_EMULATE_GBPS, NetworkConfig.EmulatedGBps;
	// 0: none): figures taken with it emulate a NIC of that speed.
	EmulatedGBps float64         `json:"emulated_gbps,omitempty"`
	Checks       []check         `json:"checks"`
	Rows         []interRow      `json:"results"`
	Sweep        []interSweepRow `json:"sweep,omitempty"`
	Best         string          `json:"best_split,omitempty"`
	Errors       []string        `json:"errors,omitempty"`
}

func reportInternode(stdout io.Writer, xo interOpts, n int, as string, outs []interOutcome, sweep []interSweepRow) error {
	o := xo.inOpts
	rep := interReport{Ranks: n, As: as, Backend: string(o.kind), Device: outs[0].Device, Mode: outs[0].Mode, Hidden: o.hidden,
		TopK: o.topk, Experts: o.experts, Seed: o.seed, Warmup: o.warmup, Iters: o.iters, Memory: outs[0].Memory, NetworkStaging: outs[0].NetworkStaging, Checks: outs[0].Checks,
		Split: outs[0].Split, PutBytes: os.Getenv(internode.PutBytesEnv),
		ProxyPending: os.Getenv(internode.ProxyPendingEnv), ReduceSMs: os.Getenv(internode.ReduceSMsEnv), SendMemory: os.Getenv(internode.SendMemoryEnv),
		Sweep: sweep}
	vnodes := o.nodes // goroutine ranks; a launch's from the environment
	if vnodes == 0 {
		vnodes, _ = strconv.Atoi(strings.TrimSpace(envVirtualNodes()))
	}
	rep.Network, rep.TCP, rep.EmulatedGBps = networkSettings(n, vnodes)
	// What the Buffers used (they read the same environment); the run
	// itself failed before here if it does not parse.
	if nw, err := buffer.NetworkTuningFromEnv(); err == nil {
		rep.PutBytesUsed, rep.PutGroups, rep.Forward, rep.SMs = nw.PutBytes, nw.PutGroups, nw.Forward.String(), nw.SMs
		rep.ReduceUnits = nw.ReduceUnits.String()
	}
	if o.interSMs != 0 {
		rep.SMs = o.interSMs
	}
	if rep.Split == "" {
		rep.Split = "default"
	}
	if b, ok := bestSplit(sweep); ok {
		rep.Best = b.Split
	}
	for _, s := range sweep {
		if s.Err != "" {
			rep.Errors = append(rep.Errors, fmt.Sprintf("sweep split %s: %s", s.Split, s.Err))
		}
	}
	for r, oc := range outs {
		if oc.Err != "" {
			rep.Errors = append(rep.Errors, fmt.Sprintf("rank %d: %s", r, oc.Err))
		}
	}
	per := func(b int64, us float64) float64 {
		if us <= 0 {
			return 0
		}
		return float64(b) / us / 1e3
	}
	for i, f := range outs[0].Figures {
		row := interRow{inKey: f.Key, US: f.US, MaxUS: f.US, Traffic: f.Traffic, NetGBps: per(f.Traffic.Network, f.US),
			NVLGBps: per(f.Traffic.NVLink, f.US), RDMAGBps: per(f.Traffic.DeepEPRDMA, f.US), NVLRGBps: per(f.Traffic.DeepEPNVL, f.US),
			Put: f.Put}
		if f.Put.GBps > 0 {
			row.NetOfPut = 100 * row.NetGBps / f.Put.GBps
		}
		if f.Put.AllGBps > 0 {
			row.NetOfPutAll = 100 * row.NetGBps / f.Put.AllGBps
		}
		if f.Put.OnceGBps > 0 {
			row.NetOfPutOnce = 100 * row.NetGBps / f.Put.OnceGBps
		}
		for _, oc := range outs[1:] {
			if i < len(oc.Figures) && oc.Figures[i].Key == f.Key {
				row.MaxUS = max(row.MaxUS, oc.Figures[i].US)
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	printInternode(stdout, o, rep)
	if xo.traceProxy {
		all := make([][]interTrace, len(outs))
		for i, oc := range outs {
			all[i] = oc.Traces
		}
		printTraces(stdout, all)
	}
	var errs []error
	if o.jsonPath != "" {
		errs = append(errs, writeJSON(o.jsonPath, rep))
	}
	if len(rep.Errors) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d ranks failed:\n  %s", len(rep.Errors), n, strings.Join(rep.Errors, "\n  ")))
	}
	return errors.Join(errs...)
}

// networkSettings names the network transport a communicator of ranks
// ranks in vnodes virtual nodes (0: hosts) resolves here (what this
// process's Buffers use between nodes), for TCP its settings, and the
// line rate emulated (0: none).
func networkSettings(ranks, vnodes int) (transport, tcp string, emulatedGBps float64) {
	nc, err := channels.NetworkConfig{VirtualNodes: vnodes}.Resolve(ranks)
	if err != nil {
		return "", "unresolved: " + err.Error(), 0
	}
	if nc.Transport != channels.TransportEthernet {
		return nc.Transport.String(), "", nc.EmulatedGBps
	}
	ahead := "off"
	if nc.ReceiveAhead > 0 {
		ahead = strconv.Itoa(nc.ReceiveAhead) + " buffers a socket (GPUs)"
	}
	return nc.Transport.String(), fmt.Sprintf("%d sockets a connection, %d KiB chunks, receive read-ahead %s", nc.Sockets, nc.ChunkBytes>>10, ahead), nc.EmulatedGBps
}

// overPort reports whether the report's network is the port over CUDA IPC.
func (rep interReport) overPort() bool { return rep.Network == channels.TransportCudaIPC.String() }

func printInternode(w io.Writer, o inOpts, rep interReport) {
	fmt.Fprintf(w, "internode: %d ranks (%s), %s backend, %s; hidden %d, top-%d of %d experts, routing top-k of |randn|+1 (seed %d, %d masked)\n",
		rep.Ranks, rep.As, rep.Backend, rep.Device, o.hidden, o.topk, o.experts, o.seed, o.masked)
	switch {
	case rep.overPort():
		fmt.Fprintf(w, "network between the nodes: the port over CUDA IPC ($%s=ipc: port channels whose puts the proxy carries out with copy engines; host memory on the host backend), no TCP\n", channels.NetTransportEnv)
	case rep.TCP != "":
		fmt.Fprintf(w, "network between the nodes: TCP, %s ($%s, $%s, $%s)\n", rep.TCP, channels.TCPSocketsEnv, channels.TCPChunkEnv, channels.TCPAheadEnv)
	}
	if rep.EmulatedGBps > 0 {
		fmt.Fprintf(w, "line rate EMULATED at %g GB/s a rank ($%s): each rank's proxy issues its puts over the network in pieces no faster than that, as one NIC a GPU would carry them; put and network figures below are of that emulated link, not of a network\n", rep.EmulatedGBps, channels.NetEmulateEnv)
	}
	fmt.Fprintf(w, "timing: %d warm-ups, mean of the last %d of %d calls each between two events (combine: after-dispatch = each combine issued right after an untimed cached dispatch of its handle, as an engine runs them; dispatch older-handle = a cached dispatch of a handle after an untimed cached dispatch of another); bytes per rank from internode's Traffic (payload: rows and FP8 scales): "+
		"network = rows sent to other nodes (combine: BF16 partials), NVLink = rows between two ranks of a node; DeepEP's RDMA send and NVL receive figures count a rank's traffic with itself too\n",
		o.warmup, o.iters-1, o.iters)
	if o.kind == device.Host {
		leg := "TCP on loopback"
		if rep.overPort() {
			leg = "host memory copies by the proxy"
		}
		fmt.Fprintf(w, "note: host backend: the network leg is %s and every step runs on the CPU; the figures show that timing works, not what a GPU and NIC do\n", leg)
	}
	if m := rep.Memory; m.Allocations > 0 {
		fmt.Fprintf(w, "buffer (rank 0): device memory %.1f MiB in %d allocations, host-mapped %.1f MiB", float64(m.Device)/(1<<20), m.Allocations, float64(m.HostMapped)/(1<<20))
		if !rep.overPort() {
			fmt.Fprintf(w, "; its TCP connections to other nodes stage through %.1f MiB of pinned host memory where traffic is staged (GPUs)", float64(rep.NetworkStaging)/(1<<20))
		}
		fmt.Fprintln(w)
	}
	(&report{Checks: rep.Checks}).print(w)
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "FAIL %s\n", e)
	}
	if len(rep.Rows) > 0 {
		fmt.Fprintln(w, "TIMINGS (rank 0)")
		tw := newTable(w)
		fmt.Fprintln(tw, "tokens\top\tdtype\tmode\tus\tmax us\tnetwork MB\tnetwork GB/s\tport put GB/s\tnet/put\tput all GB/s\tnet/put all\tput once GB/s\tnet/put once\tNVLink MB\tNVLink GB/s\tDeepEP RDMA GB/s\tDeepEP NVL GB/s\t")
		for _, r := range rep.Rows {
			put, ratio := "-", "-"
			if r.Put.GBps > 0 {
				put, ratio = fmt.Sprintf("%.2f", r.Put.GBps), fmt.Sprintf("%.0f%%", r.NetOfPut)
			}
			putAll, ratioAll := "-", "-"
			if r.Put.AllGBps > 0 {
				putAll, ratioAll = fmt.Sprintf("%.2f", r.Put.AllGBps), fmt.Sprintf("%.0f%%", r.NetOfPutAll)
			}
			putOnce, ratioOnce := "-", "-"
			if r.Put.OnceGBps > 0 {
				putOnce, ratioOnce = fmt.Sprintf("%.2f", r.Put.OnceGBps), fmt.Sprintf("%.0f%%", r.NetOfPutOnce)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1f\t%.1f\t%.3f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.2f\t%.2f\t%.2f\t\n", r.Tokens, r.Op, r.Dtype, r.Mode, r.US, r.MaxUS,
				float64(r.Traffic.Network)/1e6, r.NetGBps, put, ratio, putAll, ratioAll, putOnce, ratioOnce, float64(r.Traffic.NVLink)/1e6, r.NVLGBps, r.RDMAGBps, r.NVLRGBps)
		}
		tw.Flush()
		switch {
		case rep.PutBytes != "":
			fmt.Fprintf(w, "puts in pieces of $%s=%s\n", internode.PutBytesEnv, rep.PutBytes)
		case rep.PutBytesUsed == 0 && rep.PutGroups > 0:
			fmt.Fprintf(w, "puts: %d per node, each a group of consecutive blocks' rows (the defaults over the port over CUDA IPC; $%s, $%s)\n",
				rep.PutGroups, internode.PutBytesEnv, internode.PutGroupsEnv)
		case rep.PutBytesUsed == 0:
			fmt.Fprintf(w, "puts: one per node and block ($%s, $%s)\n", internode.PutBytesEnv, internode.PutGroupsEnv)
		default:
			fmt.Fprintf(w, "puts in pieces of %d KiB (the default over TCP and at an emulated line rate; $%s)\n", rep.PutBytesUsed>>10, internode.PutBytesEnv)
		}
		fmt.Fprintf(w, "dispatch forwarding: %s ($%s: nodes, blocks or auto)\n", rep.Forward, internode.ForwardEnv)
		if rep.Split == "default" || rep.Split == "shared" {
			fmt.Fprintf(w, "grid: %d blocks asked for (--sms, else the default over the transport; capped by the GPU and by ranks sharing it)\n", rep.SMs)
		}
		if rep.ProxyPending != "" {
			fmt.Fprintf(w, "proxy flushes a connection every $%s=%s operations\n", internode.ProxyPendingEnv, rep.ProxyPending)
		}
		if rep.ReduceUnits != "" && rep.ReduceUnits != internode.ReduceAfter.String() {
			fmt.Fprintf(w, "the combine's final reduce: each token as its partials land, in the combine kernel ($%s=%s)\n", internode.ReduceUnitsEnv, rep.ReduceUnits)
		} else if rep.ReduceSMs != "" {
			fmt.Fprintf(w, "the combine's final reduce: $%s=%s (-1: inside the combine kernel)\n", internode.ReduceSMsEnv, rep.ReduceSMs)
		}
		if rep.SendMemory != "" {
			fmt.Fprintf(w, "rows for other nodes (and the port puts' source) in $%s=%s memory\n", internode.SendMemoryEnv, rep.SendMemory)
		}
		fmt.Fprintf(w, "split %s; port put = the transport's own put of rank 0's network bytes to its forwarder on node 1 (one thread, whole count per put, timed in the kernel to the flush); net/put = network GB/s / port put GB/s (goal >= 90%%); put all = the same put with every rank putting to its forwarder on the next node at once (the network leg's load: on virtual nodes of one host every connection shares its CPUs), net/put all = network GB/s / that; put once = every rank at once again, one put of the count and its flush per launch (a single transfer paying its own pipeline fill and drain, as a call does; put all streams its puts back to back), net/put once = network GB/s / that; every port put comes from the kind of memory the network leg sends from (device memory unless $GOEP_INTERNODE_SEND_MEMORY=host)\n", rep.Split)
	}
	if len(rep.Sweep) > 0 {
		fmt.Fprintln(w, "SPLIT SWEEP (rank 0, cached dispatch and combine, BF16; senders,forwarders,receivers)")
		tw := newTable(w)
		fmt.Fprintln(tw, "split\ttokens\tdispatch us\tcombine us\tsum us\t")
		for _, s := range rep.Sweep {
			if s.Err != "" {
				fmt.Fprintf(tw, "%s\t%d\tFAIL\t\t\t\n", s.Split, s.Tokens)
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t\n", s.Split, s.Tokens, s.DispatchUS, s.CombineUS, s.DispatchUS+s.CombineUS)
		}
		tw.Flush()
		if rep.Best != "" {
			fmt.Fprintf(w, "best split: %s (pass --split %s, or $%s)\n", rep.Best, rep.Best, internode.SplitEnv)
		}
	}
	if len(rep.Errors) == 0 {
		fmt.Fprintln(w, "internode: all checks passed")
	}
}
