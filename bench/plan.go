package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/dsl"
	"github.com/goep-dev/goep/collectives/plan/plantest"
	"github.com/goep-dev/goep/internal/device"
)

func init() {
	register("plan", "run an MSCCL++ execution plan (JSON, or a builtin DSL program) on its world of ranks: checked against the collective's definition, then timed: plan --plan FILE.json | --program NAME --ranks N [--emit FILE.json] [--size 32M] [--inplace]", runPlan)
}

// planExecutor is what `ep-bench plan` drives on the host backend (the
// host interpreter); on GPUs planSize runs collectives/plan/plantest.Check.
type planExecutor interface {
	World() int
	Resolved(rank int) *plan.Resolved
	Run(ctx context.Context, dt plan.DataType, inputs, outputs [][]byte) error
}

func newPlanExecutor(kind device.Kind, p *plan.Plan, size uint64, inPlace bool, cfg plan.HostConfig) (planExecutor, error) {
	return plan.NewHostWorld(p, p.World(), size, inPlace, cfg)
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", stderr)
	path := fs.String("plan", "", "plan file (MSCCL++ execution plan JSON)")
	program := fs.String("program", "", "builtin DSL program instead of a file: "+strings.Join(dsl.BuiltinNames(), ", "))
	ranks := fs.Int("ranks", 8, "ranks of --program")
	instances := fs.Int("instances", 0, "instances of --program (0: the program's default)")
	emit := fs.String("emit", "", "write the compiled --program's JSON to this file")
	backend := fs.String("backend", "auto", "cuda (the plan's world of GPUs, goroutine ranks), host or auto")
	sizes := fs.String("size", "", "input bytes per rank (the send buffer; allgather: one rank's part), e.g. 32M or 4K,1M (default 32M on GPU, 1M on host)")
	inplace := fs.Bool("inplace", false, "run in place (default: the plan's mode; a mode the plan is not written for is an error)")
	dtype := fs.String("dtype", "bf16", "element type: bf16, fp16, fp32, int32")
	packet := fs.String("packet", "LL16", "LL packet type of LL plans: LL16 or LL8")
	iters := fs.Int("iters", 0, "timed launches per size (default 20 on GPU, 3 on host)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on every wait of a launch")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-bench plan --plan FILE.json [--size 32M] [--inplace] [flags]")
		fmt.Fprintln(stderr, "       ep-bench plan --program NAME --ranks N [--emit FILE.json] [--size 32M] [--inplace] [flags]")
		fmt.Fprintln(stderr, "Runs the plan on as many goroutine ranks as it has GPUs, checks every rank's output against")
		fmt.Fprintln(stderr, "allreduce/allgather/reducescatter/alltoall/sendrecv/broadcast on random small-integer inputs, then times it.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*path == "") == (*program == "") {
		fs.Usage()
		return errUsage
	}
	set := given(fs)
	if set["iters"] && *iters < 1 {
		return fmt.Errorf("--iters %d: want at least 1", *iters)
	}
	// The plan runs its whole world of ranks as goroutines of this process;
	// several launched copies would each run all of it, independently.
	env, err := launcherEnv("plan", device.CUDA)
	if err != nil {
		return err
	}
	if env.Size > 1 {
		return fmt.Errorf("plan runs every rank of the plan in this one process (goroutine ranks); it cannot be one of %d processes (%s): "+
			"run `ep-bench plan` without a launcher (in a batch script of an allocation: %s=none)", env.Size, launchedBy(env), bootstrap.EnvLauncher)
	}
	explicit := set["inplace"]
	var p *plan.Plan
	if *program != "" {
		p, err = compileProgram(*program, dsl.Options{Ranks: *ranks, Instances: *instances, InPlace: explicit && *inplace}, *emit)
	} else {
		p, err = plan.Load(*path)
	}
	if err != nil {
		return err
	}
	kind, why, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	gpus := 0
	if kind == device.CUDA {
		// Fewer GPUs than the plan's ranks: ranks share GPUs (checked the
		// same way; timed, but not NVLink figures).
		if gpus, err = device.CUDADeviceCount(); err != nil || gpus == 0 {
			if *backend != "auto" {
				return fmt.Errorf("plan %s: no CUDA GPU (%v)", p.Name, err)
			}
			kind, why = device.Host, "no CUDA GPU"
		}
		gpus = min(gpus, p.World())
		if note := sharedGPUNote(kind, p.World()); note != "" {
			fmt.Fprintln(stdout, "note:", note)
		}
	}
	gpu := kind == device.CUDA
	list, err := parseSizes(*sizes, pick(gpu, "32M", "1M"))
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	dt, err := plan.ParseDataType(*dtype)
	if err != nil {
		return fmt.Errorf("--dtype: %w", err)
	}
	cfg := plan.HostConfig{Timeout: *timeout}
	switch strings.ToUpper(*packet) {
	case "LL16":
	case "LL8":
		cfg.Packet = plan.LL8
	default:
		return fmt.Errorf("--packet %q: want LL16 or LL8", clip(*packet, 100))
	}
	mode := p.InPlace
	if set["inplace"] {
		mode = *inplace
	}
	if *iters == 0 {
		*iters = pick(gpu, 20, 3)
	}
	// Every size is checked before any runs: a whole number of elements,
	// and one the plan takes in this mode.
	for _, size := range list {
		if size%dt.Size() != 0 {
			return fmt.Errorf("--size: %d bytes is not a whole number of %s elements (%d bytes each)", size, dt, dt.Size())
		}
		if _, err := plan.Resolve(p, 0, uint64(size), mode); err != nil {
			return fmt.Errorf("--size %d: %w", size, err)
		}
	}
	fmt.Fprintf(stdout, "plan %s: %s, %s, %d GPUs, %s, backend %s", p.Name, p.Collective, p.Protocol, p.World(),
		map[bool]string{true: "in place", false: "out of place"}[mode], kind)
	if why != "" {
		fmt.Fprintf(stdout, " (%s)", firstClause(why))
	}
	fmt.Fprintln(stdout)
	prog := newProgress(stderr)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bytes/rank\tcheck\tlaunches\tmean us\tmin us\talg GB/s\t")
	var failed []string
	for i, size := range list {
		prog.printf("size %s (%d/%d): checking, then %d timed launches", human(size), i+1, len(list), *iters)
		row, err := planSize(ctx, kind, p, uint64(size), mode, dt, cfg, *iters, gpus)
		if ierr := interrupted(ctx); ierr != nil {
			return ierr
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("size %d: %v", size, err))
			fmt.Fprintf(tw, "%d\tFAIL\t\t\t\t\t\n", size)
			continue
		}
		fmt.Fprintf(tw, "%d\tok\t%d\t%.1f\t%.1f\t%s\t\n", size, *iters, row.mean, row.min, gbps(row.gbps))
	}
	tw.Flush()
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "\n"))
	}
	return nil
}

// firstClause is the part of a message before its first ": ", for a header
// that should not repeat a long chain of causes.
func firstClause(s string) string {
	if i := strings.Index(s, ": "); i >= 0 {
		return s[:i]
	}
	return s
}

// compileProgram compiles a builtin DSL program (in place when asked)
// and writes its JSON to emit when set.
func compileProgram(name string, o dsl.Options, emit string) (*plan.Plan, error) {
	prog, err := dsl.Build(name, o)
	if err != nil {
		return nil, err
	}
	p, js, err := prog.Compile()
	if err != nil {
		return nil, err
	}
	if emit != "" {
		if err := os.WriteFile(emit, js, 0o644); err != nil {
			return nil, fmt.Errorf("--emit: %w", err)
		}
	}
	return p, nil
}

type planRow struct{ mean, min, gbps float64 }

// planSize checks one size (two launches: the second runs on the other
// scratch half and flag parity), then times iters launches.
func planSize(ctx context.Context, kind device.Kind, p *plan.Plan, size uint64, inPlace bool, dt plan.DataType, cfg plan.HostConfig, iters, gpus int) (planRow, error) {
	if kind == device.CUDA {
		// Resolving first refuses a size or mode the plan does not take.
		r0, err := plan.Resolve(p, 0, size, inPlace)
		if err != nil {
			return planRow{}, err
		}
		res, err := plantest.CheckOn(ctx, p, size, dt, cfg.Packet, iters, gpus)
		if err != nil {
			return planRow{}, err
		}
		us := float64(res.PerCall) / 1e3
		moved := float64(max(r0.InputBytes, r0.OutputBytes))
		return planRow{mean: us, min: us, gbps: moved / res.PerCall.Seconds() / 1e9}, nil
	}
	ex, err := newPlanExecutor(kind, p, size, inPlace, cfg)
	if err != nil {
		return planRow{}, err
	}
	for launch := 0; launch < 2; launch++ {
		if err := interrupted(ctx); err != nil {
			return planRow{}, err
		}
		in, out, orig, err := planBuffers(ctx, ex, dt, size*7+uint64(launch))
		if err != nil {
			return planRow{}, err
		}
		if err := ex.Run(ctx, dt, in, out); err != nil {
			return planRow{}, err
		}
		want, err := planExpected(ctx, p.Collective, dt, orig, len(out[0]))
		if err != nil {
			return planRow{}, err
		}
		for r := range out {
			if err := compareOutput(ctx, out[r], want[r]); err != nil {
				return planRow{}, fmt.Errorf("launch %d: rank %d: %w", launch, r, err)
			}
		}
	}
	in, out, _, err := planBuffers(ctx, ex, dt, 1)
	if err != nil {
		return planRow{}, err
	}
	var total, best time.Duration
	for i := 0; i < iters; i++ {
		if err := interrupted(ctx); err != nil {
			return planRow{}, err
		}
		start := time.Now()
		if err := ex.Run(ctx, dt, in, out); err != nil {
			return planRow{}, err
		}
		d := time.Since(start)
		total += d
		if i == 0 || d < best {
			best = d
		}
	}
	mean := total / time.Duration(iters)
	moved := float64(ex.Resolved(0).InputBytes)
	if o := float64(ex.Resolved(0).OutputBytes); o > moved {
		moved = o
	}
	return planRow{mean: float64(mean.Microseconds()), min: float64(best.Microseconds()), gbps: moved / mean.Seconds() / 1e9}, nil
}

// planBuffers makes every rank's buffers with rank-dependent small-integer
// inputs (aliased in place) and returns the inputs' original contents.
func planBuffers(ctx context.Context, ex planExecutor, dt plan.DataType, seed uint64) (in, out, orig [][]byte, err error) {
	W := ex.World()
	in, out, orig = make([][]byte, W), make([][]byte, W), make([][]byte, W)
	for r := 0; r < W; r++ {
		res := ex.Resolved(r)
		switch {
		case res.InPlace && res.InputBytes > res.OutputBytes:
			in[r] = make([]byte, res.InputBytes)
			out[r] = plan.InPlaceOutput(res, in[r])
		case res.InPlace:
			out[r] = make([]byte, res.OutputBytes)
			in[r] = plan.InPlaceInput(res, out[r])
		default:
			in[r], out[r] = make([]byte, res.InputBytes), make([]byte, res.OutputBytes)
		}
		if err := fillChunks(ctx, dt, r, seed, in[r]); err != nil {
			return nil, nil, nil, err
		}
		orig[r] = append([]byte(nil), in[r]...)
	}
	return in, out, orig, nil
}

// planChunk is how much host work runs between two looks at the context:
// large sizes take seconds per pass on the host, and Ctrl-C must not wait.
var planChunk = 4 << 20

// fillChunks fills buf with small integers chunk by chunk (each chunk its
// own stream of the seed), stopping when ctx is cancelled.
func fillChunks(ctx context.Context, dt plan.DataType, rank int, seed uint64, buf []byte) error {
	for off, i := 0, uint64(0); off < len(buf); off, i = off+planChunk, i+1 {
		if err := interrupted(ctx); err != nil {
			return err
		}
		plan.FillSmallInt(dt, rank, seed^(i*0x9e3779b97f4a7c15), buf[off:min(off+planChunk, len(buf))])
	}
	return nil
}

// planExpected is plan.Expected with the reductions, the slow part, done
// chunk by chunk (a reduction is element-wise, so chunks of the inputs give
// the same chunks of the result) and stopped when ctx is cancelled.
func planExpected(ctx context.Context, collective string, dt plan.DataType, inputs [][]byte, outBytes int) ([][]byte, error) {
	if collective != "allreduce" && collective != "reducescatter" {
		return plan.Expected(collective, dt, plan.ReduceSum, inputs, outBytes)
	}
	in := len(inputs[0])
	sum := make([]byte, in)
	parts := make([][]byte, len(inputs))
	for off := 0; off < in; off += planChunk {
		if err := interrupted(ctx); err != nil {
			return nil, err
		}
		end := min(off+planChunk, in)
		for r := range inputs {
			parts[r] = inputs[r][off:end]
		}
		got, err := plan.Expected("allreduce", dt, plan.ReduceSum, parts, end-off)
		if err != nil {
			return nil, err
		}
		copy(sum[off:end], got[0])
	}
	out := make([][]byte, len(inputs))
	for r := range out {
		if collective == "allreduce" {
			out[r] = sum
			continue
		}
		if in != len(inputs)*outBytes {
			return nil, fmt.Errorf("reducescatter: input %d bytes, want %d x %d", in, len(inputs), outBytes)
		}
		out[r] = sum[r*outBytes : (r+1)*outBytes]
	}
	return out, nil
}

// compareOutput compares a rank's output with the expected one chunk by
// chunk and names the first differing byte.
func compareOutput(ctx context.Context, got, want []byte) error {
	for off := 0; off < len(want); off += planChunk {
		if err := interrupted(ctx); err != nil {
			return err
		}
		end := min(off+planChunk, len(want))
		if bytes.Equal(got[off:end], want[off:end]) {
			continue
		}
		for i := off; i < end; i++ {
			if got[i] != want[i] {
				return fmt.Errorf("output byte %d of %d is %#x, want %#x", i, len(want), got[i], want[i])
			}
		}
	}
	return nil
}
