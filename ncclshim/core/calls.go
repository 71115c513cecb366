package core

import (
	"context"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// Call is one NCCL operation as the program issued it.
type Call struct {
	Kind   Kind
	Send   uintptr // sendbuff (unused by Recv)
	Recv   uintptr // recvbuff (unused by Send)
	Count  uint64  // as NCCL counts: per rank for allgather and reduce-scatter
	Type   DataType
	Op     RedOp // reductions only
	Root   int   // broadcast and reduce: the root; send and recv: the peer
	Stream uintptr
}

func (x Call) String() string {
	s := fmt.Sprintf("nccl%s(count %d, %s", map[Kind]string{AllReduce: "AllReduce", AllGather: "AllGather",
		ReduceScatter: "ReduceScatter", Broadcast: "Broadcast", Reduce: "Reduce", Send: "Send", Recv: "Recv",
		AllToAll: "AlltoAll", Gather: "Gather", Scatter: "Scatter"}[x.Kind], x.Count, x.Type)
	switch x.Kind {
	case AllReduce, ReduceScatter:
		s += ", " + x.Op.String()
	case Reduce:
		s += fmt.Sprintf(", %s, root %d", x.Op, x.Root)
	case Broadcast, Gather, Scatter:
		s += fmt.Sprintf(", root %d", x.Root)
	case Send, Recv:
		s += fmt.Sprintf(", peer %d", x.Root)
	}
	return s + ")"
}

func (x Call) reduces() bool {
	return x.Kind == AllReduce || x.Kind == ReduceScatter || x.Kind == Reduce
}

// validate checks x against NCCL's rules, with NCCL's codes.
func (c *Comm) validate(x *Call) *Error {
	if x.Type < 0 || x.Type >= nccl.NumTypes {
		return errorf(InvalidArgument, "%s: invalid data type %d", x, int(x.Type))
	}
	if x.reduces() && (x.Op < 0 || x.Op >= nccl.NumOps) {
		return errorf(InvalidArgument, "%s: invalid reduction %d (goep's shim has no custom reductions)", x, int(x.Op))
	}
	switch x.Kind {
	case Broadcast, Reduce, Send, Recv, Gather, Scatter:
		if x.Root < 0 || x.Root >= c.size {
			return errorf(InvalidArgument, "%s: rank %d is out of range [0, %d)", x, x.Root, c.size)
		}
	}
	mult := 1
	if x.Kind == AllGather || x.Kind == ReduceScatter || x.Kind == AllToAll || x.Kind == Gather || x.Kind == Scatter {
		mult = c.size
	}
	if _, err := bytesOf(x.Count, x.Type, mult); err != nil {
		return errorf(InvalidArgument, "%s: %s", x, err.Msg)
	}
	if x.Count == 0 {
		return nil
	}
	needSend := x.Kind != Recv && ((x.Kind != Broadcast && x.Kind != Scatter) || x.Root == c.rank)
	needRecv := x.Kind != Send && ((x.Kind != Reduce && x.Kind != Gather) || x.Root == c.rank)
	if needSend && x.Send == 0 {
		return errorf(InvalidArgument, "%s: sendbuff is NULL", x)
	}
	if needRecv && x.Recv == 0 {
		return errorf(InvalidArgument, "%s: recvbuff is NULL", x)
	}
	return nil
}

// Do runs or (inside a group of thread tid) queues one call.
func (c *Comm) Do(tid uint64, x Call) error {
	if c == nil {
		return errorf(InvalidArgument, "%s: comm is NULL", x)
	}
	c.mu.Lock()
	closed := c.closed
	var verr *Error
	if !closed {
		verr = c.validate(&x)
	}
	c.mu.Unlock()
	if closed {
		return errorf(InvalidArgument, "%s: the communicator is destroyed", x)
	}
	if verr != nil {
		return verr
	}
	if x.Count == 0 {
		return nil // nothing moves (NCCL's calls of count 0 are no-ops too)
	}
	if queue(tid, c, x) {
		return nil
	}
	ctx, cancel := background()
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed { // destroyed by another thread meanwhile
		return errorf(InvalidArgument, "%s: the communicator is destroyed", x)
	}
	return c.run(ctx, x, c.decide(x))
}

// decision is where a call goes and, for the native path, how.
type decision struct {
	path   Path
	algo   string // native: the algorithm collectives' selector chose
	copy   bool   // native on one rank: every collective is a copy
	dt     collectives.DataType
	count  int
	reason string // why not native (for the NCCL path's errors)
}

// decide picks the path of x: a matching plan, else a native algorithm
// (by collectives' selector and tuning), else NCCL. The caller holds c.mu.
func (c *Comm) decide(x Call) decision {
	if c.size == 1 && x.Kind != Send && x.Kind != Recv && x.Kind <= Reduce {
		return decision{path: PathNative, copy: true}
	}
	var k collectives.Kind
	switch x.Kind {
	case AllReduce:
		k = collectives.AllReduce
	case AllGather:
		k = collectives.AllGather
	case ReduceScatter:
		k = collectives.ReduceScatter
	default:
		return decision{path: PathNCCL, reason: x.Kind.String() + " has no native algorithm"}
	}
	if c.coll == nil {
		return decision{path: PathNCCL, reason: "goep's collectives are unavailable: " + c.collErr.Error()}
	}
	d := decision{count: int(x.Count)}
	dt, ok := nativeType(x.Type)
	switch {
	case ok:
		d.dt = dt
	case k == collectives.AllGather:
		// Bytes are bytes: an allgather of any type moves them as fp8.
		d.dt, d.count = collectives.FP8E4M3, int(x.Count)*x.Type.Size()
	default:
		return decision{path: PathNCCL, reason: "no native " + x.Type.String()}
	}
	if x.Count == 0 {
		d.path = PathNative
		return d
	}
	graph := c.capturing(x.Stream)
	registered := c.registered(x)
	if c.planMatches(x, d) && (c.kind == device.Host || c.planBuffers(x)) {
		d.path = PathPlan
		return d
	}
	algo, err := c.coll.Select(k, d.count, d.dt, nativeOp(x.Op), registered, graph)
	if err != nil || algo == collectives.AlgoNCCL {
		d.path = PathNCCL
		if err != nil {
			d.reason = err.Error()
		} else {
			d.reason = "the selector chose NCCL"
		}
		return d
	}
	d.path, d.algo = PathNative, algo
	return d
}

// planMatches mirrors collectives' plan query for x.
func (c *Comm) planMatches(x Call, d decision) bool {
	if c.plans == nil {
		return false
	}
	if plan.Runs(d.dt) != nil {
		return false
	}
	n := uint64(d.count * d.dt.Size())
	q := plan.Query{World: c.size, RanksPerNode: c.size, Bytes: n}
	switch x.Kind {
	case AllReduce:
		q.Collective, q.InPlace = "allreduce", x.Send == x.Recv
	case AllGather:
		q.Collective, q.InPlace = "allgather", x.Send == x.Recv+uintptr(uint64(c.rank)*n)
	case ReduceScatter:
		q.Collective, q.InPlace = "reducescatter", x.Recv == x.Send+uintptr(uint64(c.rank)*n)
	}
	if x.Kind != AllGather {
		switch x.Op {
		case nccl.Sum:
			q.Op = plan.ReduceSum
		case nccl.Min:
			q.Op = plan.ReduceMin
		case nccl.Max:
			q.Op = plan.ReduceMax
		default:
			return false
		}
	}
	return c.plans.Select(q) != nil
}

// capturing reports whether stream is being captured into a CUDA graph.
func (c *Comm) capturing(stream uintptr) bool {
	if c.cuCtx == nil {
		return false
	}
	st, err := cuda.WrapStream(c.cuCtx, stream).CaptureStatus()
	return err == nil && st == cuda.CaptureStatusActive
}

func (c *Comm) stream(h uintptr) (device.Stream, error) {
	if c.kind == device.Host {
		return c.dev.DefaultStream(), nil
	}
	return device.WrapStream(c.dev, h)
}

// run carries x out on path d (the caller holds c.mu).
func (c *Comm) run(ctx context.Context, x Call, d decision) error {
	switch d.path {
	case PathPlan, PathNative:
		return c.runNative(ctx, x, d)
	}
	// NCCL. Send and receive involve two ranks only, so NCCL is not set up
	// at one (that is collective) unless the communicator has two ranks;
	// without NCCL they go through the bootstrap.
	p2p := x.Kind == Send || x.Kind == Recv
	if c.ncclComm == nil && !c.ncclTried && p2p && c.size > 2 {
		return c.runStaged(ctx, x, "NCCL is not set up yet (it is made at the first collective that needs it)")
	}
	if err := c.ensureNCCL(ctx); err != nil {
		if x.Kind == Broadcast || p2p {
			return c.runStaged(ctx, x, err.Error())
		}
		why := ""
		if d.reason != "" {
			why = " (" + d.reason + ")"
		}
		return errorf(InvalidUsage, "%s needs NCCL%s, which is unavailable: %v", x, why, err)
	}
	if err := c.forward(x); err != nil {
		if nccl.IsMissing(err) {
			if x.Kind == Broadcast || p2p {
				return c.runStaged(ctx, x, err.Error())
			}
			return errorf(InvalidUsage, "%s: the NCCL in use lacks it: %v", x, err)
		}
		return errorf(InternalError, "rank %d: %s: %v", c.rank, x, err)
	}
	c.counts[x.Kind][PathNCCL].Add(1)
	return nil
}

func (c *Comm) runNative(ctx context.Context, x Call, d decision) error {
	s, err := c.stream(x.Stream)
	if err != nil {
		return errorf(UnhandledCudaError, "%s: %v", x, err)
	}
	if d.copy {
		// One rank: the result is the input (a reduction of one value,
		// whatever the type and operation).
		if x.Count > 0 && x.Send != x.Recv {
			n := int(x.Count) * x.Type.Size()
			if c.dev.Info().Kind == device.Host { // caller's plain host memory (see copyIn)
				copy(device.HostSlice[byte](x.Recv, n), device.HostSlice[byte](x.Send, n))
			} else if err := c.dev.CopyAsync(x.Recv, x.Send, n, s); err != nil {
				return errorf(UnhandledCudaError, "%s: %v", x, err)
			}
		}
		c.counts[x.Kind][PathNative].Add(1)
		return nil
	}
	var opts []collectives.CallOption
	if d.path == PathNative && d.algo != "" {
		opts = append(opts, collectives.WithAlgorithm(d.algo))
	}
	var w *collectives.Work
	op := nativeOp(x.Op)
	switch x.Kind {
	case AllReduce:
		w, err = c.coll.AllReduce(ctx, s, x.Send, x.Recv, d.count, d.dt, op, opts...)
	case AllGather:
		w, err = c.coll.AllGather(ctx, s, x.Send, x.Recv, d.count, d.dt, opts...)
	case ReduceScatter:
		w, err = c.coll.ReduceScatter(ctx, s, x.Send, x.Recv, d.count, d.dt, op, opts...)
	}
	if err != nil {
		return errorf(InternalError, "%s: %v", x, err)
	}
	path := PathNative
	if strings.HasPrefix(w.Algorithm(), "plan:") {
		path = PathPlan
	}
	c.counts[x.Kind][path].Add(1)
	return nil
}

// forward issues x on the real NCCL.
func (c *Comm) forward(x Call) error {
	n, dt, s := int(x.Count), x.Type, x.Stream
	switch x.Kind {
	case AllReduce:
		return c.ncclComm.AllReduce(x.Send, x.Recv, n, dt, x.Op, s)
	case AllGather:
		return c.ncclComm.AllGather(x.Send, x.Recv, n, dt, s)
	case ReduceScatter:
		return c.ncclComm.ReduceScatter(x.Send, x.Recv, n, dt, x.Op, s)
	case Broadcast:
		return c.ncclComm.Broadcast(x.Send, x.Recv, n, dt, x.Root, s)
	case Reduce:
		return c.ncclComm.Reduce(x.Send, x.Recv, n, dt, x.Op, x.Root, s)
	case Send:
		return c.ncclComm.Send(x.Send, n, dt, x.Root, s)
	case Recv:
		return c.ncclComm.Recv(x.Recv, n, dt, x.Root, s)
	case AllToAll:
		return c.ncclComm.AllToAll(x.Send, x.Recv, n, dt, s)
	case Gather:
		return c.ncclComm.Gather(x.Send, x.Recv, n, dt, x.Root, s)
	case Scatter:
		return c.ncclComm.Scatter(x.Send, x.Recv, n, dt, x.Root, s)
	}
	return fmt.Errorf("no NCCL call for %s", x.Kind)
}
