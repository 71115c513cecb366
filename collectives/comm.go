package collectives

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/internal/device"
)

// Communicator runs collectives among the ranks of a bootstrap, one GPU
// each (or goroutine ranks of the host backend). It is built on a
// channels.Communicator: a scratch buffer and an LL packet buffer in
// registered (IPC-shareable) memory, exchanged with every peer; per-block
// semaphores with every peer; a registration table for zero-copy buffers;
// a pool of reusable GPU events behind Work handles; and, when needed, an
// NCCL communicator whose unique id crosses the ranks through the
// bootstrap.
//
// Collective calls must be made by every rank in the same order with
// matching arguments, from one goroutine at a time per communicator. The
// native kernels check every call on the device (call fingerprints, see
// fingerprint.go): ranks whose calls differ get ErrMismatch, naming the
// peer and the field, on every rank; Config.Debug also compares the calls
// over the bootstrap before launching. Worlds of more than abi.MaxRanks ranks run every
// collective through NCCL.
type Communicator struct {
	bs    bootstrap.Bootstrap
	dev   device.Device
	chans *channels.Communicator
	rank  int
	size  int
	cfg   Config
	// gpuShared: some GPU of the group runs several ranks (no NCCL then).
	gpuShared bool
	info      device.Info
	gpu       *gpuState // nil on the host backend

	native   bool // the native algorithms can run (2..MaxRanks ranks)
	scratch  device.Buffer
	packets  *channels.PacketBuffer
	sems     device.Buffer
	regsBuf  device.Buffer
	ctxBuf   device.Buffer
	peerScr  [abi.MaxRanks]uintptr
	ctrlOff  int                  // offset of the control block in the scratch (after the mailbox)
	dataOff  int                  // offset of the scratch data area (after the control block)
	llIDs    [abi.MaxRanks]uint32 // wait ids of the peers' LL packets (also name mismatch records)
	scrBytes int                  // bytes of the scratch data area

	mu      sync.Mutex
	args    *device.Args
	regs    []*Registration
	nextReg int
	events  *eventPool
	tuning  *Tuning
	plans   planState // UsePlans
	nccl    ncclState
	closed  bool
	owned   []func() error // closed after the communicator (NewFromEnv)
	seq     uint64         // calls issued
	lastErr error          // sticky: a device timeout or an NCCL failure
}

// Tags of the communicator's exchanges on its channel communicator.
const (
	tagScratch = 1
	tagPackets = 2
	tagConnect = 3
	tagRegBase = 1 << 20 // + registration id
)

// New builds this rank's communicator over bs and dev (collective: every
// rank calls it).
func New(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, cfg Config) (_ *Communicator, err error) {
	if bs == nil || dev == nil {
		return nil, errors.New("collectives: New needs a bootstrap and a device")
	}
	if err := checkCtx(ctx); err != nil {
		return nil, fmt.Errorf("collectives: New: %w", err)
	}
	info := dev.Info()
	asked := cfg
	cfg, rerr := cfg.resolve(info.SMs)
	var tuning *Tuning
	if rerr == nil {
		tuning, rerr = resolveTuning(cfg, info.Name, bs.Size())
	}
	// Every rank states its configuration (or why it has none) before any
	// of them allocates or waits on a peer, so that a field that differs
	// fails every rank at once, named, instead of corrupting memory or
	// ending in a timeout.
	if err := agreeConfig(ctx, bs, cfg, tuning, rerr); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	c := &Communicator{bs: bs, dev: dev, rank: bs.Rank(), size: bs.Size(), cfg: cfg, info: info, args: device.NewArgs(12)}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.free())
		}
	}()
	if c.gpu, err = newGPUState(dev); err != nil {
		return nil, c.errorf("%w", err)
	}
	if c.chans, err = channels.NewCommunicator(bs, dev, cfg.Channels); err != nil {
		return nil, err
	}
	if err = c.fitSharedGPU(ctx, asked); err != nil {
		return nil, err
	}
	// Every kernel a call may launch is loaded before the ranks meet in
	// setup: a module load waits for the kernels running in the context,
	// which on a GPU several ranks share may be spinning on this rank.
	if err = dev.Preload(abi.KernelARLL1, abi.KernelARRSAG, abi.KernelFill, devapi.KernelChanSemSignal); err != nil {
		return nil, c.errorf("%w", err)
	}
	c.native = c.size >= 2 && c.size <= abi.MaxRanks
	if c.native {
		if err = c.setupNative(ctx); err != nil {
			return nil, err
		}
	}
	if c.events, err = newEventPool(c.gpu, cfg.Events); err != nil {
		return nil, c.errorf("%w", err)
	}
	if c.gpuShared {
		c.events.window = sharedGPUWindow
	}
	c.tuning = tuning
	if cfg.NCCL == NCCLEager {
		if err = c.ncclInit(ctx); err != nil {
			return nil, err
		}
	}
	if err = bs.Barrier(ctx); err != nil {
		return nil, c.errorf("barrier after setup: %w", err)
	}
	return c, nil
}

// resolveTuning is the selector's table New uses: Config.Tuning, else
// $GOEP_COLL_TUNING, else the built-in table for the GPU.
func resolveTuning(cfg Config, gpuName string, world int) (*Tuning, error) {
	if cfg.Tuning != nil {
		return cfg.Tuning, nil
	}
	if path := os.Getenv(EnvTuning); path != "" {
		t, err := LoadTuning(path)
		if err != nil {
			return nil, fmt.Errorf("collectives: %s: %w", EnvTuning, err)
		}
		return t, nil
	}
	t, err := builtinTuning(gpuName, world)
	if err != nil {
		return nil, fmt.Errorf("collectives: %w", err)
	}
	return t, nil
}

// agreeConfig gathers every rank's resolved configuration (or the reason
// it is invalid) and fails, naming the fields and the ranks, unless they
// agree.
func agreeConfig(ctx context.Context, bs bootstrap.Bootstrap, cfg Config, tuning *Tuning, invalid error) error {
	if err := channels.AgreeConfig(ctx, bs, "Config", cfg.fields(tuning.id()), invalid); err != nil {
		return fmt.Errorf("collectives: rank %d: %w", bs.Rank(), err)
	}
	return nil
}

// NewFromEnv builds a communicator for a process started by a launcher
// (torchrun, mpirun, srun or `ep-bench launch`): the bootstrap from the
// launcher's environment, the device of kind at the local rank. Close closes
// both.
func NewFromEnv(ctx context.Context, kind device.Kind, cfg Config) (*Communicator, error) {
	env, err := bootstrap.FromEnv()
	if err != nil {
		return nil, fmt.Errorf("collectives: launcher environment: %w", err)
	}
	bs, err := bootstrap.ConnectFromEnv(ctx, env, 0)
	if err != nil {
		return nil, fmt.Errorf("collectives: rank %d: %w", env.Rank, err)
	}
	dev, err := device.Open(kind, env.LocalRank)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("collectives: rank %d: %w", env.Rank, err), bs.Close())
	}
	c, err := New(ctx, bs, dev, cfg)
	if err != nil {
		return nil, errors.Join(err, dev.Close(), bs.Close())
	}
	c.owned = []func() error{dev.Close, bs.Close}
	return c, nil
}

// setupNative builds what the native algorithms use.
func (c *Communicator) setupNative(ctx context.Context) (err error) {
	cfg, W := c.cfg, c.size
	dev := c.dev
	peers := make([]int, 0, W-1)
	for r := 0; r < W; r++ {
		if r != c.rank {
			peers = append(peers, r)
		}
	}
	// Scratch: mailboxes, the control block (call fingerprints), then the
	// data area.
	c.ctrlOff = (abi.MailboxSize(cfg.MaxBlocks) + 255) &^ 255
	c.dataOff = (c.ctrlOff + abi.CtrlBytes + 4095) &^ 4095
	c.scrBytes = cfg.ScratchBytes
	if c.scratch, err = dev.Alloc(c.dataOff + c.scrBytes); err != nil {
		return c.errorf("scratch (%d bytes): %w", c.dataOff+c.scrBytes, err)
	}
	// The control block starts at zero (no launch, not failed, no
	// fingerprint); peers write into it only during calls, after New's
	// closing barrier.
	if err = dev.CopyIn(c.scratch.Ptr+uintptr(c.ctrlOff), make([]byte, abi.CtrlBytes)); err != nil {
		return c.errorf("control block: %w", err)
	}
	scrMem, err := c.chans.RegisterMemory(c.scratch)
	if err != nil {
		return err
	}
	if c.packets, err = c.chans.NewPacketBuffer(2 * cfg.PacketBytes); err != nil {
		return err
	}
	theirScr, err := c.chans.ExchangeMemory(ctx, scrMem, peers, tagScratch)
	if err != nil {
		return err
	}
	theirPkt, err := c.chans.ExchangeMemory(ctx, c.packets.Memory(), peers, tagPackets)
	if err != nil {
		return err
	}
	conns, err := c.chans.ConnectAll(ctx, peers, tagConnect)
	if err != nil {
		return err
	}
	// Semaphores [block][peer]: the connections listed block by block, so
	// that the k-th semaphore of a connection is block k's on both sides.
	list := make([]channels.Connection, 0, cfg.MaxBlocks*len(conns))
	for b := 0; b < cfg.MaxBlocks; b++ {
		list = append(list, conns...)
	}
	sems, err := c.chans.NewMemorySemaphores(ctx, list)
	if err != nil {
		return err
	}
	semBytes := make([]byte, cfg.MaxBlocks*abi.MaxRanks*devapi.SemaphoreSize)
	for i, s := range sems {
		b, p := i/len(peers), s.Peer()
		at := (b*abi.MaxRanks + p) * devapi.SemaphoreSize
		s.DeviceHandle().Encode(semBytes[at : at+devapi.SemaphoreSize])
	}
	if c.sems, err = c.upload(semBytes); err != nil {
		return c.errorf("semaphore table: %w", err)
	}
	if c.regsBuf, err = c.upload(make([]byte, cfg.MaxRegistrations*abi.MaxRanks*8)); err != nil {
		return c.errorf("registration table: %w", err)
	}
	x := abi.Ctx{
		Rank: uint32(c.rank), World: uint32(W), SemBlocks: uint32(cfg.MaxBlocks), MaxRegs: uint32(cfg.MaxRegistrations),
		Flag: c.packets.FlagPtr(), Watchdog: c.chans.Watchdog(), Sems: c.sems.Ptr, Regs: c.regsBuf.Ptr,
		PacketHalf: uint64(cfg.PacketBytes), ScratchSize: uint64(c.scrBytes),
	}
	x.Packets[c.rank] = c.packets.Memory().Ptr()
	x.Scratch[c.rank] = c.scratch.Ptr + uintptr(c.dataOff)
	x.Mailbox[c.rank] = c.scratch.Ptr
	x.Ctrl[c.rank] = c.scratch.Ptr + uintptr(c.ctrlOff)
	for i, p := range peers {
		x.Packets[p] = theirPkt[i].Ptr()
		x.Scratch[p] = theirScr[i].Ptr() + uintptr(c.dataOff)
		x.Mailbox[p] = theirScr[i].Ptr()
		x.Ctrl[p] = theirScr[i].Ptr() + uintptr(c.ctrlOff)
		x.LLID[p] = c.chans.NewWaitID(fmt.Sprintf("collectives: LL packets from rank %d", p))
	}
	c.llIDs = x.LLID
	c.peerScr = x.Scratch
	// The context holds its own address: the kernels advance the launch
	// counter and raise the failed flag in it (Seq, Failed and Arrived start
	// at zero).
	if c.ctxBuf, err = dev.Alloc(abi.CtxSize); err != nil {
		return c.errorf("context: %w", err)
	}
	x.Self = c.ctxBuf.Ptr
	b := make([]byte, abi.CtxSize)
	x.Encode(b)
	if err = dev.CopyIn(c.ctxBuf.Ptr, b); err != nil {
		return c.errorf("context: %w", err)
	}
	return nil
}

// upload allocates device memory holding data.
func (c *Communicator) upload(data []byte) (device.Buffer, error) {
	buf, err := c.dev.Alloc(len(data))
	if err != nil {
		return device.Buffer{}, err
	}
	if err := c.dev.CopyIn(buf.Ptr, data); err != nil {
		return device.Buffer{}, errors.Join(err, c.dev.Free(buf))
	}
	return buf, nil
}

// fitSharedGPU keeps the grids of the kernels that wait on other ranks
// within this rank's share of a GPU that several ranks share (every rank's
// blocks must be resident at once): defaults shrink, a configured grid
// above the share is refused.
func (c *Communicator) fitSharedGPU(ctx context.Context, asked Config) error {
	pl, err := c.chans.Placement(ctx)
	if err != nil {
		return c.errorf("%w", err)
	}
	c.gpuShared = pl.AnyShared
	spin := pl.SpinBlocks
	if spin == 0 {
		return nil
	}
	for _, f := range []struct {
		name       string
		asked, got *int
	}{{"MaxBlocks", &asked.MaxBlocks, &c.cfg.MaxBlocks}, {"LLMaxBlocks", &asked.LLMaxBlocks, &c.cfg.LLMaxBlocks}} {
		if *f.asked > spin {
			return c.errorf("Config.%s %d: %d ranks share this GPU (%d SMs), so a kernel of one rank may use at most %d blocks (all must be resident at once)",
				f.name, *f.asked, len(pl.SharedGPU), pl.SMs, spin)
		}
		*f.got = min(*f.got, spin)
	}
	return nil
}

// Rank is this rank; Size the number of ranks.
func (c *Communicator) Rank() int {
	if c == nil {
		return -1
	}
	return c.rank
}

// Size is the number of ranks.
func (c *Communicator) Size() int {
	if c == nil {
		return 0
	}
	return c.size
}

// Device is this rank's device.
func (c *Communicator) Device() device.Device {
	if c == nil {
		return nil
	}
	return c.dev
}

// Bootstrap is the bootstrap the communicator was built on.
func (c *Communicator) Bootstrap() bootstrap.Bootstrap {
	if c == nil {
		return nil
	}
	return c.bs
}

// Channels is the channel communicator underneath.
func (c *Communicator) Channels() *channels.Communicator {
	if c == nil {
		return nil
	}
	return c.chans
}

// Config is the resolved configuration.
func (c *Communicator) Config() Config {
	if c == nil {
		return Config{}
	}
	return c.cfg
}

// SetTuning replaces the selector's table (nil: the built-in rules). Every
// rank must use the same table.
func (c *Communicator) SetTuning(t *Tuning) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tuning = t
}

// Tuning is the selector's table (nil: the built-in rules).
func (c *Communicator) Tuning() *Tuning {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tuning
}

// SetWaitTimeout changes the bound of device-side waits (see
// channels.Communicator.SetWaitTimeout).
func (c *Communicator) SetWaitTimeout(d time.Duration) error {
	if err := c.usable(); err != nil {
		return err
	}
	return c.chans.SetWaitTimeout(d)
}

// usable fails on a nil or closed communicator.
func (c *Communicator) usable() error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.errorf("%w", ErrClosed)
	}
	return nil
}

// Check reports a device-side timeout of a collective (naming the rank it
// waited on) or an NCCL failure; nil while there is none. It does not
// block.
func (c *Communicator) Check() error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkLocked()
}

func (c *Communicator) checkLocked() error {
	if c.closed {
		return c.errorf("%w", channels.ErrClosed)
	}
	if c.lastErr != nil {
		return c.lastErr
	}
	if err := c.chans.Check(); err != nil {
		var te *channels.TimeoutError
		if errors.As(err, &te) && c.isMismatch(te) {
			// Not a timeout: a peer's call fingerprint differed. Every rank of
			// the call sees one (see fingerprint.go); the protocol state is
			// unknown, so the communicator refuses calls until Close.
			c.lastErr = c.errorf("the ranks' calls do not match; the communicator is unusable until Close: %w",
				newMismatchError(c.rank, te.Peer, te.Expected, te.Observed))
		} else if errors.As(err, &te) {
			c.lastErr = c.errorf("a collective waited %s for rank %d (%s), which did not arrive: %w",
				te.Waited.Round(time.Millisecond), te.Peer, stageName(te.Stage), err)
		} else {
			c.lastErr = c.errorf("%w", err)
		}
		return c.lastErr
	}
	if err := c.nccl.asyncError(); err != nil {
		c.lastErr = c.errorf("%w", err)
		return c.lastErr
	}
	return nil
}

// isMismatch reports whether a watchdog record is a call-fingerprint
// mismatch of this communicator's kernels (the plan executor shares the
// watchdog with its own stage numbers and wait ids).
func (c *Communicator) isMismatch(te *channels.TimeoutError) bool {
	if te.Stage != abi.StageMismatch || te.Peer < 0 || te.Peer >= abi.MaxRanks || te.Peer == c.rank {
		return false
	}
	return c.native && te.ID == c.llIDs[te.Peer]
}

// stageName says what a timed-out wait of a collective kernel was for.
func stageName(stage uint32) string {
	switch stage {
	case abi.StageEntry:
		return "entry barrier"
	case abi.StageRSData:
		return "its reduce-scatter data"
	case abi.StageAGData:
		return "its allgather data"
	case abi.StageExit:
		return "exit barrier"
	case abi.StageLL1:
		return "its LL packets"
	case abi.StageLL2:
		return "its second-round LL packets"
	case abi.StageFP:
		return "its call fingerprint (it has not made this call)"
	}
	return fmt.Sprintf("stage %d", stage)
}

// Abort ends every device-side wait of the communicator now (see
// channels.Communicator.Abort), e.g. when a peer is known to be dead.
func (c *Communicator) Abort() error {
	if err := c.usable(); err != nil {
		return err
	}
	return c.chans.Abort()
}

func (c *Communicator) errorf(format string, a ...any) error {
	return fmt.Errorf("collectives: rank %d: "+format, append([]any{c.rank}, a...)...)
}

// Close waits for the communicator's GPU work, then frees everything and
// destroys the NCCL communicator. Peers must no longer use this rank's
// memory: call Barrier on every rank first. Close does not talk to peers.
func (c *Communicator) Close() error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	return c.free()
}

// Barrier waits for every rank on the bootstrap (host side; it does not
// wait for GPU work).
func (c *Communicator) Barrier(ctx context.Context) error {
	if err := c.usable(); err != nil {
		return err
	}
	if err := checkCtx(ctx); err != nil {
		return c.errorf("barrier: %w", err)
	}
	if err := c.bs.Barrier(ctx); err != nil {
		return c.errorf("barrier: %w", err)
	}
	return nil
}

func (c *Communicator) free() error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.gpu != nil {
		keep(c.gpu.ctx.Synchronize()) // every stream's collectives, not only the default one's
	}
	keep(c.nccl.close())
	if c.plans.exec != nil {
		keep(c.plans.exec.Close())
		c.plans.exec = nil
	}
	if c.events != nil {
		keep(c.events.close())
	}
	for _, b := range []*device.Buffer{&c.ctxBuf, &c.regsBuf, &c.sems, &c.scratch} {
		if b.Ptr != 0 {
			keep(c.dev.Free(*b))
			*b = device.Buffer{}
		}
	}
	if c.chans != nil {
		keep(c.chans.Close()) // packet buffer, semaphores, imports
	}
	for _, f := range c.owned {
		keep(f())
	}
	c.owned = nil
	if len(errs) > 0 {
		return c.errorf("close: %w", errors.Join(errs...))
	}
	return nil
}
