package channels

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// ProxyConfig configures NewProxy. The zero value is ready to use.
type ProxyConfig struct {
	// FIFOSize is the number of trigger slots (a power of two; default
	// 512). A full ring makes pushers wait, bounded by the watchdog.
	FIFOSize int
	// MaxPending bounds the work the proxy queues on one connection without
	// waiting for it (copies, stream writes, atomic-add kernels; default
	// 64), so neither the driver's queues nor the proxy's view of what is
	// in flight grow without limit: at the bound it waits for the older
	// half of a CUDA IPC connection's work (a mark in its stream) and
	// flushes other connections.
	// Connections that bound their own queues (TCP: a write waits while its
	// sockets' queues are full) are never flushed for this: there the
	// flush only emptied the pipeline mid-transfer (measured: a 2.3 ms
	// stall of the proxy inside every 4096-token dispatch cut in 1 MiB
	// pieces, docs/PERFORMANCE.md session 11).
	MaxPending int
}

const (
	defaultFIFOSize   = 512
	defaultMaxPending = 64
	// maxMerge bounds how many consecutive atomic adds to one word the
	// proxy folds into one operation.
	maxMerge = 256
)

// Proxy serves port channels: GPU threads push triggers into its FIFO
// (kernels/port_device.cuh) and its goroutine, on a locked OS thread,
// drains the FIFO in order and carries each trigger out on the connection
// of the trigger's channel. Memory the triggers name is registered with
// AddMemory (triggers carry the small ids); channels with NewPortChannel or
// NewPortChannelMesh.
//
// Start begins serving, Stop ends it (Start again resumes at the next
// trigger), Close stops and frees everything; the communicator's Close
// closes its proxies. A trigger the proxy cannot carry out (an unknown id,
// a range outside the memory, a driver error) stops the proxy and breaks
// the communicator with that error, raising the abort flag so that device
// waits end at once instead of timing out; Err and Communicator.Check
// report it.
type Proxy struct {
	c    *Communicator
	cfg  ProxyConfig
	fifo *fifo
	host bool

	table atomic.Pointer[proxyTable] // read by the goroutine per trigger

	mu      sync.Mutex // guards what follows and table edits
	running bool
	stop    *atomic.Bool
	exited  chan struct{}
	closed  bool
	err     error
	// finishing: Close is stopping the goroutine, which then carries out
	// every trigger already in the FIFO before it exits (Stop alone leaves
	// them for the next Start).
	finishing atomic.Bool

	// pending counts the work queued per connection since its last flush;
	// marks holds, for a windowed connection with a mark outstanding, the
	// count at the mark. Both owned by the goroutine (and by Stop once it
	// has exited).
	pending map[Connection]int
	marks   map[Connection]int

	// trace records the triggers carried out (trace.go; off by default).
	trace *traceTrack
}

// proxyTable is what triggers' ids refer to; replaced, never edited, so
// the goroutine reads it without a lock.
type proxyTable struct {
	mems  []RegisteredMemory
	chans []*PortChannel
}

// MemoryID names memory registered with a proxy (Proxy.AddMemory).
type MemoryID uint32

// maxTriggerOffset: trigger offsets are 32 bits, so registered memory is at
// most 4 GiB (any offset inside it fits).
const maxTriggerOffset = 1 << 32

// NewProxy builds a proxy with its FIFO; it does not start it.
func (c *Communicator) NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if c == nil {
		var r0 *Proxy
		return r0, ErrNil
	}
	if cfg.FIFOSize == 0 {
		cfg.FIFOSize = defaultFIFOSize
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = defaultMaxPending
	}
	if cfg.MaxPending < 1 {
		return nil, c.errorf("proxy: MaxPending %d must be positive", cfg.MaxPending)
	}
	// Load the atomic-add kernel now rather than at the first atomic add,
	// which would otherwise wait for NVRTC (or the kernel cache) inside the
	// proxy loop. A failure here shows again, with context, at that launch.
	_ = c.dev.Preload(devapi.KernelProxyAtomicAdd)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return nil, err
	}
	f, err := newFifo(c.dev, cfg.FIFOSize)
	if err != nil {
		return nil, c.errorf("proxy: %w", err)
	}
	p := &Proxy{c: c, cfg: cfg, fifo: f, host: c.kind == device.Host, pending: map[Connection]int{},
		marks: map[Connection]int{}, trace: newTraceTrack(c.rank, -1, RoleProxy, -1)}
	p.table.Store(&proxyTable{})
	c.proxies = append(c.proxies, p)
	return p, nil
}

func (p *Proxy) errorf(format string, a ...any) error {
	return p.c.errorf("proxy: "+format, a...)
}

// AddMemory registers m (this rank's memory, or a peer's opened on this
// rank, at most 4 GiB) for triggers to name. A proxy holds up to 256.
func (p *Proxy) AddMemory(m RegisteredMemory) (MemoryID, error) {
	if p == nil {
		var r0 MemoryID
		return r0, ErrNil
	}
	if err := p.c.usable(); err != nil {
		return 0, err
	}
	switch {
	case !m.Valid():
		return 0, p.errorf("add memory: no memory")
	case m.r.comm != p.c:
		return 0, p.errorf("add memory: %v belongs to another communicator", m)
	case m.Size() > maxTriggerOffset:
		return 0, p.errorf("add memory: %v is larger than the 4 GiB that trigger offsets reach; register slices", m)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, p.errorf("%w", ErrClosed)
	}
	old := p.table.Load()
	if len(old.mems) >= devapi.TriggerMaxMemories {
		return 0, p.errorf("add memory: the proxy already holds %d memories", len(old.mems))
	}
	t := &proxyTable{mems: append(old.mems[:len(old.mems):len(old.mems)], m), chans: old.chans}
	p.table.Store(t)
	return MemoryID(len(t.mems) - 1), nil
}

// Memory is the memory registered under id.
func (p *Proxy) Memory(id MemoryID) (RegisteredMemory, bool) {
	if p == nil {
		var r0 RegisteredMemory
		var r1 bool
		return r0, r1
	}
	t := p.table.Load()
	if int(id) >= len(t.mems) {
		return RegisteredMemory{}, false
	}
	return t.mems[id], true
}

// Start starts serving the FIFO (idempotent).
func (p *Proxy) Start() error {
	if p == nil {
		return ErrNil
	}
	if err := p.c.usable(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return p.errorf("%w", ErrClosed)
	case p.err != nil:
		return p.err
	case p.running:
		return nil
	}
	p.running = true
	p.stop, p.exited = new(atomic.Bool), make(chan struct{})
	go p.run(p.stop, p.exited)
	return nil
}

// Stop stops serving and waits for the work the proxy queued to land.
// Triggers pushed meanwhile stay in the FIFO for the next Start.
func (p *Proxy) Stop() error {
	if p == nil {
		return ErrNil
	}
	p.mu.Lock()
	if !p.running {
		p.mu.Unlock()
		return nil
	}
	p.running = false
	stop, exited := p.stop, p.exited
	p.mu.Unlock()
	stop.Store(true)
	<-exited
	return p.drain()
}

// drain waits for every connection the proxy queued work on, whether or
// not the communicator still accepts calls: nothing the proxy issued may
// still run once Stop returns.
func (p *Proxy) drain() error {
	var errs []error
	for conn := range p.pending {
		if d, ok := conn.(interface{ drain() error }); ok {
			errs = append(errs, d.drain())
		}
		p.forget(conn)
	}
	return errors.Join(errs...)
}

// Err is the error that stopped the proxy, nil while none has.
func (p *Proxy) Err() error {
	if p == nil {
		return ErrNil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close carries out every trigger already in the FIFO, stops the proxy
// (waiting for that work to land, as Stop does) and frees its FIFO.
// Kernels that push into it must have finished. The communicator's Close
// calls it.
func (p *Proxy) Close() error {
	if p == nil {
		return ErrNil
	}
	p.finishing.Store(true)
	err := p.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return err
	}
	p.closed = true
	dropTraceTracks(p.trace)
	p.c.mu.Lock()
	for i, q := range p.c.proxies {
		if q == p {
			p.c.proxies = append(p.c.proxies[:i], p.c.proxies[i+1:]...)
			break
		}
	}
	p.c.mu.Unlock()
	if ferr := p.fifo.free(); ferr != nil {
		err = errors.Join(err, p.errorf("free FIFO: %w", ferr))
	}
	return err
}

// fail records the proxy's error and breaks the communicator with it.
func (p *Proxy) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.c.breakWith(err)
}

// Idle polling: spin on the ring for spinPolls empty polls (GPU backend:
// a pushed trigger is seen within a poll), then yield for yieldPolls, then
// sleep idleSleep between polls so an idle proxy costs little CPU. The host
// backend's kernels are goroutines that need the CPU, so there the proxy
// yields from the first empty poll.
const (
	spinPolls  = 1 << 16
	yieldPolls = 1 << 18
	idleSleep  = 50 * time.Microsecond
)

// Idle while a connection is busy: when a connection the proxy queued work
// on still holds busyBacklog bytes it has not written to its sockets (TCP:
// at least a millisecond of work at a few GB/s per connection), the proxy
// sleeps busySleep between polls instead of spinning or yielding. A trigger
// seen that much later loses nothing on that connection (it queues behind
// the backlog), and the CPU the poll loop took goes to the sockets' copies,
// which are what bounds the transport when every rank of a host puts at
// once. Checked every busyCheck empty polls (a map walk).
const (
	busyBacklog = 4 << 20
	busySleep   = 20 * time.Microsecond
	busyCheck   = 64
)

// Flow control counts work in flight: every settleCheck empty polls (a
// hundred microseconds or so of spinning; and once per idle stretch at
// least, as the count passes it) the proxy forgets the count of every
// connection whose queued work has all landed, so that work finished
// between two steps no longer counts towards MaxPending. Without it the
// count ran on across steps and the bound's flush fell inside a later one
// (measured: a 111 us stall of the proxy inside an EP2 dispatch over the
// port, which pushes 33 operations a step, session 19).
const settleCheck = 1024

// settler is a connection that can tell, without waiting, whether every
// operation queued on it has landed (cudaIPCConnection: its stream is
// idle).
type settler interface{ settled() bool }

// forgetSettled drops the pending count of every settled connection. The
// goroutine's own.
func (p *Proxy) forgetSettled() {
	for conn := range p.pending {
		if s, ok := conn.(settler); ok && s.settled() {
			p.forget(conn)
		}
	}
}

// backlogger is a connection that can tell how much queued work it has not
// started sending (tcpConnection).
type backlogger interface{ backlog() int64 }

// busy reports whether a connection the proxy queued work on since its last
// flush still holds busyBacklog bytes. The goroutine's own.
func (p *Proxy) busy() bool {
	for conn := range p.pending {
		if b, ok := conn.(backlogger); ok && b.backlog() >= busyBacklog {
			return true
		}
	}
	return false
}

func (p *Proxy) run(stop *atomic.Bool, exited chan struct{}) {
	defer close(exited)
	// One OS thread for the proxy: the poll loop never waits on the Go
	// scheduler to be put back on a CPU, and driver calls come from a
	// stable thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	idle := 0
	for !stop.Load() {
		pos := p.fifo.next
		t, ok := p.fifo.peek(pos)
		if !ok {
			idle++
			if idle%settleCheck == 0 {
				p.forgetSettled()
			}
			if idle%busyCheck == 0 && p.busy() {
				// Not counted as idle: once the backlog drains the
				// proxy spins again for the next step's triggers.
				idle = 0
				time.Sleep(busySleep)
				continue
			}
			switch {
			case idle < spinPolls && !p.host:
			case idle < yieldPolls:
				runtime.Gosched()
			default:
				time.Sleep(idleSleep)
			}
			continue
		}
		idle = 0
		if err := p.handle(pos, t); err != nil {
			p.fail(err)
			return
		}
	}
	// Closing: the kernels that push into the FIFO have finished (Close's
	// rule), so what they pushed and the loop had not reached yet (the
	// last completion flags of a step, which nobody on this rank waits
	// for) is carried out now, or it would never be: a peer waiting for
	// such an atomic add would time out (seen on the host backend under
	// load: a combine's last partials counter lost at Notify.Close).
	for p.finishing.Load() {
		pos := p.fifo.next
		t, ok := p.fifo.peek(pos)
		if !ok {
			return
		}
		if err := p.handle(pos, t); err != nil {
			p.fail(err)
			return
		}
	}
}

// handle carries out the trigger at pos (and, for atomic adds, the ready
// atomic adds to the same word right after it) and consumes it.
func (p *Proxy) handle(pos uint64, t devapi.Trigger) error {
	if start := traceStart(); start != 0 {
		defer p.traceTrigger(t, start)
	}
	tab := p.table.Load()
	if int(t.Channel) >= len(tab.chans) {
		return p.errorf("%v at FIFO position %d: no channel %d (the proxy has %d)", t, pos, t.Channel, len(tab.chans))
	}
	ch := tab.chans[t.Channel]
	conn := ch.sem.conn
	mem := func(id uint32) (RegisteredMemory, error) {
		if int(id) >= len(tab.mems) {
			return RegisteredMemory{}, p.errorf("%v on %v: no memory id %d (the proxy has %d)", t, ch, id, len(tab.mems))
		}
		return tab.mems[id], nil
	}
	if t.Type == devapi.TriggerAtomicAdd {
		dst, err := mem(t.Dst)
		if err != nil {
			return err
		}
		value, n := p.mergeAdds(pos, t)
		if err := conn.AtomicAdd(dst, int(t.DstOff), value); err != nil {
			return p.errorf("%v on %v: %w", t, ch, err)
		}
		p.fifo.consume(pos + n)
		return p.queued(conn, 1)
	}
	if t.Type == devapi.TriggerStore {
		dst, err := mem(t.Dst)
		if err != nil {
			return err
		}
		if err := conn.UpdateAndSync(dst, int(t.DstOff), t.Value); err != nil {
			return p.errorf("%v on %v: %w", t, ch, err)
		}
		p.fifo.consume(pos + 1)
		return p.queued(conn, 1)
	}
	if t.Type == 0 || t.Type&^(devapi.TriggerPut|devapi.TriggerSignal|devapi.TriggerFlush) != 0 {
		return p.errorf("%v at FIFO position %d: unknown trigger type %#x", t, pos, t.Type)
	}
	work := 0
	if t.Type&devapi.TriggerPut != 0 {
		dst, err := mem(t.Dst)
		if err != nil {
			return err
		}
		src, err := mem(t.Src)
		if err != nil {
			return err
		}
		if err := p.write(conn, dst, int(t.DstOff), src, int(t.SrcOff), int(t.Size)); err != nil {
			return p.errorf("%v on %v: %w", t, ch, err)
		}
		work++
	}
	if t.Type&devapi.TriggerSignal != 0 {
		if err := ch.sem.Signal(); err != nil {
			return p.errorf("signal on %v: %w", ch, err)
		}
		work++
	}
	if t.Type&devapi.TriggerFlush != 0 {
		if err := conn.Flush(); err != nil {
			return p.errorf("flush on %v: %w", ch, err)
		}
		p.forget(conn)
		p.fifo.consume(pos + 1)
		p.fifo.complete(pos)
		return nil
	}
	p.fifo.consume(pos + 1)
	return p.queued(conn, work)
}

// write issues a put on conn: at once, or in paced pieces when the rank
// emulates a line rate (NetworkConfig.EmulatedGBps) and conn goes over the
// network.
func (p *Proxy) write(conn Connection, dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	pace := p.c.net.pace
	if n, ok := conn.(interface{ overNetwork() bool }); pace == nil || !ok || !n.overNetwork() {
		return conn.Write(dst, dstOff, src, srcOff, size)
	}
	return pace.write(size, func(off, n int) error { return conn.Write(dst, dstOff+off, src, srcOff+off, n) })
}

// traceTrigger records trigger t, popped at start, as carried out now.
func (p *Proxy) traceTrigger(t devapi.Trigger, start int64) {
	op, n := OpSignal, int64(0)
	switch {
	case t.Type == devapi.TriggerAtomicAdd:
		op = OpAtomicAdd
	case t.Type == devapi.TriggerStore:
		op = OpUpdate
	case t.Type&devapi.TriggerPut != 0 && t.Type&devapi.TriggerSignal != 0:
		op, n = OpPutSignal, int64(t.Size)
	case t.Type&devapi.TriggerPut != 0:
		op, n = OpPut, int64(t.Size)
	case t.Type&devapi.TriggerFlush != 0 && t.Type&devapi.TriggerSignal == 0:
		op = OpFlush
	}
	p.trace.rec(StageTrigger, op, 0, n, start)
}

// mergeAdds folds the atomic adds that directly follow t in the FIFO, are
// already committed and target the same word of the same channel into one
// value: the sum lands all the same, with one operation instead of many.
func (p *Proxy) mergeAdds(pos uint64, t devapi.Trigger) (value, n uint64) {
	value, n = t.Value, 1
	// Never look a whole ring ahead: the slot would be this trigger's own.
	for n < min(maxMerge, uint64(p.fifo.size)) {
		u, ok := p.fifo.peek(pos + n)
		if !ok || u.Type != devapi.TriggerAtomicAdd || u.Channel != t.Channel || u.Dst != t.Dst || u.DstOff != t.DstOff {
			break
		}
		value += u.Value
		n++
	}
	return value, n
}

// selfBounded is a connection whose own queues bound the work handed to
// it, so the proxy needs no flow-control flush for it (tcpConnection).
type selfBounded interface{ boundsOwnQueues() }

// windowed is a connection whose queued work the proxy can wait for in
// part (cudaIPCConnection: an event in its stream): mark records a point
// after the work queued so far, waitMark waits until the work before the
// last mark has landed.
type windowed interface {
	mark() error
	waitMark() error
}

// forget drops conn's count and mark (its queued work has all landed, or
// was waited for). The goroutine's own.
func (p *Proxy) forget(conn Connection) {
	delete(p.pending, conn)
	delete(p.marks, conn)
}

// queued counts work queued on conn and bounds it: a windowed connection
// waits for its older half at the bound (window), one that bounds its own
// queues stays counted (busy reads the entry), any other is flushed.
func (p *Proxy) queued(conn Connection, work int) error {
	if work == 0 {
		return nil
	}
	p.pending[conn] += work
	if w, ok := conn.(windowed); ok {
		return p.window(conn, w)
	}
	if p.pending[conn] < p.cfg.MaxPending {
		return nil
	}
	if _, ok := conn.(selfBounded); ok {
		p.pending[conn] = p.cfg.MaxPending
		return nil
	}
	p.forget(conn)
	if err := conn.Flush(); err != nil {
		return p.errorf("flow control: %w", err)
	}
	return nil
}

// window keeps at most MaxPending operations in flight on conn without
// ever emptying its queue: a mark is recorded once half the bound is
// queued, and at the bound the proxy waits for that mark only, so the
// newer half stays queued behind it and the copy engine never idles for
// flow control. (A flush at the bound drained the whole queue: with a
// dispatch cut into 1 MiB pieces over the port, 82 operations a step, a
// 140 us stall of the proxy inside the step, session 20's trace.)
func (p *Proxy) window(conn Connection, w windowed) error {
	half := max(1, p.cfg.MaxPending/2)
	n := p.pending[conn]
	at, marked := p.marks[conn]
	if n >= p.cfg.MaxPending {
		if !marked {
			// Everything came at once (or the bound is 1): wait for all.
			if err := w.mark(); err != nil {
				return p.errorf("flow control: %w", err)
			}
			at = n
		}
		if err := w.waitMark(); err != nil {
			return p.errorf("flow control: %w", err)
		}
		n -= at
		p.pending[conn] = n
		delete(p.marks, conn)
		marked = false
	}
	if !marked && n >= half {
		if err := w.mark(); err != nil {
			return p.errorf("flow control: %w", err)
		}
		p.marks[conn] = n
	}
	return nil
}
