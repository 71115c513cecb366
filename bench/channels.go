package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/device"
)

func init() {
	register("channels", "check, then measure, the channel primitives (signal/wait, put/get, LL packets, put to all peers, port channels) on N ranks", runChannels)
}

// chanOpts are the parsed flags of `ep-bench channels`.
type chanOpts struct {
	kind      device.Kind
	check     bool
	bench     bool
	sizes     []int
	sms       []int
	pairSMs   int
	peerBytes int
	threads   int
	iters     int
	rounds    int
	portRnds  int
	portAdds  int
	ranks     int
	timeout   time.Duration
	jsonPath  string
	progress  *progress // nil: quiet
}

// chanOutcome is one rank's result, gathered on rank 0.
type chanOutcome struct {
	Checks []check              `json:"checks"`
	Rows   []channeltest.Result `json:"results"`
	Err    string               `json:"error,omitempty"`
}

// chanReport is what --json writes.
type chanReport struct {
	Ranks   int                  `json:"ranks"`
	Backend string               `json:"backend"`
	Device  string               `json:"device"`
	SMs     int                  `json:"sms"`
	Timeout string               `json:"wait_timeout"`
	Checks  []check              `json:"checks"`
	Results []channeltest.Result `json:"results"`
	Errors  []string             `json:"errors,omitempty"`
}

func runChannels(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("channels", stderr)
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	check := fs.Bool("check", false, "run the full correctness suite first: put/get/LL 4 B..1 GiB (16 MiB on host), 1,000,000 signal round trips (1,000 on host), 1,000 graph replays, host semaphores, port channels (100,000 ordered puts of random sizes and 100,000 atomic adds per rank on GPU), timeouts (200 ms) and abort")
	bench := fs.Bool("bench", true, "measure after checking")
	sizes := fs.String("sizes", "", "transfer sizes for put/get and LL, e.g. 8,4K,1M,256M (default GPU 8,1K,64K,1M,16M,256M; host 8,1K,64K,1M)")
	sms := fs.String("sms", "", "SM counts (blocks) swept by put-to-all (default 8,16,24,32,48,64,80,96,112,132, capped at the GPU's)")
	pairSMs := fs.Int("pair-sms", 32, "blocks for single-pair put/get")
	peerBytes := fs.String("peer-bytes", "", "bytes per peer for put-to-all (default 64M on GPU, 1M on host)")
	threads := fs.Int("threads", 1024, "threads per block for put/get and put-to-all (at most 1024)")
	iters := fs.Int("iters", 20, "timed launches per put/get/put-to-all measurement")
	rounds := fs.Int("rounds", 0, "in-kernel round trips for signal/wait and LL (default 100000 on GPU, 1000 on host)")
	portRounds := fs.Int("port-rounds", 0, "rounds of the port channel put/signal/flush check (default 100000 with --check on GPU, 1000 on GPU, 200 on host)")
	portAdds := fs.Int("port-adds", 0, "atomic adds per rank in the port channel check (default 100000 with --check on GPU, 10000 on GPU, 3000 on host)")
	ranks := fs.Int("ranks", 0, "goroutine ranks when run without a launcher (default: every GPU, or 4 host ranks); more ranks than GPUs share them")
	gpus := addGPUsFlag(fs)
	timeout := fs.Duration("timeout", 0, "device-side wait timeout (default $"+channels.TimeoutEnv+" or 60s)")
	jsonPath := fs.String("json", "", "also write checks and results as JSON to this file (rank 0)")
	if err := parse(fs, args); err != nil {
		return err
	}
	kind, _, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	if err := gpus.apply(kind); err != nil {
		return err
	}
	o := chanOpts{kind: kind, check: *check, bench: *bench, pairSMs: *pairSMs, threads: *threads, iters: *iters,
		rounds: *rounds, portRnds: *portRounds, portAdds: *portAdds, ranks: *ranks, timeout: *timeout, jsonPath: *jsonPath}
	gpu := kind == device.CUDA
	if o.sizes, err = parseSizes(*sizes, pick(gpu, "8,1K,64K,1M,16M,256M", "8,1K,64K,1M")); err != nil {
		return fmt.Errorf("--sizes: %w", err)
	}
	if o.sms, err = parseSizes(*sms, pick(gpu, "8,16,24,32,48,64,80,96,112,132", "4")); err != nil {
		return fmt.Errorf("--sms: %w", err)
	}
	pb, err := parseSizes(*peerBytes, pick(gpu, "64M", "1M"))
	if err != nil || len(pb) != 1 {
		return fmt.Errorf("--peer-bytes: want one size (%v)", err)
	}
	o.peerBytes = pb[0]
	if o.rounds == 0 {
		o.rounds = pick(gpu, 100000, 1000)
	}
	if o.portRnds == 0 {
		o.portRnds = pick(gpu, pick(o.check, 100000, 1000), 200)
	}
	if o.portAdds == 0 {
		o.portAdds = pick(gpu, pick(o.check, 100000, 10000), 3000)
	}
	if o.threads < 32 || o.threads > 1024 || o.threads%32 != 0 || o.iters < 1 || o.pairSMs < 1 || o.rounds < 1 ||
		o.portRnds < 1 || o.portAdds < 1 {
		return fmt.Errorf("--threads must be a multiple of 32 in [32, 1024]; --iters, --pair-sms, --rounds, --port-rounds and --port-adds positive")
	}
	if o.timeout < 0 {
		return fmt.Errorf("--timeout must be positive")
	}
	if err := checkOutput("json", o.jsonPath); err != nil {
		return err
	}
	o.progress = newProgress(stderr)

	env, err := launcherEnv("channels", kind)
	if err != nil {
		return err
	}
	if env.Size > 1 {
		return channelsProcess(ctx, env, o, stdout)
	}
	return channelsGoroutines(ctx, o, stdout)
}

func pick[T any](gpu bool, onGPU, onHost T) T {
	if gpu {
		return onGPU
	}
	return onHost
}

// maxSize bounds a size flag far above any buffer and far below where
// size arithmetic overflows.
const maxSize = 1 << 40

// parseSizes reads "8,4K,1M,1G" (binary units); "" means def.
func parseSizes(s, def string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		s = def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.ToUpper(strings.TrimSpace(f))
		mult := 1
		switch {
		case strings.HasSuffix(f, "K"):
			mult, f = 1<<10, strings.TrimSuffix(f, "K")
		case strings.HasSuffix(f, "M"):
			mult, f = 1<<20, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "G"):
			mult, f = 1<<30, strings.TrimSuffix(f, "G")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad size %q", clip(f, 100))
		}
		if n > maxSize/mult {
			return nil, fmt.Errorf("size %s%s is more than %s", f, map[int]string{1: "", 1 << 10: "K", 1 << 20: "M", 1 << 30: "G"}[mult], human(maxSize))
		}
		out = append(out, n*mult)
	}
	return out, nil
}

// checkSizes are the transfer sizes of the correctness checks.
func (o chanOpts) checkSizes() []int {
	s := []int{4, 5, 7, 16, 17, 31, 127, 1000, 4093, 65537, 1<<20 + 3, 16 << 20}
	if o.check && o.kind == device.CUDA {
		s = append(s, 64<<20+9, 256<<20, 1<<30)
	}
	if !o.check { // quick checks before measuring: the sizes measured
		s = append([]int{4, 5, 17, 4093}, o.sizes...)
	}
	return s
}

// llSizes are the measured sizes that make sense as LL packets.
func (o chanOpts) llSizes() []int {
	var s []int
	for _, v := range o.sizes {
		if v <= 16<<20 {
			s = append(s, v)
		}
	}
	return s
}

func (o chanOpts) layout(n int) channeltest.Layout {
	m := n * o.peerBytes
	for _, v := range append(o.checkSizes(), o.sizes...) {
		m = max(m, v)
	}
	return channeltest.LayoutFor(m)
}

func (o chanOpts) commConfig() channels.Config {
	return channels.Config{Timeouts: channels.Timeouts{Wait: o.timeout}}
}

// channelsGoroutines runs every rank as a goroutine of this process.
func channelsGoroutines(ctx context.Context, o chanOpts, stdout io.Writer) error {
	n, err := goroutineRanks("channels", o.kind, o.ranks, 0, 2)
	if err != nil {
		return err
	}
	if note := sharedGPUNote(o.kind, n); note != "" {
		fmt.Fprintln(stdout, "note:", note)
	}
	outcomes := make([]chanOutcome, n)
	var info device.Info
	errs := channeltest.RunRanks(ctx, o.kind, n, bootstrap.Config{}, o.commConfig(), o.layout(n),
		func(ctx context.Context, r *channeltest.Rank) error {
			if r.Comm.Rank() == 0 {
				info = r.Dev.Info()
			}
			outcomes[r.Comm.Rank()] = channelRank(ctx, r, o)
			if e := outcomes[r.Comm.Rank()].Err; e != "" {
				return errors.New(e)
			}
			return nil
		})
	if err := interrupted(ctx); err != nil {
		return err // the ranks' failures are the interruption's echoes
	}
	for r, err := range errs {
		if err != nil && outcomes[r].Err == "" {
			outcomes[r].Err = err.Error()
		}
	}
	return reportChannels(stdout, o, n, info, outcomes)
}

// channelsProcess runs this process's rank of a launched job.
func channelsProcess(ctx context.Context, env bootstrap.EnvInfo, o chanOpts, stdout io.Writer) (err error) {
	bs, dev, release, err := joinProcess(ctx, env, o.kind)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, release()) }()
	var mine chanOutcome
	comm, err := channels.NewCommunicator(bs, dev, o.commConfig())
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, comm.Close()) }()
	r, err := channeltest.NewRank(ctx, comm, o.layout(env.Size))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	mine = channelRank(ctx, r, o)
	if err := interrupted(ctx); err != nil {
		return err
	}
	outcomes, root, err := gatherOutcomes(ctx, bs, stdout, mine)
	if !root || err != nil {
		return err
	}
	return reportChannels(stdout, o, env.Size, dev.Info(), outcomes)
}

// chanStep is one check of channelRank.
type chanStep struct {
	name, what string
	run        func() error
}

// channelRank runs the checks, then the measurements, on one rank. It
// stops at the first failure: the ranks would no longer agree on what to
// run next.
func channelRank(ctx context.Context, r *channeltest.Rank, o chanOpts) (out chanOutcome) {
	rep := &report{}
	defer func() { out.Checks = rep.Checks }()
	defer abortOnCancel(ctx, r.Comm.Abort)()
	bs, dev := r.Comm.Bootstrap(), r.Dev
	seed, err := channeltest.SharedSeed(ctx, bs)
	if err != nil {
		out.Err = err.Error()
		return out
	}
	gpu := o.kind == device.CUDA
	rounds, burst, replays := 1000, 300, 100
	if o.check {
		replays = 1000
		if gpu {
			rounds, burst = 1_000_000, 100_000
		}
	}
	cs := o.checkSizes()
	portMax := pick(gpu, 1<<20, 64<<10)
	sizeRange := fmt.Sprintf("%d sizes, %s..%s", len(cs), human(minOf(cs)), human(maxOf(cs)))
	steps := []chanStep{
		{"put/get", sizeRange + ", all ring distances, unaligned offsets, guards intact",
			func() error { return r.CheckPutGet(ctx, seed, cs) }},
		{"LL16 packets", sizeRange + ", flag advanced once per launch",
			func() error { return r.CheckPackets(ctx, seed, cs, 16) }},
		{"LL8 packets", sizeRange + ", flag advanced once per launch",
			func() error { return r.CheckPackets(ctx, seed, cs, 8) }},
		{"signal/wait", fmt.Sprintf("%d ping-pong round trips with data (+%d relaxed), bursts of %d: none lost or duplicated", rounds, max(rounds/10, 1), burst),
			func() error { return r.CheckSignals(ctx, rounds, burst) }},
		{"host semaphores", "100 host signals to a peer and through loopback",
			func() error { return r.CheckHostSemaphores(ctx, 3, 100) }},
		{"counter wait", "goep_wait_ge_u64 under the watchdog",
			func() error { return r.CheckCounterWait(ctx) }},
		{"LL16 graph replays", fmt.Sprintf("%d replays of one captured graph, fresh flag each", replays),
			func() error { return r.CheckGraphPackets(ctx, uint32(seed), 16, 4096, replays) }},
		{"LL8 graph replays", fmt.Sprintf("%d replays of one captured graph, fresh flag each", replays),
			func() error { return r.CheckGraphPackets(ctx, uint32(seed), 8, 4096, replays) }},
		{"port put/signal/flush", fmt.Sprintf("%d rounds over a ring, random sizes 1 B..%s, 4 flavours: byte-exact, data before signal", o.portRnds, human(portMax)),
			func() error { return r.CheckPortStream(ctx, seed, o.portRnds, portMax) }},
		{"port atomicAdd", fmt.Sprintf("%d concurrent atomic adds per rank to every other rank: exact sums", o.portAdds),
			func() error { return r.CheckPortAtomics(ctx, seed, o.portAdds, pick(gpu, 8, 1)) }},
	}
	if o.check {
		steps = append(steps,
			chanStep{"timeouts", "silent peer, missing packets, unraised counter: a 200 ms timeout names the wait",
				func() error { return channeltest.CheckTimeout(ctx, bs, dev, 200*time.Millisecond) }},
			chanStep{"abort", "host abort ends every waiting block",
				func() error { return channeltest.CheckAbort(ctx, bs, dev) }},
			chanStep{"port timeouts", "stuck proxy: a 200 ms timeout names the flush or the full FIFO",
				func() error { return channeltest.CheckPortTimeouts(ctx, bs, dev, 200*time.Millisecond) }})
	}
	prog := o.progress
	if r.Comm.Rank() != 0 {
		prog = nil // rank 0 speaks for all
	}
	for i, s := range steps {
		prog.printf("checking %s (%d/%d)", s.name, i+1, len(steps))
		start := time.Now()
		if err := s.run(); err != nil {
			rep.fail("checks", s.name, "%v", err)
			out.Err = err.Error()
			return out
		}
		rep.ok("checks", s.name, "%s (%s)", s.what, time.Since(start).Round(time.Millisecond))
	}
	if !o.bench {
		return out
	}
	measure := func(rows []channeltest.Result, err error) bool {
		out.Rows = append(out.Rows, rows...)
		if err != nil {
			out.Err = err.Error()
			return false
		}
		return true
	}
	sms := o.sms
	if info := dev.Info(); info.SMs > 0 {
		sms = nil
		for _, s := range o.sms {
			if s <= info.SMs {
				sms = append(sms, s)
			}
		}
	}
	prog.printf("checks passed; timing signal/wait, put/get, LL packets, put to all peers and port channels")
	_ = measure(r.BenchPingPong(ctx, o.rounds, false)) &&
		measure(r.BenchPingPong(ctx, o.rounds, true)) &&
		measure(r.BenchPutGet(ctx, o.sizes, o.pairSMs, o.threads, o.iters)) &&
		benchLL(ctx, r, o, 16, uint32(seed), measure) &&
		benchLL(ctx, r, o, 8, uint32(seed), measure) &&
		measure(r.BenchPutAll(ctx, o.peerBytes, sms, o.threads, o.iters, false)) &&
		measure(r.BenchPutAll(ctx, o.peerBytes, sms, o.threads, o.iters, true)) &&
		measure(r.BenchPortPingPong(ctx, max(o.rounds/10, 10))) &&
		measure(r.BenchPortPut(ctx, o.sizes, o.iters)) &&
		measure(r.BenchPortAtomic(ctx, pick(gpu, 100000, 2000)))
	return out
}

// benchLL measures LL exchanges of each size, with fewer rounds for large
// sizes (at most 64 MiB moved per rank, at least 10 rounds).
func benchLL(ctx context.Context, r *channeltest.Rank, o chanOpts, proto int, seed uint32,
	measure func([]channeltest.Result, error) bool) bool {
	payload := 8
	if proto == 8 {
		payload = 4
	}
	for _, size := range o.llSizes() {
		rounds := max(min(o.rounds, (64<<20)/size), 10)
		if !measure(r.BenchLL(ctx, proto, []int{max(size/payload, 1)}, rounds, seed)) {
			return false
		}
	}
	return true
}

func minOf(s []int) int {
	m := s[0]
	for _, v := range s {
		m = min(m, v)
	}
	return m
}

func maxOf(s []int) int {
	m := s[0]
	for _, v := range s {
		m = max(m, v)
	}
	return m
}

// human prints a byte count with a binary unit when it is exact.
func human(n int) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// reportChannels prints rank 0's checks, every rank's failures and rank
// 0's measurements, and writes the JSON report.
func reportChannels(stdout io.Writer, o chanOpts, n int, info device.Info, outcomes []chanOutcome) error {
	timeout := o.timeout
	if timeout == 0 {
		t, err := channels.TimeoutsFromEnv()
		if err == nil {
			timeout = t.Wait
		}
	}
	fmt.Fprintf(stdout, "channels: %d ranks, %s backend, %s (%d SMs), device wait timeout %s\n", n, o.kind, info.Name, info.SMs, timeout)
	rep := &report{Checks: outcomes[0].Checks}
	var errs []string
	for r, oc := range outcomes {
		if oc.Err != "" {
			errs = append(errs, fmt.Sprintf("rank %d: %s", r, oc.Err))
			if r != 0 {
				rep.fail("ranks", fmt.Sprintf("rank %d", r), "%s", oc.Err)
			}
		}
	}
	rep.print(stdout)
	rows := outcomes[0].Rows
	if len(rows) > 0 {
		fmt.Fprintln(stdout, "MEASUREMENTS")
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "primitive\tranks\tpeers\tbytes\tSMs\tthreads\titers\tlatency us\tGB/s\tmin GB/s\tnote\t")
		for _, x := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%.2f\t%s\t%s\t%s\t\n", x.Primitive, x.Ranks, x.Peers,
				dash(x.Bytes > 0, human(int(x.Bytes))), dash(x.SMs > 0, strconv.Itoa(x.SMs)), dash(x.Threads > 0, strconv.Itoa(x.Threads)),
				x.Iters, x.LatencyUS, dash(x.GBps > 0, fmt.Sprintf("%.1f", x.GBps)), dash(x.MinGBps > 0, fmt.Sprintf("%.1f", x.MinGBps)), x.Note)
		}
		tw.Flush()
	}
	if o.jsonPath != "" {
		if err := writeJSON(o.jsonPath, chanReport{Ranks: n, Backend: string(o.kind), Device: info.Name, SMs: info.SMs,
			Timeout: timeout.String(), Checks: rep.Checks, Results: rows, Errors: errs}); err != nil {
			return err
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d ranks failed:\n  %s", len(errs), n, strings.Join(errs, "\n  "))
	}
	fmt.Fprintln(stdout, "channels: all checks passed")
	return nil
}

func dash(ok bool, s string) string {
	if ok {
		return s
	}
	return "-"
}
