// Package plantest runs execution plans on GPUs as the tests and `ep-bench
// plan` do: every rank's output checked against the collective's
// definition, then timed. It is test support, imported by no product
// package.

package plantest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/gpu"
	"github.com/goep-dev/goep/internal/device"
)

// Result is what Check measured: the time per execution of the slowest
// rank, from iters back-to-back executions between two events.
type Result struct {
	PerCall time.Duration
	Iters   int
}

// Check runs p for size bytes on its world of GPUs of this process
// (goroutine ranks, GPU r for rank r): two executions whose outputs are
// checked against the collective's definition on rank-dependent random
// small integers (the second runs on the other scratch half and flag),
// then iters timed ones. It is what the GPU tests and `ep-bench plan`
// run.
func Check(ctx context.Context, p *plan.Plan, size uint64, dt plan.DataType, pk plan.PacketType, iters int) (Result, error) {
	return CheckOn(ctx, p, size, dt, pk, iters, p.World())
}

// CheckOn is Check with the plan's ranks spread over gpus GPUs (rank r on
// GPU r % gpus). With fewer GPUs than ranks, ranks that share a GPU run
// their kernels side by side on it: a correctness check of plans written
// for more GPUs than the machine has (the times then say little).
func CheckOn(ctx context.Context, p *plan.Plan, size uint64, dt plan.DataType, pk plan.PacketType, iters, gpus int) (Result, error) {
	W := p.World()
	if gpus < 1 || gpus > W {
		gpus = W
	}
	res := make([]*plan.Resolved, W)
	for r := range res {
		var err error
		if res[r], err = plan.Resolve(p, r, size, p.InPlace); err != nil {
			return Result{}, err
		}
	}
	iters = max(iters, 1)
	var mu sync.Mutex
	got := make([][]byte, W)
	orig := make([][]byte, W)
	times := make([]time.Duration, W)
	errs := bootstrap.RunInProcess(ctx, W, bootstrap.Config{Timeout: time.Minute},
		func(ctx context.Context, bs bootstrap.Bootstrap) (err error) {
			me := bs.Rank()
			dev, err := device.Open(device.CUDA, me%gpus)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, dev.Close()) }()
			comm, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: 20 * time.Second}})
			if err != nil {
				return err
			}
			defer comm.Close()
			x := gpu.NewExecutor(comm)
			defer x.Close()
			r := res[me]
			var send, recv device.Buffer
			if p.InPlace {
				if recv, err = dev.Alloc(int(max(r.InputBytes, r.OutputBytes))); err != nil {
					return err
				}
				send = recv
			} else {
				if send, err = dev.Alloc(int(r.InputBytes)); err != nil {
					return err
				}
				defer dev.Free(send)
				if recv, err = dev.Alloc(int(r.OutputBytes)); err != nil {
					return err
				}
			}
			defer dev.Free(recv)
			// Host images: whole is the recv allocation; in is where the
			// input lies (in place: inside it).
			whole := make([]byte, recv.Size)
			garbage := rand.New(rand.NewPCG(size, uint64(me)))
			for i := range whole {
				whole[i] = byte(garbage.Uint32())
			}
			var in, out []byte
			if p.InPlace {
				if r.InputBytes > r.OutputBytes {
					in, out = whole[:r.InputBytes], plan.InPlaceOutput(r, whole[:r.InputBytes])
				} else {
					out = whole[:r.OutputBytes]
					in = plan.InPlaceInput(r, out)
				}
			} else {
				in, out = make([]byte, r.InputBytes), whole[:r.OutputBytes]
			}
			a := gpu.Args{Plan: p, Bytes: size, InPlace: p.InPlace, Send: send, Recv: recv, DType: dt, Packet: pk}
			for launch := 0; launch < 2; launch++ {
				plan.FillSmallInt(dt, me, size*7+uint64(launch), in)
				mu.Lock()
				orig[me] = bytes.Clone(in)
				mu.Unlock()
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
				if err := dev.DefaultStream().Synchronize(); err != nil {
					return err
				}
				if err := x.Check(); err != nil {
					return err
				}
				back := make([]byte, recv.Size)
				if err := dev.CopyOut(back, recv.Ptr); err != nil {
					return err
				}
				mu.Lock()
				got[me] = back[outOffset(r):][:len(out)]
				mu.Unlock()
				if err := comm.Barrier(ctx); err != nil {
					return err
				}
				if me == 0 {
					mu.Lock()
					err := compare(p, dt, orig, got)
					mu.Unlock()
					if err != nil {
						return fmt.Errorf("execution %d: %w", launch, err)
					}
				}
				if err := comm.Barrier(ctx); err != nil {
					return err
				}
			}
			// Timing: back-to-back executions between two events.
			s := dev.DefaultStream()
			start, err := dev.NewEvent()
			if err != nil {
				return err
			}
			defer start.Close()
			end, err := dev.NewEvent()
			if err != nil {
				return err
			}
			defer end.Close()
			if err := comm.Barrier(ctx); err != nil {
				return err
			}
			for i := 0; i < 3; i++ { // warm-up
				if err := x.Run(ctx, a); err != nil {
					return err
				}
			}
			if err := start.Record(s); err != nil {
				return err
			}
			for i := 0; i < iters; i++ {
				if err := x.Run(ctx, a); err != nil {
					return err
				}
			}
			if err := end.Record(s); err != nil {
				return err
			}
			if err := end.Synchronize(); err != nil {
				return err
			}
			if err := x.Check(); err != nil {
				return err
			}
			d, err := dev.Elapsed(start, end)
			if err != nil {
				return err
			}
			times[me] = d / time.Duration(iters)
			// No rank frees its buffers while a peer may still read them.
			return comm.Barrier(ctx)
		})
	for r, err := range errs {
		if err != nil {
			return Result{}, fmt.Errorf("%s, %d bytes, %s, %s: rank %d: %w", p.Name, size, dt, pk, r, err)
		}
	}
	out := Result{Iters: iters}
	for _, d := range times {
		out.PerCall = max(out.PerCall, d)
	}
	return out, nil
}

// outOffset is where the output starts in the recv allocation.
func outOffset(r *plan.Resolved) uint64 {
	if r.InPlace && r.OutputBytes < r.InputBytes {
		return uint64(r.Rank) * r.OutputBytes
	}
	return 0
}

func compare(p *plan.Plan, dt plan.DataType, orig, got [][]byte) error {
	want, err := plan.Expected(p.Collective, dt, plan.ReduceSum, orig, len(got[0]))
	if err != nil {
		return err
	}
	for r := range got {
		if !bytes.Equal(got[r], want[r]) {
			i := 0
			for i < len(got[r]) && got[r][i] == want[r][i] {
				i++
			}
			return fmt.Errorf("rank %d: output differs first at byte %d of %d (got %#x, want %#x)", r, i, len(got[r]),
				got[r][i], want[r][i])
		}
	}
	return nil
}
