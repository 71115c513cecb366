package collectives

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/collectives/plan/gpu"
	"github.com/goep-dev/goep/internal/device"
)

// planState is a communicator's registered plans.
type planState struct {
	reg  *plan.Registry
	key  string        // shared by the ranks: finds their common host worlds
	exec *gpu.Executor // GPU plan interpreter, made at the first GPU plan call
}

// UsePlans makes the communicator try reg's plans first for every call
// (then its native algorithms, then NCCL); nil stops using plans.
// Collective: every rank calls it with registries holding the same plans
// in the same order. A call forced to an algorithm (WithAlgorithm) skips
// the plans.
func (c *Communicator) UsePlans(ctx context.Context, reg *plan.Registry) error {
	if err := c.usable(); err != nil {
		return err
	}
	if err := checkCtx(ctx); err != nil {
		return c.errorf("plans: %w", err)
	}
	var mine [8]byte
	if _, err := rand.Read(mine[:]); err != nil {
		return c.errorf("plans: %w", err)
	}
	all, err := c.bs.AllGather(ctx, mine[:])
	if err != nil {
		return c.errorf("plans: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	exec := c.plans.exec
	if reg == nil {
		c.plans = planState{exec: exec}
		return nil
	}
	c.plans = planState{reg: reg, key: hex.EncodeToString(all[0]), exec: exec}
	return nil
}

// tryPlan runs x with a registered plan when one matches; ok reports
// whether one did (algo names it).
func (c *Communicator) tryPlan(ctx context.Context, x *call) (algo string, ok bool, err error) {
	if c.plans.reg == nil || x.forced {
		return "", false, nil
	}
	dt := x.dt
	if plan.Runs(dt) != nil {
		return "", false, nil // no plan runs this type
	}
	q := plan.Query{World: c.size, RanksPerNode: c.size, Bytes: uint64(x.sendBytes)}
	switch x.kind {
	case AllReduce:
		q.Collective, q.InPlace = "allreduce", x.send == x.recv
	case AllGather:
		q.Collective, q.InPlace = "allgather", x.send == x.recv+uintptr(c.rank*x.sendBytes)
	case ReduceScatter:
		q.Collective, q.InPlace = "reducescatter", x.recv == x.send+uintptr(c.rank*x.recvBytes)
	}
	if x.kind != AllGather {
		switch x.op {
		case Sum:
			q.Op = plan.ReduceSum
		case Min:
			q.Op = plan.ReduceMin
		case Max:
			q.Op = plan.ReduceMax
		default:
			return "", false, nil
		}
	}
	e := c.plans.reg.Select(q)
	if e == nil {
		return "", false, nil
	}
	algo = "plan:" + e.Plan.Name
	if c.gpu != nil {
		return c.tryPlanGPU(ctx, x, e, q, dt, algo)
	}
	w, err := hostWorldFor(c.plans.key, e, c.size, q)
	if err != nil {
		return "", false, c.errorf("%s: %w", x, err)
	}
	in := device.HostSlice[byte](x.send, x.sendBytes)
	out := device.HostSlice[byte](x.recv, x.recvBytes)
	if err := w.RunRank(ctx, c.rank, dt, in, out); err != nil {
		return "", false, c.errorf("%s: %w", x, err)
	}
	return algo, true, nil
}

// tryPlanGPU runs a plan on the GPU interpreter (the caller holds c.mu). Plans read and write the
// peers' buffers directly, so the call's buffers must be registered
// (Register), each at the start of its registration; other calls decline
// the plan and go on to the native algorithms.
func (c *Communicator) tryPlanGPU(ctx context.Context, x *call, e *plan.Entry, q plan.Query, dt plan.DataType, algo string) (string, bool, error) {
	// inspect found the registrations holding the buffers.
	big, off := x.recvReg, x.recvOff
	if x.sendBytes > x.recvBytes {
		big, off = x.sendReg, x.sendOff
	}
	if big == nil || off != 0 {
		return "", false, nil
	}
	args := gpu.Args{Plan: e.Plan, Bytes: q.Bytes, InPlace: q.InPlace, Send: big.buf, Recv: big.buf, DType: dt, Stream: x.stream}
	if !q.InPlace {
		if x.sendReg == nil || x.recvReg == nil || x.sendOff != 0 || x.recvOff != 0 {
			return "", false, nil
		}
		args.Send, args.Recv = x.sendReg.buf, x.recvReg.buf
	}
	// c.mu is held (run).
	if c.plans.exec == nil {
		c.plans.exec = gpu.NewExecutor(c.chans)
	}
	if err := c.plans.exec.Run(ctx, args); err != nil {
		return "", false, c.errorf("%s: %s: %w", x, algo, err)
	}
	return algo, true, nil
}

// hostWorlds caches the host executors of the process's goroutine ranks:
// the ranks of one communicator group meet in the same world.
var hostWorlds sync.Map // hostWorldKey -> *hostWorldOnce

type hostWorldKey struct {
	group   string
	entry   *plan.Entry
	bytes   uint64
	inPlace bool
}

type hostWorldOnce struct {
	once sync.Once
	w    *plan.HostWorld
	err  error
}

func hostWorldFor(group string, e *plan.Entry, world int, q plan.Query) (*plan.HostWorld, error) {
	v, _ := hostWorlds.LoadOrStore(hostWorldKey{group, e, q.Bytes, q.InPlace}, &hostWorldOnce{})
	h := v.(*hostWorldOnce)
	h.once.Do(func() {
		h.w, h.err = plan.NewHostWorld(e.Plan, world, q.Bytes, q.InPlace, plan.HostConfig{})
	})
	if h.err != nil {
		return nil, fmt.Errorf("plan %q: %w", e.Plan.Name, h.err)
	}
	return h.w, nil
}
