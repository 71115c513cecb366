package dsl_test

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/dsl"
	"github.com/goep-dev/goep/collectives/plan/plantest"
	"github.com/goep-dev/goep/internal/device"
)

var (
	gpuIters = flag.Int("dsl.iters", 20, "timed executions per program and size in TestBuiltinsGPU")
	gpuRanks = flag.Int("dsl.ranks", 8, "ranks of the programs in TestBuiltinsGPU")
)

// TestBuiltinsGPU runs every builtin program, compiled for 8 ranks (in and
// out of place), through the GPU plan executor: ranks spread over
// min(visible GPUs, ranks) GPUs, sharing them when there are fewer. Each
// size is checked twice against the collective's definition (the second
// execution on the other scratch half and flag), then timed; times are
// logged (with ranks sharing a GPU they say little).
func TestBuiltinsGPU(t *testing.T) {
	n, err := device.CUDADeviceCount()
	if err != nil || n < 1 {
		t.Skipf("no CUDA GPU: %v", err)
	}
	W := *gpuRanks
	gpus := min(n, W)
	for _, b := range dsl.Builtins() {
		for _, inPlace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/inplace=%v", b.Name, inPlace), func(t *testing.T) {
				prog, err := b.Program(dsl.Options{Ranks: W, InPlace: inPlace})
				if err != nil {
					t.Fatal(err)
				}
				pl, _, err := prog.Compile()
				if err != nil {
					t.Fatal(err)
				}
				for i, size := range gpuSizes(b, W, prog.Config().Instances) {
					dt := plan.DataTypes[i%len(plan.DataTypes)]
					if b.Collective == dsl.ReduceScatter && size%uint64(W*dt.Size()) != 0 || size%uint64(dt.Size()) != 0 {
						dt = plan.FP32
					}
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
					res, err := plantest.CheckOn(ctx, pl, size, dt, plan.LL16, *gpuIters, gpus)
					cancel()
					if err != nil {
						t.Fatalf("size %d %s: %v", size, dt, err)
					}
					t.Logf("%-26s %-13s in-place %-5v %10d bytes %-5s %9.2f us per call (slowest rank, %d ranks on %d GPUs)",
						b.Name, b.Collective, inPlace, size, dt, float64(res.PerCall)/1e3, W, gpus)
				}
			})
		}
	}
}

// gpuSizes: small, not a multiple of the chunking, 1 MiB and 32 MiB of
// the collective's message (alltoall: whole chunks only).
func gpuSizes(b dsl.Builtin, W, instances int) []uint64 {
	w := uint64(W)
	unit := w * 16 * uint64(instances)
	big := uint64(32 << 20)
	if b.Collective == dsl.AllGather {
		big /= w
	}
	switch b.Collective {
	case dsl.AllToAll:
		return []uint64{unit, 1 << 20, 32 << 20}
	case dsl.ReduceScatter:
		return []uint64{w * 4, w * (unit + 4), 1 << 20, 32 << 20}
	}
	return []uint64{4, 3*unit/2 + 12, 1 << 20, big}
}
