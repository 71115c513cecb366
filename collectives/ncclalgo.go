package collectives

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/internal/device"
)

// ncclState is the communicator's NCCL side, created at most once.
type ncclState struct {
	tried bool
	err   error // why NCCL is unavailable (after tried)
	lib   *nccl.Library
	comm  *nccl.Comm
}

// hostNCCL lets the host backend use an NCCL that works on host memory
// (the test stand-in collectives/internal/fakenccl). Real NCCL needs GPUs.
var hostNCCL = false

// NCCLLibrary reports the NCCL in use (nil before the first NCCL call, or
// when it is unavailable).
func (c *Communicator) NCCLLibrary() *nccl.Library {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nccl.lib
}

// ncclWhyNot says why NCCL cannot run calls ("" when it can, or may: lazy
// creation has not been tried yet).
func (c *Communicator) ncclWhyNot() string {
	switch {
	case c.nccl.comm != nil:
		return ""
	case c.cfg.NCCL == NCCLOff:
		return "NCCL is off (Config.NCCL, $" + EnvNCCLMode + ")"
	case c.info.Kind != device.CUDA && !hostNCCL:
		return "NCCL needs GPUs (this rank runs the host backend)"
	case c.gpuShared:
		return "NCCL refuses ranks that share a GPU, as some of this communicator's do (goep's native algorithms and plans run them)"
	case c.nccl.tried:
		return c.nccl.err.Error()
	}
	return ""
}

// ncclInit creates the NCCL communicator (collective): every rank loads
// NCCL and says whether it could; rank 0's unique id reaches the others
// through the bootstrap; every rank joins. Failure anywhere fails every
// rank, naming the ranks and their reasons. The caller holds c.mu (or is
// New).
func (c *Communicator) ncclInit(ctx context.Context) error {
	if c.nccl.comm != nil {
		return nil
	}
	if c.nccl.tried {
		return c.nccl.err
	}
	why := c.ncclWhyNot()
	c.nccl.tried = true
	fail := func(err error) error {
		c.nccl.err = err
		return err
	}
	if why != "" {
		return fail(errors.New(why))
	}
	// Round 1: can every rank load it? Rank 0 also sends the unique id.
	lib, err := nccl.Load()
	msg := []byte{0}
	if err != nil {
		msg = append([]byte{1}, err.Error()...)
	} else if c.rank == 0 {
		id, err := nccl.GetUniqueID()
		if err != nil {
			msg = append([]byte{1}, err.Error()...)
		} else {
			msg = append(msg, id[:]...)
		}
	}
	all, err := c.bs.AllGather(ctx, msg)
	if err != nil {
		return fail(c.errorf("NCCL setup: %w", err))
	}
	var bad []string
	for r, m := range all {
		if len(m) == 0 || m[0] != 0 {
			bad = append(bad, fmt.Sprintf("rank %d: %s", r, strings.TrimSpace(string(m[min(1, len(m)):]))))
		}
	}
	if len(bad) > 0 {
		return fail(c.errorf("NCCL unavailable: %s", strings.Join(bad, "; ")))
	}
	if len(all[0]) != 1+nccl.UniqueIDSize {
		return fail(c.errorf("NCCL setup: rank 0 sent a %d-byte unique id", len(all[0])-1))
	}
	var id nccl.UniqueID
	copy(id[:], all[0][1:])
	var ctxHandle uintptr
	if c.gpu != nil {
		ctxHandle = c.gpu.ctx.Handle()
	}
	comm, err := nccl.InitRank(ctxHandle, c.size, id, c.rank)
	if err != nil {
		return fail(c.errorf("%w", err))
	}
	c.nccl.lib, c.nccl.comm = lib, comm
	return nil
}

func (s *ncclState) asyncError() error {
	if s.comm == nil {
		return nil
	}
	return s.comm.AsyncError()
}

func (s *ncclState) close() error {
	if s.comm == nil {
		return nil
	}
	err := s.comm.Destroy()
	s.comm = nil
	return err
}

func ncclType(x *call) (nccl.DataType, int, error) {
	switch x.dt {
	case BF16:
		return nccl.Bfloat16, x.count, nil
	case FP16:
		return nccl.Float16, x.count, nil
	case FP32:
		return nccl.Float32, x.count, nil
	case FP8E4M3:
		if x.kind == AllGather {
			return nccl.Uint8, x.count, nil // bytes are bytes, any NCCL version
		}
		return nccl.Float8e4m3, x.count, nil
	}
	return 0, 0, fmt.Errorf("no NCCL type for %s", x.dt)
}

func ncclOp(op Op) nccl.RedOp {
	switch op {
	case Min:
		return nccl.Min
	case Max:
		return nccl.Max
	case Prod:
		return nccl.Prod
	case Avg:
		return nccl.Avg
	}
	return nccl.Sum
}

// launchNCCL enqueues x on NCCL (created first if needed).
func (c *Communicator) launchNCCL(ctx context.Context, x *call) error {
	if err := c.ncclInit(ctx); err != nil {
		return c.errorf("%s through NCCL: %w", x, err)
	}
	if x.dt == FP8E4M3 && x.kind != AllGather && c.nccl.lib.Version < 22400 {
		return c.errorf("%s: NCCL %s has no fp8 reductions (2.24 and later do)", x, c.nccl.lib.VersionString())
	}
	dt, n, err := ncclType(x)
	if err != nil {
		return c.errorf("%s: %w", x, err)
	}
	s := x.stream.Handle()
	comm := c.nccl.comm
	switch x.kind {
	case AllReduce:
		err = comm.AllReduce(x.send, x.recv, n, dt, ncclOp(x.op), s)
	case AllGather:
		err = comm.AllGather(x.send, x.recv, n, dt, s)
	case ReduceScatter:
		err = comm.ReduceScatter(x.send, x.recv, n, dt, ncclOp(x.op), s)
	}
	if err != nil {
		return c.errorf("%s: %w", x, err)
	}
	return nil
}
