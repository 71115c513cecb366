package gpu_test

// The real kernels/plan_exec.cu (the GPU plan interpreter) on CPU threads
// (internal/cpuemu), through the Executor on goroutine ranks: every shipped
// plan, at sizes that are and are not multiples of its chunks, in every
// data type and both LL packet types, twice per case (the second execution
// runs on the other scratch half and flag), every rank's output compared
// with the collective's definition (plan.Expected).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/gpu"
	"github.com/goep-dev/goep/internal/cpuemu"
)

func TestEmulatedShippedPlans(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, p := range shippedPlans(t) {
		// Every emulated CUDA thread is an OS thread: few threads a block
		// (data ops stride over any count; "thread i" ops need one thread
		// per channel, far fewer than 32 in every shipped plan).
		p.NumThreadsPerBlock = 32
		if p.World() <= 2 {
			p.NumThreadsPerBlock = 64
		}
		t.Run(p.Name, func(t *testing.T) {
			g := p.GPUs[0]
			c := uint64(max(g.InputChunks, g.OutputChunks, 1))
			if g.InputChunks > 0 && g.OutputChunks > 0 {
				c = uint64(min(g.InputChunks, g.OutputChunks))
			}
			unit := c * p.BufferAlignment
			sizes := []uint64{unit, 4 * unit}
			if p.Collective != "alltoall" {
				sizes = append(sizes, 3*unit/2+12)
			}
			for i, size := range sizes {
				emuRunPlan(t, p, size, plan.DataTypes[i%len(plan.DataTypes)], plan.LL16)
			}
			emuRunPlan(t, p, 2*unit, plan.DataTypes[len(sizes)%len(plan.DataTypes)], plan.LL8)
		})
	}
}

func emuRunPlan(t *testing.T, p *plan.Plan, size uint64, dt plan.DataType, pk plan.PacketType) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	W := p.World()
	res := make([]*plan.Resolved, W)
	for r := range res {
		var err error
		if res[r], err = plan.Resolve(p, r, size, p.InPlace); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	orig, got := make([][]byte, W), make([][]byte, W)
	errs := bootstrap.RunInProcess(ctx, W, bootstrap.Config{Timeout: 2 * time.Minute}, func(ctx context.Context, bs bootstrap.Bootstrap) error {
		me := bs.Rank()
		return emuPlanRank(ctx, bs, p, res[me], size, dt, pk, func(launch int, in, out []byte) error {
			mu.Lock()
			defer mu.Unlock()
			if in != nil {
				orig[me] = bytes.Clone(in)
			} else {
				got[me] = out
			}
			return nil
		}, func(launch int) error {
			mu.Lock()
			defer mu.Unlock()
			want, err := plan.Expected(p.Collective, dt, plan.ReduceSum, orig, len(got[0]))
			if err != nil {
				return err
			}
			for r := range got {
				if i := firstDiff(got[r], want[r]); i >= 0 {
					return fmt.Errorf("execution %d: rank %d: output differs first at byte %d of %d (got %#x, want %#x)",
						launch, r, i, len(got[r]), got[r][i], want[r][i])
				}
			}
			return nil
		})
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s, %d bytes, %s, %s: rank %d: %v", p.Name, size, dt, pk, r, err)
		}
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// emuPlanRank is one rank: two executions with fresh random small
// integers; record(in) before each, record(out) after, and rank 0 compares
// (check) once every rank has recorded.
func emuPlanRank(ctx context.Context, bs bootstrap.Bootstrap, p *plan.Plan, r *plan.Resolved, size uint64, dt plan.DataType,
	pk plan.PacketType, record func(launch int, in, out []byte) error, check func(launch int) error) (err error) {
	me := bs.Rank()
	dev, err := cpuemu.Open(me, cpuemu.Options{SMs: 2})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	comm, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: 2 * time.Minute}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, comm.Close()) }()
	x := gpu.NewExecutor(comm)
	defer func() { err = errors.Join(err, x.Close()) }()
	recv, err := dev.Alloc(int(max(r.InputBytes, r.OutputBytes)))
	if err != nil {
		return err
	}
	send := recv
	if !p.InPlace {
		if send, err = dev.Alloc(int(r.InputBytes)); err != nil {
			return err
		}
	}
	// Host images: whole is the recv allocation, garbage around the output;
	// in is where the input lies (in place: inside it).
	whole := make([]byte, recv.Size)
	rng := rand.New(rand.NewPCG(size, uint64(me)))
	for i := range whole {
		whole[i] = byte(rng.Uint32())
	}
	var in, out []byte
	outOff := uint64(0)
	switch {
	case !p.InPlace:
		in, out = make([]byte, r.InputBytes), whole[:r.OutputBytes]
	case r.InputBytes > r.OutputBytes:
		in, out = whole[:r.InputBytes], plan.InPlaceOutput(r, whole[:r.InputBytes])
		outOff = uint64(r.Rank) * r.OutputBytes
	default:
		out = whole[:r.OutputBytes]
		in = plan.InPlaceInput(r, out)
	}
	a := gpu.Args{Plan: p, Bytes: size, InPlace: p.InPlace, Send: send, Recv: recv, DType: dt, Packet: pk}
	for launch := 0; launch < 2; launch++ {
		plan.FillSmallInt(dt, me, size*7+uint64(launch), in)
		if err := record(launch, in, nil); err != nil {
			return err
		}
		if err := dev.CopyIn(recv.Ptr, whole); err != nil {
			return err
		}
		if !p.InPlace {
			if err := dev.CopyIn(send.Ptr, in); err != nil {
				return err
			}
		}
		if err := comm.Barrier(ctx); err != nil {
			return err
		}
		if err := x.Run(ctx, a); err != nil {
			return err
		}
		if err := x.Check(); err != nil {
			return err
		}
		back := make([]byte, recv.Size)
		if err := dev.CopyOut(back, recv.Ptr); err != nil {
			return err
		}
		if err := record(launch, nil, back[outOff:][:len(out)]); err != nil {
			return err
		}
		if err := comm.Barrier(ctx); err != nil {
			return err
		}
		if me == 0 {
			if err := check(launch); err != nil {
				return err
			}
		}
		// Nobody refills or frees while a peer may still read.
		if err := comm.Barrier(ctx); err != nil {
			return err
		}
	}
	if !p.InPlace {
		err = errors.Join(err, dev.Free(send))
	}
	return errors.Join(err, dev.Free(recv))
}

func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"plan_exec.cu"}, nil)
}
