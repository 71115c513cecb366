package dsl

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
)

// hostBuffers makes every rank's buffers for a launch of w: inputs filled
// with rank-dependent small integers, outputs with garbage, aliased in
// place as the plan says. orig is the inputs' contents before the launch.
func hostBuffers(w *plan.HostWorld, dt plan.DataType, seed uint64) (in, out, orig [][]byte) {
	W := w.World()
	in, out, orig = make([][]byte, W), make([][]byte, W), make([][]byte, W)
	for r := 0; r < W; r++ {
		res := w.Resolved(r)
		garbage := rand.New(rand.NewPCG(seed^0xbad, uint64(r)))
		if res.InPlace && res.InputBytes > res.OutputBytes {
			in[r] = make([]byte, res.InputBytes)
			out[r] = plan.InPlaceOutput(res, in[r])
		} else {
			out[r] = make([]byte, res.OutputBytes)
			for i := range out[r] {
				out[r][i] = byte(garbage.Uint32())
			}
			if res.InPlace {
				in[r] = plan.InPlaceInput(res, out[r])
			} else {
				in[r] = make([]byte, res.InputBytes)
			}
		}
		plan.FillSmallInt(dt, r, seed, in[r])
		orig[r] = bytes.Clone(in[r])
	}
	return in, out, orig
}

// runHost runs pl for msgBytes on the host interpreter, launches times,
// and compares every rank's output with the collective's definition.
func runHost(pl *plan.Plan, msgBytes uint64, dt plan.DataType, launches int) error {
	w, err := plan.NewHostWorld(pl, pl.World(), msgBytes, pl.InPlace, plan.HostConfig{Timeout: 20 * time.Second})
	if err != nil {
		return err
	}
	for l := 0; l < launches; l++ {
		in, out, orig := hostBuffers(w, dt, msgBytes*31+uint64(l))
		if err := w.Run(context.Background(), dt, in, out); err != nil {
			return fmt.Errorf("launch %d: %w", l, err)
		}
		if err := plan.CheckOutputs(pl.Collective, dt, plan.ReduceSum, orig, out); err != nil {
			return fmt.Errorf("launch %d: %w", l, err)
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
