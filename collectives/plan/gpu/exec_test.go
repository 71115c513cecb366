package gpu_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/plantest"
	"github.com/goep-dev/goep/internal/device"
)

var planIters = flag.Int("plan.iters", 20, "timed executions per plan and size in TestShippedPlansGPU")

func gpus(t *testing.T) int {
	n, err := device.CUDADeviceCount()
	if err != nil {
		t.Skipf("no CUDA: %v", err)
	}
	if n == 0 {
		t.Skip("no CUDA GPU")
	}
	return n
}

func shippedPlans(t *testing.T) []*plan.Plan {
	dir := filepath.Join("..", "testdata", "plans")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []*plan.Plan
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			p, err := plan.Load(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

// TestShippedPlansGPU runs every shipped plan whose world fits this machine
// on that many GPUs (goroutine ranks), at several sizes and in every data
// type, checks every rank's output against the collective's definition
// after two launches (flags and scratch halves advance), then times it.
func TestShippedPlansGPU(t *testing.T) {
	n := gpus(t)
	for _, p := range shippedPlans(t) {
		if p.World() > n {
			if p.World()%n != 0 {
				t.Logf("%s: needs %d GPUs, %d here: skipped", p.Name, p.World(), n)
				continue
			}
			// More ranks than GPUs: ranks share GPUs (a correctness check).
			t.Run(p.Name+"-shared", func(t *testing.T) {
				for i, size := range []uint64{sizesFor(p)[0], 1 << 20, sizesFor(p)[len(sizesFor(p))-1]} {
					runPlanOn(t, p, size, plan.DataTypes[i%len(plan.DataTypes)], plan.LL16, n)
				}
				runPlanOn(t, p, 1<<20, plan.BF16, plan.LL8, n)
			})
			continue
		}
		t.Run(p.Name, func(t *testing.T) {
			for i, size := range sizesFor(p) {
				dt := plan.DataTypes[i%len(plan.DataTypes)]
				runPlan(t, p, size, dt, plan.LL16)
			}
			runPlan(t, p, sizesFor(p)[1], plan.BF16, plan.LL8)
		})
	}
}

// sizesFor: one unit of chunks x alignment, sizes that are not multiples of
// it, and 1 MiB and 32 MiB (upstream CI's size).
func sizesFor(p *plan.Plan) []uint64 {
	g := p.GPUs[0]
	c := uint64(max(g.InputChunks, g.OutputChunks, 1))
	if g.InputChunks > 0 && g.OutputChunks > 0 {
		c = uint64(min(g.InputChunks, g.OutputChunks))
	}
	unit := c * p.BufferAlignment
	sizes := []uint64{unit, 1 << 20, 32 << 20}
	if p.Collective != "alltoall" {
		sizes = append(sizes, 3*unit/2+12)
	}
	return sizes
}

func runPlan(t *testing.T, p *plan.Plan, size uint64, dt plan.DataType, pk plan.PacketType) {
	t.Helper()
	runPlanOn(t, p, size, dt, pk, p.World())
}

func runPlanOn(t *testing.T, p *plan.Plan, size uint64, dt plan.DataType, pk plan.PacketType, gpus int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := plantest.CheckOn(ctx, p, size, dt, pk, *planIters, gpus)
	if err != nil {
		t.Fatal(err)
	}
	note := ""
	if gpus < p.World() {
		note = fmt.Sprintf(", %d ranks on %d GPUs", p.World(), gpus)
	}
	t.Logf("%-14s %-9s %10d bytes %-5s %-4s  %9.2f us per call (slowest rank, %d back-to-back%s)", p.Name, p.Collective,
		size, dt, pk, float64(res.PerCall)/1e3, res.Iters, note)
}
