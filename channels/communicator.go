package channels

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// Communicator is one rank's end of the channel layer: it registers memory,
// exchanges it with peers over the bootstrap, connects to peers, and builds
// semaphores and memory channels whose device handles kernels use. Every
// rank of the job builds one over its own Bootstrap and Device.
//
// Methods are safe for concurrent use. A device-side wait that times out
// (see Check) or an Abort makes the communicator refuse further calls with
// that error until Close.
type Communicator struct {
	bs     bootstrap.Bootstrap
	dev    device.Device
	rank   int
	size   int
	kind   device.Kind
	hostID [16]byte

	mu       sync.Mutex
	timeouts Timeouts
	closed   bool
	broken   error // sticky: a timeout or an abort
	wd       *watchdog
	tokens   *slotArena // inbound tokens: peers write them, so exported
	locals   *slotArena // expected counters and LL flags: this rank only
	imports  map[string]*importRef
	names    map[uint32]string
	nextID   uint32
	conns    []*connBase
	packets  []*PacketBuffer
	arrays   []*DeviceArray
	proxies  []*Proxy
	// Shared-memory segments of host semaphore tokens (host_tokens.go).
	ownSegments  []*shmSegment
	peerSegments map[string]*shmSegment

	placeMu   sync.Mutex // held through Placement's exchange
	placement *Placement

	// sharedConnStream carries every connection's copies when this rank's
	// GPU runs several ranks (connStream).
	sharedConnMu     sync.Mutex
	sharedConnStream device.Stream

	net netState // network transport (transport_config.go)
}

// tokenSlotSize is the room of one inbound token: 128 bytes, because peers
// update tokens with atomics over NVLink and neighbouring tokens of one line
// would contend at the owner's L2.
const tokenSlotSize = 128

// NewCommunicator builds rank bs.Rank()'s communicator on dev. It
// allocates the watchdog that bounds the device-side waits (Config.Timeouts)
// and nothing else until asked; it does not talk to the peers.
func NewCommunicator(bs bootstrap.Bootstrap, dev device.Device, cfg Config) (*Communicator, error) {
	if bs == nil || dev == nil {
		return nil, fmt.Errorf("channels: NewCommunicator needs a Bootstrap and a Device")
	}
	timeouts, err := cfg.Timeouts.resolve()
	if err != nil {
		return nil, err
	}
	c := &Communicator{
		bs: bs, dev: dev, rank: bs.Rank(), size: bs.Size(), kind: dev.Info().Kind,
		hostID: hostIdentity(), timeouts: timeouts,
		imports: map[string]*importRef{}, names: map[uint32]string{}, nextID: 1,
	}
	if err := c.initNet(cfg.Network); err != nil {
		return nil, err
	}
	if c.wd, err = newWatchdog(dev, timeouts.Wait); err != nil {
		return nil, c.errorf("%w", err)
	}
	c.tokens = newSlotArena(c, tokenSlotSize, 64<<10, true)
	c.locals = newSlotArena(c, 16, 64<<10, false)
	return c, nil
}

// Rank is this rank; Size the number of ranks.
func (c *Communicator) Rank() int {
	if c == nil {
		var r0 int
		return r0
	}
	return c.rank
}

// Size is the number of ranks.
func (c *Communicator) Size() int {
	if c == nil {
		var r0 int
		return r0
	}
	return c.size
}

// Bootstrap is the bootstrap the communicator was built on.
func (c *Communicator) Bootstrap() bootstrap.Bootstrap {
	if c == nil {
		var r0 bootstrap.Bootstrap
		return r0
	}
	return c.bs
}

// Device is this rank's device.
func (c *Communicator) Device() device.Device {
	if c == nil {
		var r0 device.Device
		return r0
	}
	return c.dev
}

// Timeouts is the communicator's current configuration.
func (c *Communicator) Timeouts() Timeouts {
	if c == nil {
		var r0 Timeouts
		return r0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timeouts
}

// SetWaitTimeout changes the bound of device-side waits for kernels
// launched from now on.
func (c *Communicator) SetWaitTimeout(d time.Duration) error {
	if c == nil {
		return ErrNil
	}
	if d <= 0 {
		return c.errorf("wait timeout %s must be positive", d)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return err
	}
	if err := c.wd.setTimeout(d); err != nil {
		return c.errorf("%w", err)
	}
	c.timeouts.Wait = d
	return nil
}

// Watchdog is the device address of the communicator's goep_watchdog, for
// kernels that bound waits of their own (goep_wait_ge_u64 and friends, or
// goep_spin_ok) under the same timeout and abort flag.
func (c *Communicator) Watchdog() uintptr {
	if c == nil {
		var r0 uintptr
		return r0
	}
	return c.wd.buf.Ptr
}

// NewWaitID reserves an id for a kernel's own bounded waits; a timeout
// record carrying it is reported as what.
func (c *Communicator) NewWaitID(what string) uint32 {
	if c == nil {
		var r0 uint32
		return r0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newIDLocked(what)
}

func (c *Communicator) newIDLocked(what string) uint32 {
	id := c.nextID
	c.nextID++
	c.names[id] = what
	return id
}

// Check reports whether a device-side wait of this communicator has timed
// out: nil while none has, else a *TimeoutError naming the channel, peer and
// stage, returned again by every later call. Check reads host-mapped
// memory, so it is cheap and may be called while kernels run; call it after
// synchronising a stream whose kernels use the channels.
func (c *Communicator) Check() error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.errorf("%w", ErrClosed)
	}
	return c.checkLocked()
}

func (c *Communicator) checkLocked() error {
	if c.broken != nil {
		return c.broken
	}
	rec, ok := c.wd.record()
	if !ok {
		return nil
	}
	c.broken = &TimeoutError{
		Rank: c.rank, ID: rec.ID, Object: c.names[rec.ID], Peer: int(rec.Peer), Stage: rec.Stage,
		Op: opName(rec.Op), Waited: time.Duration(rec.WaitedNS), Expected: rec.Expected, Observed: rec.Observed,
	}
	return c.broken
}

// Abort makes every bounded device-side wait of this communicator give up
// now and in later launches (a rank that learns a peer died calls it so its
// kernels end instead of waiting out the timeout). The communicator then
// refuses further calls with ErrAborted until Close. The flag is written
// with a synchronous host-to-device copy, which runs beside kernels on
// non-blocking streams (those of Device) but waits behind kernels on the
// legacy default stream.
func (c *Communicator) Abort() error {
	if c == nil {
		return ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.errorf("%w", ErrClosed)
	}
	if err := c.wd.abort(); err != nil {
		return c.errorf("abort: %w", err)
	}
	if c.broken == nil {
		c.broken = c.errorf("%w by the host", ErrAborted)
	}
	return nil
}

// Barrier waits for every rank on the bootstrap, e.g. before Close so that
// no peer still writes into memory this rank frees.
func (c *Communicator) Barrier(ctx context.Context) error {
	if c == nil {
		return ErrNil
	}
	if err := c.usable(); err != nil {
		return err
	}
	if err := c.bs.Barrier(ctx); err != nil {
		return c.errorf("barrier: %w", err)
	}
	return nil
}

// breakWith makes err the communicator's sticky error (unless it already
// has one) and raises the abort flag, so that device waits that depend on
// whatever failed (a port channel proxy) end now instead of timing out.
func (c *Communicator) breakWith(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	_ = c.wd.abort()
	if c.broken == nil {
		c.broken = err
	}
}

func (c *Communicator) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usableLocked()
}

// usableLocked is the gate of every call: closed, timed out and aborted
// communicators refuse.
func (c *Communicator) usableLocked() error {
	if c.closed {
		return c.errorf("%w", ErrClosed)
	}
	return c.checkLocked()
}

func (c *Communicator) errorf(format string, a ...any) error {
	return fmt.Errorf("channels: rank %d: "+format, append([]any{c.rank}, a...)...)
}

// Close releases everything the communicator allocated, imported or
// opened: port channel proxies (stopped first), connections' streams,
// packet buffers, handle arrays, semaphore memory, peers' memory views and
// the watchdog. Kernels that use its
// channels must have finished, and peers must no longer write into this
// rank's memory (Barrier first). Close does not talk to peers. Objects
// built from the communicator refuse calls afterwards.
func (c *Communicator) Close() error {
	if c == nil {
		return ErrNil
	}
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Proxies first, without the lock: a proxy's goroutine may be waiting
	// for it inside a connection call, and stopping waits for the goroutine.
	c.mu.Lock()
	proxies := append([]*Proxy(nil), c.proxies...)
	c.mu.Unlock()
	for _, p := range proxies {
		keep(p.Close())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, conn := range c.conns {
		keep(conn.closeLocked())
	}
	c.sharedConnMu.Lock()
	if c.sharedConnStream != nil {
		keep(c.sharedConnStream.Close())
		c.sharedConnStream = nil
	}
	c.sharedConnMu.Unlock()
	for _, p := range c.packets {
		keep(p.freeLocked())
	}
	for _, a := range c.arrays {
		keep(a.freeLocked())
	}
	keep(c.tokens.free())
	keep(c.locals.free())
	keep(c.freeHostTokens())
	for _, imp := range c.imports {
		keep(c.dev.CloseImport(imp.buf))
	}
	keep(c.wd.free())
	c.conns, c.packets, c.arrays, c.imports, c.proxies = nil, nil, nil, nil, nil
	if len(errs) > 0 {
		return c.errorf("close: %w", errors.Join(errs...))
	}
	return nil
}

// hostIdentity tells hosts apart for CUDA IPC, which works only within one:
// the kernel's boot id (new at every boot, different between containers'
// hosts) and the host name.
func hostIdentity() [16]byte {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	name, _ := os.Hostname()
	sum := sha256.Sum256([]byte(strings.TrimSpace(string(boot)) + "\x00" + name))
	var id [16]byte
	copy(id[:], sum[:])
	return id
}
