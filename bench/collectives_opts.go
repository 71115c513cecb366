package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/collectives"
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
	progress   *progress // nil: quiet
}

func runCollectives(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("collectives", stderr)
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present)")
	ranks := fs.Int("ranks", 0, "goroutine ranks when run without a launcher (default: every GPU, or 4 host ranks); more ranks than GPUs share them")
	gpus := addGPUsFlag(fs)
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
	if err := gpus.apply(kind); err != nil {
		return err
	}
	gpu := kind == device.CUDA
	o := collOpts{kind: kind, ranks: *ranks, tune: *tune, tuneOut: *tuneOut, tuning: *tuning, algo: *algo,
		iters: *iters, graphCalls: *graphCalls, replays: *replays, flushIters: *flushIters, flushMiB: *flushMiB,
		timeout: *timeout, jsonPath: *jsonPath, plotPrefix: *plotPrefix}
	switch *compare {
	case "":
	case "nccl":
		if !gpu {
			return errors.New("--compare nccl needs GPUs: NCCL runs on GPUs only, and this run uses the host backend")
		}
		o.compare = true
	default:
		return fmt.Errorf("--compare %q: only nccl", clip(*compare, 100))
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
	set := given(fs)
	for _, f := range []string{"iters", "graph-calls", "replays", "flush-iters"} {
		if v, _ := strconv.Atoi(fs.Lookup(f).Value.String()); set[f] && v < 1 {
			return fmt.Errorf("--%s %d: want at least 1", f, v)
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
	if err := o.validate(); err != nil {
		return err
	}
	o.progress = newProgress(stderr)
	env, err := launcherEnv("collectives", kind)
	if err != nil {
		return err
	}
	if env.Size > 1 {
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

// validate checks what the parsed flags mean together, before any work:
// an algorithm every chosen collective has, sizes that are whole elements,
// something to run, and outputs that can be written.
func (o *collOpts) validate() error {
	if o.algo != "" {
		for _, k := range o.colls {
			if !slices.Contains(collectives.Algorithms(k), o.algo) {
				return fmt.Errorf("--algo %q: %s has no such algorithm (it has %s)", clip(o.algo, 100), k,
					strings.Join(collectives.Algorithms(k), ", "))
			}
		}
		if o.algo == collectives.AlgoNCCL && o.kind != device.CUDA {
			return errors.New("--algo nccl needs GPUs: NCCL runs on GPUs only, and this run uses the host backend")
		}
	}
	if o.explicit {
		for _, s := range o.sizes {
			if s%o.dt.Size() != 0 {
				return fmt.Errorf("--sizes: %d bytes is not a whole number of %s elements (%d bytes each)", s, o.dt, o.dt.Size())
			}
		}
	}
	if len(o.sizes) == 0 {
		return fmt.Errorf("--max %s: no size of the default sweep (1 KiB and up) fits; give --sizes", human(o.maxBytes))
	}
	if o.tuning != "" {
		if _, err := collectives.LoadTuning(o.tuning); err != nil {
			return fmt.Errorf("--tuning: %w", err)
		}
	}
	if o.tune {
		if err := checkOutput("tune-out", o.tuneOut); err != nil {
			return err
		}
	}
	if o.plotPrefix != "" {
		if err := checkOutput("plot", o.plotPrefix+".png"); err != nil {
			return err
		}
	}
	return checkOutput("json", o.jsonPath)
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
