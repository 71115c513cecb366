package core

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/collectives/plan"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// Path is where a call ran.
type Path int

const (
	PathPlan   Path = iota // a registered execution plan
	PathNative             // goep's native algorithm
	PathNCCL               // the real NCCL
	PathStaged             // through host memory over goep's bootstrap (no NCCL)
	numPaths
)

func (p Path) String() string {
	if p < 0 || p >= numPaths {
		return fmt.Sprintf("path(%d)", int(p))
	}
	return [...]string{"plan", "native", "nccl", "staged"}[p]
}

// Kind is an NCCL operation.
type Kind int

const (
	AllReduce Kind = iota
	AllGather
	ReduceScatter
	Broadcast
	Reduce
	Send
	Recv
	AllToAll // NCCL only (2.28 and later), as are Gather and Scatter
	Gather
	Scatter
	numKinds
)

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return fmt.Sprintf("kind(%d)", int(k))
	}
	return [...]string{"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "send", "recv",
		"alltoall", "gather", "scatter"}[k]
}

// Comm is one rank's communicator (an ncclComm_t).
type Comm struct {
	mu      sync.Mutex
	rank    int
	size    int
	ordinal int // the GPU, or the rank on the host backend
	kind    device.Kind
	bs      bootstrap.Bootstrap
	dev     device.Device
	cuCtx   *cuda.Context             // nil on the host backend
	coll    *collectives.Communicator // nil when goep's could not be made: all to NCCL
	collErr error
	plans   *plan.Registry
	regs    map[uint64]*registration
	nextReg uint64

	ncclTried bool
	ncclErr   error
	ncclComm  *nccl.Comm

	counts    [numKinds][numPaths]atomic.Int64
	finalized bool
	closed    bool
}

// callTimeout bounds the host-side waits of one call (bootstrap
// exchanges); the bootstrap's own timeout applies as well.
const callTimeout = 10 * time.Minute

func background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// Init joins rank of an nranks-rank communicator whose ranks meet at id
// (ncclCommInitRank): over goep's TCP bootstrap, on the calling thread's
// GPU (or the host backend).
func Init(id UniqueID, nranks, rank int) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, errorf(InvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks)
	}
	uid, addr, err := id.parse()
	if err != nil {
		return nil, err
	}
	kind, err := backend()
	if err != nil {
		return nil, err
	}
	ordinal := rank
	if kind == device.CUDA {
		ordinal = currentOrdinal()
	}
	return connect(uid, addr, nranks, rank, kind, ordinal)
}

// connect joins the bootstrap at addr and builds the communicator on it.
func connect(uid, addr string, nranks, rank int, kind device.Kind, ordinal int) (*Comm, error) {
	ctx, cancel := background()
	defer cancel()
	bs, err := bootstrap.Connect(ctx, bootstrap.Config{Rank: rank, Size: nranks, RootAddr: addr, UniqueID: uid})
	if err != nil {
		return nil, errorf(SystemError, "ncclCommInitRank: rank %d: bootstrap at %s: %v", rank, addr, err)
	}
	c, err := newComm(ctx, bs, kind, ordinal)
	if err != nil {
		return nil, errors.Join(err, bs.Close())
	}
	return c, nil
}

// NoColor is NCCL_SPLIT_NOCOLOR: the rank joins no new communicator.
const NoColor = -1

// Split makes the communicators of ncclCommSplit (collective over c's
// ranks): the ranks of one color form one, ordered by key, then by their
// rank in c, on the same GPUs. A rank with NoColor gets nil.
func (c *Comm) Split(color, key int) (*Comm, error) {
	if c == nil {
		return nil, errNilComm("ncclCommSplit")
	}
	if color < NoColor {
		return nil, errorf(InvalidArgument, "ncclCommSplit: color %d", color)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errorf(InvalidArgument, "ncclCommSplit: the communicator is destroyed")
	}
	ctx, cancel := background()
	defer cancel()
	// Round 1: every rank's color and key.
	mine := []byte(fmt.Sprintf("%d %d", color, key))
	all, err := c.bs.AllGather(ctx, mine)
	if err != nil {
		c.mu.Unlock()
		return nil, errorf(SystemError, "ncclCommSplit: rank %d: %v", c.rank, err)
	}
	type member struct{ rank, color, key int }
	var group []member
	for r, b := range all {
		var m member
		if _, err := fmt.Sscanf(string(b), "%d %d", &m.color, &m.key); err != nil {
			c.mu.Unlock()
			return nil, errorf(InternalError, "ncclCommSplit: rank %d sent %q", r, b)
		}
		m.rank = r
		if m.color == color && color != NoColor {
			group = append(group, m)
		}
	}
	slices.SortStableFunc(group, func(a, b member) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.rank - b.rank
	})
	// Round 2: each group's first rank makes the new id.
	var id []byte
	if len(group) > 0 && group[0].rank == c.rank {
		uid, err := NewUniqueID()
		if err != nil {
			c.mu.Unlock()
			return nil, err
		}
		id = uid[:]
	}
	ids, err := c.bs.AllGather(ctx, id)
	kind, ordinal := c.kind, c.ordinal
	c.mu.Unlock()
	if err != nil {
		return nil, errorf(SystemError, "ncclCommSplit: rank %d: %v", c.rank, err)
	}
	if color == NoColor {
		return nil, nil
	}
	var newID UniqueID
	if len(ids[group[0].rank]) != IDSize {
		return nil, errorf(InternalError, "ncclCommSplit: rank %d sent no id", group[0].rank)
	}
	copy(newID[:], ids[group[0].rank])
	uid, addr, err := newID.parse()
	if err != nil {
		return nil, err
	}
	newRank := slices.IndexFunc(group, func(m member) bool { return m.rank == c.rank })
	if kind == device.Host {
		ordinal = newRank
	}
	return connect(uid, addr, len(group), newRank, kind, ordinal)
}

// InitAll makes ndev communicators of one process (ncclCommInitAll): rank
// i on GPU devlist[i] (i when devlist is nil), ranks as goroutines.
func InitAll(ndev int, devlist []int) ([]*Comm, error) {
	if ndev < 1 || (devlist != nil && len(devlist) != ndev) {
		return nil, errorf(InvalidArgument, "ncclCommInitAll: %d devices", ndev)
	}
	kind, err := backend()
	if err != nil {
		return nil, err
	}
	bss, err := bootstrap.NewInProcess(ndev, bootstrap.Config{})
	if err != nil {
		return nil, errorf(InternalError, "ncclCommInitAll: %v", err)
	}
	ctx, cancel := background()
	defer cancel()
	comms := make([]*Comm, ndev)
	errs := make([]error, ndev)
	var wg sync.WaitGroup
	for r := range comms {
		ordinal := r
		if devlist != nil && kind == device.CUDA {
			ordinal = devlist[r]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = newComm(ctx, bss[r], kind, ordinal)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for r, c := range comms {
			if c != nil {
				c.Abort()
			} else {
				bss[r].Close()
			}
		}
		return nil, err
	}
	return comms, nil
}

// newComm builds this rank's communicator over bs (collective). On error
// the caller still owns bs.
func newComm(ctx context.Context, bs bootstrap.Bootstrap, kind device.Kind, ordinal int) (*Comm, error) {
	c := &Comm{rank: bs.Rank(), size: bs.Size(), ordinal: ordinal, kind: kind, bs: bs, regs: map[uint64]*registration{}}
	var err error
	if kind == device.CUDA {
		if c.dev, err = acquireCUDA(ordinal); err != nil {
			return nil, errorf(UnhandledCudaError, "ncclCommInitRank: rank %d: %v", c.rank, err)
		}
		if cd, ok := c.dev.(interface{ Context() *cuda.Context }); ok {
			c.cuCtx = cd.Context()
		}
	} else {
		c.dev = device.OpenHost(ordinal)
	}
	// goep's communicator. When it cannot be made, every call goes to NCCL
	// (the reason is kept for the log and the errors).
	coll, err := collectives.New(ctx, bs, c.dev, collectives.Config{ForeignHostMemory: true})
	if err != nil {
		c.collErr = err
		Logf("rank %d: goep's collectives are unavailable, every call goes to NCCL: %v", c.rank, err)
	} else {
		c.coll = coll
		if reg, err := loadPlans(); err != nil {
			Logf("rank %d: %s: %v (no plans used)", c.rank, EnvPlans, err)
		} else if reg != nil {
			if err := coll.UsePlans(ctx, reg); err != nil {
				return nil, errors.Join(errorf(InternalError, "ncclCommInitRank: rank %d: plans: %v", c.rank, err), c.release())
			}
			c.plans = reg
		}
	}
	if os.Getenv(EnvEager) == "1" {
		if err := c.ensureNCCL(ctx); err != nil {
			Logf("rank %d: %s=1 but NCCL is unavailable: %v", c.rank, EnvEager, err)
		}
	}
	return c, nil
}

// plans of the process: $GOEP_NCCL_PLANS, loaded once, or those given to
// SetPlans.
var plans struct {
	mu     sync.Mutex
	loaded bool
	reg    *plan.Registry
	err    error
}

// SetPlans makes communicators created from now on try reg's plans first
// (nil: none; it replaces $GOEP_NCCL_PLANS).
func SetPlans(reg *plan.Registry) {
	plans.mu.Lock()
	defer plans.mu.Unlock()
	plans.loaded, plans.reg, plans.err = true, reg, nil
}

func loadPlans() (*plan.Registry, error) {
	plans.mu.Lock()
	defer plans.mu.Unlock()
	if !plans.loaded {
		plans.loaded = true
		if dir := os.Getenv(EnvPlans); dir != "" {
			reg := &plan.Registry{}
			if _, err := reg.AddDir(dir); err != nil {
				plans.err = err
			} else {
				plans.reg = reg
			}
		}
	}
	return plans.reg, plans.err
}

// Rank, Size and Device answer ncclCommUserRank, ncclCommCount and
// ncclCommCuDevice (0 on a nil Comm; unchanged after Destroy).
func (c *Comm) Rank() int {
	if c == nil {
		return 0
	}
	return c.rank
}

func (c *Comm) Size() int {
	if c == nil {
		return 0
	}
	return c.size
}

func (c *Comm) Device() int {
	if c == nil {
		return 0
	}
	return c.ordinal
}

// errNilComm is what a method of a nil *Comm returns (the C entry points
// check for NULL first; this keeps Go callers from a panic too).
func errNilComm(op string) *Error { return errorf(InvalidArgument, "%s: comm is NULL", op) }

// Counts is how many calls of each kind took each path.
func (c *Comm) Counts() [numKinds][numPaths]int64 {
	var out [numKinds][numPaths]int64
	if c == nil {
		return out
	}
	for k := range out {
		for p := range out[k] {
			out[k][p] = c.counts[k][p].Load()
		}
	}
	return out
}

// CountsString is the per-path summary printed with GOEP_NCCL_DEBUG=1.
func (c *Comm) CountsString() string {
	if c == nil {
		return "nil communicator"
	}
	counts := c.Counts()
	var parts []string
	for k := Kind(0); k < numKinds; k++ {
		var ps []string
		for p := Path(0); p < numPaths; p++ {
			if n := counts[k][p]; n > 0 {
				ps = append(ps, fmt.Sprintf("%s %d", p, n))
			}
		}
		if len(ps) > 0 {
			parts = append(parts, k.String()+": "+strings.Join(ps, ", "))
		}
	}
	if len(parts) == 0 {
		parts = []string{"no calls"}
	}
	where := fmt.Sprintf("cuda:%d", c.ordinal)
	if c.kind == device.Host {
		where = "host"
	}
	return fmt.Sprintf("rank %d/%d (%s): %s", c.rank, c.size, where, strings.Join(parts, "; "))
}

// ensureNCCL creates the real NCCL communicator over the bootstrap
// (collective among this communicator's ranks), once.
func (c *Comm) ensureNCCL(ctx context.Context) error {
	if c.ncclComm != nil {
		return nil
	}
	if c.ncclTried {
		return c.ncclErr
	}
	c.ncclTried = true
	var h uintptr
	if c.cuCtx != nil {
		h = c.cuCtx.Handle()
	}
	_, comm, err := nccl.InitOverBootstrap(ctx, c.bs, h)
	if err != nil {
		c.ncclErr = fmt.Errorf("rank %d: %w", c.rank, err)
		return c.ncclErr
	}
	c.ncclComm = comm
	return nil
}

// AsyncError reports a failure of work already issued (a device-side
// timeout naming the peer, or NCCL's asynchronous error).
func (c *Comm) AsyncError() error {
	if c == nil {
		return errNilComm("ncclCommGetAsyncError")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errorf(InvalidArgument, "communicator of rank %d is destroyed", c.rank)
	}
	if c.coll != nil {
		if err := c.coll.Check(); err != nil {
			return errorf(RemoteError, "%v", err)
		}
	}
	if c.ncclComm != nil {
		if err := c.ncclComm.AsyncError(); err != nil {
			return errorf(RemoteError, "%v", err)
		}
	}
	return nil
}

// Finalize flushes the communicator (ncclCommFinalize): it waits for this
// rank's work and prints the per-path counts with GOEP_NCCL_DEBUG=1. It
// does not wait for the other ranks on GPUs: programs finalize their
// communicators in orders that differ between ranks (PyTorch walks a hash
// map), and once this rank's kernels are done no peer touches its memory
// for them any more (the zero-copy kernels, which read peers' buffers,
// end with an exit barrier; the others write into a peer only what that
// peer waits for). On the host backend, where a
// rank's goroutine may still be in a call's Go twin, it waits for every
// rank (bounded).
func (c *Comm) Finalize() error {
	if c == nil {
		return errNilComm("ncclCommFinalize")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.finalizeLocked()
}

func (c *Comm) finalizeLocked() error {
	if c.closed {
		return errorf(InvalidArgument, "ncclCommFinalize: the communicator is destroyed")
	}
	if c.finalized {
		return nil
	}
	c.finalized = true
	if os.Getenv(EnvDebug) != "" {
		Logf("%s", c.CountsString())
	}
	var err error
	if c.cuCtx != nil {
		err = c.cuCtx.Synchronize()
	} else {
		ctx, cancel := background()
		defer cancel()
		err = c.bs.Barrier(ctx)
	}
	if err != nil {
		return errorf(InternalError, "ncclCommFinalize: rank %d: %v", c.rank, err)
	}
	return nil
}

// Destroy frees the communicator (ncclCommDestroy) after this rank's work
// is done. Like NCCL's, it does not wait for the other ranks (one thread
// may destroy the communicators of several ranks in turn); see Finalize
// for why that is safe on GPUs.
func (c *Comm) Destroy() error {
	if c == nil {
		return nil // as NCCL's: destroying NULL is a no-op
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	var serr error
	if !c.finalized {
		if os.Getenv(EnvDebug) != "" {
			Logf("%s", c.CountsString())
		}
		if c.cuCtx != nil {
			serr = c.cuCtx.Synchronize()
		}
	}
	return errors.Join(serr, c.free())
}

// Abort frees the communicator without waiting for peers
// (ncclCommAbort): device waits end at once.
func (c *Comm) Abort() error {
	if c == nil {
		return nil // as NCCL's: destroying NULL is a no-op
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.coll != nil {
		c.coll.Abort()
	}
	if c.ncclComm != nil {
		c.ncclComm.Abort()
		c.ncclComm = nil
	}
	if os.Getenv(EnvDebug) != "" && !c.finalized {
		Logf("%s (aborted)", c.CountsString())
	}
	return c.free()
}

func (c *Comm) free() error {
	return errors.Join(c.release(), c.bs.Close())
}

// release frees everything but the bootstrap.
func (c *Comm) release() error {
	c.closed = true
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.ncclComm != nil {
		keep(c.ncclComm.Destroy())
		c.ncclComm = nil
	}
	if c.coll != nil {
		keep(c.coll.Close())
		c.coll = nil
	}
	if c.dev != nil {
		if c.kind == device.CUDA {
			keep(releaseCUDA(c.ordinal))
		} else {
			keep(c.dev.Close())
		}
		c.dev = nil
	}
	if err := errors.Join(errs...); err != nil {
		return errorf(InternalError, "rank %d: destroy: %v", c.rank, err)
	}
	return nil
}
