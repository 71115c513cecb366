package plan

import (
	"fmt"
	"testing"
)

// TestShippedPlans runs every plan of testdata/plans (MSCCL++ DSL outputs)
// on its world of host ranks at several sizes, including sizes that are
// not multiples of chunks x alignment and tiny ones, and checks every
// rank's output against the collective's definition.
func TestShippedPlans(t *testing.T) {
	for _, name := range planFiles(t) {
		p := loadTestPlan(t, name)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, size := range planSizes(p) {
				dt := DataTypes[int(size)%len(DataTypes)]
				t.Run(fmt.Sprintf("%d-%s", size, dt), func(t *testing.T) {
					runAndCheck(t, p, size, dt, ReduceSum, HostConfig{}, 2)
				})
			}
		})
	}
}

// planSizes are test sizes for p: whole chunks, odd numbers of elements,
// one element; smaller under the race detector for the 8-rank plans.
func planSizes(p *Plan) []uint64 {
	g := p.GPUs[0]
	c := uint64(max(1, min(g.InputChunks, g.OutputChunks)))
	if g.InputChunks == 0 || g.OutputChunks == 0 {
		c = uint64(max(g.InputChunks, g.OutputChunks))
	}
	unit := c * p.BufferAlignment
	if p.Collective == "alltoall" {
		unit = c * p.BufferAlignment // blocks per peer stay whole: checked by Expected
	}
	big := uint64(64)
	if raceEnabled || p.World() > 2 {
		big = 8
	}
	sizes := []uint64{unit, 3 * unit, big * unit}
	if p.Collective != "alltoall" {
		// Not multiples of chunks x align: padded chunks, Valid < Size.
		sizes = append(sizes, unit+4, 4, 3*unit/2+12)
	}
	return sizes
}
