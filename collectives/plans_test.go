package collectives_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
)

// TestPlansFirst registers the 2-GPU in-place allreduce and allgather
// plans and checks that in-place calls of 2 host ranks go through them
// (Work.Algorithm names the plan) with correct results, while
// out-of-place calls, which no plan matches, fall back to the native
// algorithms.
func TestPlansFirst(t *testing.T) {
	reg := &plan.Registry{}
	_, err := reg.AddFile("plan/testdata/plans/reduce.json")
	require.NoError(t, err)
	_, err = reg.AddFile("plan/testdata/plans/allgather.json")
	require.NoError(t, err)
	const n = 2
	const count = 1000 // 2000 bytes of bf16: not a multiple of chunks x 16
	ctx := context.Background()
	errs := colltest.RunLocal(ctx, device.Host, n, bootstrap.Config{}, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		if err := c.UsePlans(ctx, reg); err != nil {
			return err
		}
		dev := c.Device()
		buf, err := dev.Alloc(n * count * 2)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		other, err := dev.Alloc(n * count * 2)
		if err != nil {
			return err
		}
		defer dev.Free(other)
		fill := func(rank int) []byte {
			b := make([]byte, count*2)
			plan.FillSmallInt(plan.BF16, rank, 7, b)
			return b
		}
		inputs := [][]byte{fill(0), fill(1)}
		// In-place allreduce: the plan.
		require.NoError(t, dev.CopyIn(buf.Ptr, inputs[c.Rank()]))
		w, err := c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, count, ref.BF16, ref.Sum)
		if err != nil {
			return err
		}
		if w.Algorithm() != "plan:reduce" {
			return fmt.Errorf("allreduce ran %s, want the plan", w.Algorithm())
		}
		got := make([]byte, count*2)
		require.NoError(t, dev.CopyOut(got, buf.Ptr))
		want, _ := plan.Expected("allreduce", plan.BF16, plan.ReduceSum, inputs, count*2)
		if !bytes.Equal(got, want[0]) {
			return fmt.Errorf("rank %d: plan allreduce result differs", c.Rank())
		}
		// In-place allgather: the plan.
		require.NoError(t, dev.CopyIn(buf.Ptr+uintptr(c.Rank()*count*2), inputs[c.Rank()]))
		w, err = c.AllGather(ctx, nil, buf.Ptr+uintptr(c.Rank()*count*2), buf.Ptr, count, ref.BF16)
		if err != nil {
			return err
		}
		if w.Algorithm() != "plan:allgather" {
			return fmt.Errorf("allgather ran %s, want the plan", w.Algorithm())
		}
		all := make([]byte, n*count*2)
		require.NoError(t, dev.CopyOut(all, buf.Ptr))
		if !bytes.Equal(all, append(append([]byte{}, inputs[0]...), inputs[1]...)) {
			return fmt.Errorf("rank %d: plan allgather result differs", c.Rank())
		}
		// Out of place: no plan matches, a native algorithm runs.
		require.NoError(t, dev.CopyIn(other.Ptr, inputs[c.Rank()]))
		w, err = c.AllReduce(ctx, nil, other.Ptr, buf.Ptr, count, ref.BF16, ref.Sum)
		if err != nil {
			return err
		}
		if w.Algorithm() == "plan:reduce" {
			return fmt.Errorf("out-of-place allreduce ran the in-place plan")
		}
		// A min reduction: the sum plan declines.
		w, err = c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, count, ref.BF16, ref.Min)
		if err != nil {
			return err
		}
		if w.Algorithm() == "plan:reduce" {
			return fmt.Errorf("min allreduce ran the sum plan")
		}
		return nil
	})
	ranktest.NoErrors(t, errs)
}

// On GPUs a matching plan runs on the GPU interpreter when the call's
// buffer is registered (at the start of its registration); an unregistered
// buffer goes to the native algorithms. Results match the definition.
func TestPlansFirstGPU(t *testing.T) {
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA GPU (%d, %v)", n, err)
	}
	reg := &plan.Registry{}
	_, err := reg.AddFile("plan/testdata/plans/reduce.json")
	require.NoError(t, err)
	const n, count = 2, 1 << 19 // 1 MiB of bf16 per rank
	ctx := context.Background()
	errs := colltest.RunLocal(ctx, device.CUDA, n, bootstrap.Config{}, gpuConfig(n), func(ctx context.Context, c *collectives.Communicator) error {
		if err := c.UsePlans(ctx, reg); err != nil {
			return err
		}
		dev := c.Device()
		inputs := make([][]byte, n)
		for r := range inputs {
			inputs[r] = make([]byte, count*2)
			plan.FillSmallInt(plan.BF16, r, 11, inputs[r])
		}
		want, _ := plan.Expected("allreduce", plan.BF16, plan.ReduceSum, inputs, count*2)
		for _, registered := range []bool{true, false} {
			buf, err := dev.Alloc(count * 2)
			if err != nil {
				return err
			}
			defer dev.Free(buf)
			if registered {
				if _, err := c.Register(ctx, buf); err != nil {
					return err
				}
			}
			for round := 0; round < 3; round++ {
				if err := dev.CopyIn(buf.Ptr, inputs[c.Rank()]); err != nil {
					return err
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				w, err := c.AllReduce(ctx, nil, buf.Ptr, buf.Ptr, count, ref.BF16, ref.Sum)
				if err != nil {
					return err
				}
				if got := w.Algorithm() == "plan:reduce"; got != registered {
					return fmt.Errorf("registered=%v: allreduce ran %s", registered, w.Algorithm())
				}
				if err := dev.DefaultStream().Synchronize(); err != nil {
					return err
				}
				got := make([]byte, count*2)
				if err := dev.CopyOut(got, buf.Ptr); err != nil {
					return err
				}
				if !bytes.Equal(got, want[0]) {
					return fmt.Errorf("rank %d registered=%v round %d: allreduce result differs", c.Rank(), registered, round)
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	})
	ranktest.NoErrors(t, errs)
}
