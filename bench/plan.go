package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/plantest"
	"github.com/goep-dev/goep/internal/device"
)

func init() {
	register("plan", "run an MSCCL++ execution plan (JSON) on its world of ranks: checked against the collective's definition, then timed: plan --plan FILE.json [--size 32M] [--inplace]", runPlan)
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
	backend := fs.String("backend", "auto", "cuda (the plan's world of GPUs, goroutine ranks), host or auto")
	sizes := fs.String("size", "", "input bytes per rank (the send buffer; allgather: one rank's part), e.g. 32M or 4K,1M (default 32M on GPU, 1M on host)")
	inplace := fs.Bool("inplace", false, "run in place (default: the plan's mode; a mode the plan is not written for is an error)")
	dtype := fs.String("dtype", "bf16", "element type: bf16, fp16, fp32, int32")
	packet := fs.String("packet", "LL16", "LL packet type of LL plans: LL16 or LL8")
	iters := fs.Int("iters", 0, "timed launches per size (default 20 on GPU, 3 on host)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on every wait of a launch")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-bench plan --plan FILE.json [--size 32M] [--inplace] [flags]")
		fmt.Fprintln(stderr, "Runs the plan on as many goroutine ranks as it has GPUs, checks every rank's output against")
		fmt.Fprintln(stderr, "allreduce/allgather/reducescatter/alltoall/sendrecv on random small-integer inputs, then times it.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fs.Usage()
		return errUsage
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "inplace" })
	p, err := plan.Load(*path)
	if err != nil {
		return err
	}
	kind, why, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	if kind == device.CUDA {
		if n, err := device.CUDADeviceCount(); err != nil || n < p.World() {
			if *backend != "auto" {
				return fmt.Errorf("plan %s needs %d GPUs; this machine has %d (%v)", p.Name, p.World(), n, err)
			}
			kind, why = device.Host, fmt.Sprintf("%d GPUs here, the plan needs %d", n, p.World())
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
		return fmt.Errorf("--packet %q: want LL16 or LL8", *packet)
	}
	mode := p.InPlace
	if explicit {
		mode = *inplace
	}
	if *iters == 0 {
		*iters = pick(gpu, 20, 3)
	}
	fmt.Fprintf(stdout, "plan %s: %s, %s, %d GPUs, %s, backend %s", p.Name, p.Collective, p.Protocol, p.World(),
		map[bool]string{true: "in place", false: "out of place"}[mode], kind)
	if why != "" {
		fmt.Fprintf(stdout, " (%s)", why)
	}
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bytes/rank\tcheck\tlaunches\tmean us\tmin us\talg GB/s\t")
	var failed []string
	for _, size := range list {
		row, err := planSize(ctx, kind, p, uint64(size), mode, dt, cfg, *iters)
		if err != nil {
			failed = append(failed, fmt.Sprintf("size %d: %v", size, err))
			fmt.Fprintf(tw, "%d\tFAIL\t\t\t\t\t\n", size)
			continue
		}
		fmt.Fprintf(tw, "%d\tok\t%d\t%.1f\t%.1f\t%.3f\t\n", size, *iters, row.mean, row.min, row.gbps)
	}
	tw.Flush()
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "\n"))
	}
	return nil
}

type planRow struct{ mean, min, gbps float64 }

// planSize checks one size (two launches: the second runs on the other
// scratch half and flag parity), then times iters launches.
func planSize(ctx context.Context, kind device.Kind, p *plan.Plan, size uint64, inPlace bool, dt plan.DataType, cfg plan.HostConfig, iters int) (planRow, error) {
	if kind == device.CUDA {
		// Resolving first refuses a size or mode the plan does not take.
		r0, err := plan.Resolve(p, 0, size, inPlace)
		if err != nil {
			return planRow{}, err
		}
		res, err := plantest.Check(ctx, p, size, dt, cfg.Packet, iters)
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
		in, out, orig := planBuffers(ex, dt, size*7+uint64(launch))
		if err := ex.Run(ctx, dt, in, out); err != nil {
			return planRow{}, err
		}
		want, err := plan.Expected(p.Collective, dt, plan.ReduceSum, orig, len(out[0]))
		if err != nil {
			return planRow{}, err
		}
		for r := range out {
			for i := range out[r] {
				if out[r][i] != want[r][i] {
					return planRow{}, fmt.Errorf("launch %d: rank %d: output byte %d of %d is %#x, want %#x", launch, r, i, len(out[r]), out[r][i], want[r][i])
				}
			}
		}
	}
	in, out, _ := planBuffers(ex, dt, 1)
	var total, best time.Duration
	for i := 0; i < iters; i++ {
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
func planBuffers(ex planExecutor, dt plan.DataType, seed uint64) (in, out, orig [][]byte) {
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
		plan.FillSmallInt(dt, r, seed, in[r])
		orig[r] = append([]byte(nil), in[r]...)
	}
	return in, out, orig
}
