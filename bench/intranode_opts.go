package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
)

func init() {
	register("intranode", "check intranode dispatch/combine through the ep API against the reference, then time them as DeepEP's test does (--tune: sweep launch parameters)", runIntranode)
}

// inOpts are the flags of `ep-bench intranode`.
type inOpts struct {
	kind device.Kind
	// interSMs, interThreads: ep-bench internode's --sms and --threads
	// (the internode kernels' grid; 0: internode's defaults).
	interSMs, interThreads int
	tokens                 []int
	hidden, topk, experts  int
	masked                 int
	seed                   uint64
	fp8, graph             bool
	sms                    []int // 0: the Buffer's default
	dispatchThreads        int
	copyMode               ep.CopyMode
	combineThreads         int
	warmup, iters          int
	flushMiB               int
	tune                   bool
	tuneSMs                []int
	tuneWarmup, tuneIters  int
	ranks                  int
	nodes                  int // internode: virtual nodes (0: from the environment)
	timeout                time.Duration
	jsonPath, plotPrefix   string
	progress               *progress // nil: quiet
	showLaunch             bool      // print SMs and threads (GPUs, or asked for on the host backend)
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
	hostTiming := addTimingFlags(fs, &o.warmup, &o.iters, &o.flushMiB, timingDefaults{warmup: 50, iters: 50, hostWarmup: 2, hostIters: 5})
	fs.BoolVar(&o.tune, "tune", false, "sweep SMs and threads per block for cached dispatch and combine and print the best per (ranks, op), instead of the timings")
	tuneSMs := fs.String("tune-sms", "8,12,16,20,24,28,32", "SM counts the tuning sweeps")
	fs.IntVar(&o.tuneWarmup, "tune-warmup", 10, "warm-ups per tuning point")
	fs.IntVar(&o.tuneIters, "tune-iters", 20, "timed calls per tuning point")
	fs.IntVar(&o.ranks, "ranks", 0, "goroutine ranks when run without a launcher (default: every GPU up to 8, or 4 host ranks); more ranks than GPUs share them")
	gpus := addGPUsFlag(fs)
	fs.DurationVar(&o.timeout, "timeout", 0, "device-side wait timeout (default $GOEP_CHANNEL_TIMEOUT or 60s)")
	fs.StringVar(&o.jsonPath, "json", "", "also write checks and figures as JSON to this file (rank 0)")
	fs.StringVar(&o.plotPrefix, "plot", "", "write GB/s vs tokens as PREFIX.png and PREFIX.svg (with a --tokens sweep)")
	kind, set, err := parseBackend(fs, args, backend, gpus)
	if err != nil {
		return err
	}
	o.kind = kind
	// The host backend checks the same things with far fewer timed calls:
	// DeepEP's shape then runs in about a minute on two cores.
	hostTiming(kind, set)
	o.showLaunch = o.kind == device.CUDA || o.tune || set["sms"] || set["dispatch-threads"] || set["combine-threads"]
	if err := o.parseLists(*tokens, *copyMode, *sms, *tuneSMs); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	o.progress = newProgress(stderr)

	env, err := launcherEnv("intranode", o.kind)
	if err != nil {
		return err
	}
	if env.Size > 1 {
		return intranodeProcess(ctx, env, o, stdout)
	}
	return intranodeGoroutines(ctx, o, stdout)
}

// maxHidden bounds --hidden far above any model's (DeepSeek-V3: 7168) and
// far below where sizes overflow.
const maxHidden = 1 << 16

// parseLists reads the list-valued flags.
func (o *inOpts) parseLists(tokens, copyMode, sms, tuneSMs string) (err error) {
	if o.tokens, err = parseIntList(tokens); err != nil {
		return fmt.Errorf("--tokens: %w", err)
	}
	if o.copyMode, err = parseCopy(copyMode); err != nil {
		return err
	}
	o.sms = []int{0}
	if sms != "" {
		if o.sms, err = parseIntList(sms); err != nil {
			return fmt.Errorf("--sms: %w", err)
		}
	}
	if o.tuneSMs, err = parseIntList(tuneSMs); err != nil {
		return fmt.Errorf("--tune-sms: %w", err)
	}
	return nil
}

// validate checks every flag before any work; what depends on the number
// of ranks is checked by ep.SizeHints once that is known, still before any.
func (o *inOpts) validate() error {
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
	if o.experts < 1 {
		return fmt.Errorf("--experts %d: want at least 1", o.experts)
	}
	if o.topk < 1 {
		return fmt.Errorf("--topk %d: want at least 1", o.topk)
	}
	if err := checkRange("hidden", o.hidden, 1, maxHidden); err != nil {
		return err
	}
	if o.iters < 2 || o.warmup < 0 || o.flushMiB < 0 || o.masked < 0 || o.tuneIters < 2 || o.tuneWarmup < 0 || o.ranks < 0 {
		return errors.New("want --iters and --tune-iters >= 2 and non-negative --warmup, --tune-warmup, --flush-mib, --masked, --ranks")
	}
	if o.flushMiB > 1<<20 {
		return fmt.Errorf("--flush-mib %d: want at most %d", o.flushMiB, 1<<20)
	}
	if err := checkMasked(o.masked, o.topk, o.tokens); err != nil {
		return err
	}
	if o.timeout < 0 {
		return errors.New("--timeout must be positive")
	}
	if o.plotPrefix != "" {
		if err := checkOutput("plot", o.plotPrefix+".png"); err != nil {
			return err
		}
	}
	return checkOutput("json", o.jsonPath)
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
