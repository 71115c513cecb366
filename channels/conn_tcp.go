package channels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// tcpConnection carries a port channel's work to a peer on another node
// over TCP, as NCCL's socket transport does: several sockets per
// connection, each operation numbered, writes cut into chunks spread over
// the sockets (chunk s on socket s mod Sockets), GPU data staged through
// pinned host buffers in a pipeline (copy the next chunks out on the
// sender while one is on the wire; read into a pinned buffer and copy in
// on the receiver while the next is read). A write whose source is host
// memory (RegisterHostMemory) goes on the wire straight from it, with no
// copy engine and no staging buffer.
//
// Order: the receiver applies operations strictly in sequence order. With
// staging a socket's reader reads a write's payload into one of its own
// buffers first, so the sockets' reads run in parallel and only the
// applying is serial; by default (NetworkConfig.ReceiveAhead) it stages
// up to that many writes without waiting for their turn and whichever
// reader completes the next operation applies every consecutive staged
// one, while with ReceiveAheadOff (and without staging) each reader waits
// for its message's turn. On GPUs it issues every copy-in, token update (a
// stream write) and atomic add (a one-thread kernel: device atomics on
// the target word) on one stream, so a signal or a counter never
// overtakes the data written before it. A flush is a numbered request the
// receiver answers once everything before it has landed (its stream
// synchronised).
//
// Failure: a socket that breaks without the peer's goodbye is an error
// naming the peer: on the sending side every later call (and a waiting
// Flush) returns it; on the receiving side it breaks the communicator,
// raising the abort flag so device waits for the peer's signals end at
// once. Flush waits at most Timeouts.Wait for the acknowledgement.
type tcpConnection struct {
	*connBase
	dev   device.Device
	stage bool
	chunk int
	links *tcpLinks
	wait  time.Duration // bound of a flush's wait for its acknowledgement

	// Sending side. seq numbers operations; acked is one past the last
	// flush the peer acknowledged (everything below it has landed).
	sendMu sync.Mutex
	seq    uint64
	queues []chan tcpMsg
	acked  atomic.Uint64
	// queued counts the payload bytes handed to the socket queues and not
	// yet written to their sockets (Proxy's idle policy reads it).
	queued atomic.Int64
	ackCh  chan struct{} // a token per acknowledgement (capacity 1)
	stopCh chan struct{} // closed when the connection closes
	dead   chan struct{} // closed at the sending side's first failure
	failMu sync.Mutex
	err    error

	// Receiving side: the next sequence number to apply.
	rxMu   sync.Mutex
	rxCond *sync.Cond
	rxNext uint64
	rxStop bool
	// Read-ahead receive (NetworkConfig.ReceiveAhead; ahead false: each
	// reader applies its own message in its turn). rxBufs is the receive
	// buffers per socket; under rxMu: the messages read and not yet
	// applied by sequence number, whether a reader is applying now, and
	// per socket how many of its buffers hold a write not yet applied.
	ahead      bool
	rxBufs     int
	rxPending  map[uint64]*tcpRxMsg
	rxApplying bool
	rxHeld     []int

	// GPU staging: streams for copy-outs (tx) and for everything applied
	// (rx), and the view of rx for stream memory operations.
	tx, rx       device.Stream
	txOwn, rxOwn bool
	rxOps        *cuda.Stream
	staging      []device.HostMapped
	pool         *device.HostMapped // the one pinned allocation staging slices
	events       []device.Event
	cudaCtx      *cuda.Context

	closing  atomic.Bool
	peerBye  atomic.Bool // the peer said goodbye on some socket
	stopOnce sync.Once
	senders  sync.WaitGroup
	readers  sync.WaitGroup

	// Trace rings (trace.go; off by default): the callers' (enqueue,
	// flush), each socket's sender and receiver.
	trCall       *traceTrack
	trSend, trRx []*traceTrack
}

// Wire format: every message starts with a 32-byte header, little endian:
// [0] op, [1:4) zero, [4:8) memory key, [8:16) sequence number,
// [16:24) offset in the allocation, [24:32) size (write), value (update,
// add) or nothing. A write's payload follows its header.
const (
	tcpOpWrite  = 1
	tcpOpUpdate = 2
	tcpOpAdd    = 3
	tcpOpFlush  = 4
	tcpOpBye    = 5 // the sender closes cleanly; nothing follows
	tcpOpAck    = 6 // receiver to sender: the flush with this sequence number landed

	tcpHeader = 32
	// tcpTxBufs is the pinned send buffers per socket (staging): a sender
	// copies up to two chunks out ahead of the one it writes. The copies
	// of a connection's sockets share one stream, and with one chunk
	// ahead its senders waited for their copy-out 22-38% of a dispatch
	// (session 14's traces, 8 sockets). Against 2 buffers, same lease,
	// internode at 4096 tokens (docs/PERFORMANCE.md, session 14): EP2 on
	// 2 H200s dispatch / combine 6.06 / 5.85 -> 5.31 / 4.90 ms (3 pairs),
	// 4 ranks on them 9.91 / 8.79 -> 10.22 / 8.34, EP4 on 4 H200s 7.57 /
	// 5.98 -> 7.01 / 6.08, EP2 there 4.65 / 4.44 -> 4.73 / 4.10. A copy-out
	// stream per socket instead was no faster.
	tcpTxBufs = 3
	// tcpQueue bounds the operations queued per socket before Write waits.
	tcpQueue = 256
	// tcpCloseGrace bounds how long Close spends delivering what is
	// queued and the goodbye to a peer that does not read.
	tcpCloseGrace = 2 * time.Second
)

type tcpMsg struct {
	hdr [tcpHeader]byte
	src uintptr // payload (write): this rank's memory
	n   int
	// host: src is the CPU's address of host memory (RegisterHostMemory),
	// sent as it is even where GPU memory is staged.
	host bool
}

func tcpHeaderFor(op byte, key uint32, off, val uint64) tcpMsg {
	var m tcpMsg
	m.hdr[0] = op
	le := binary.LittleEndian
	le.PutUint32(m.hdr[4:], key)
	le.PutUint64(m.hdr[16:], off)
	le.PutUint64(m.hdr[24:], val)
	return m
}

// newTCPConnection takes over links (closing them on error) and starts
// the connection's goroutines. The caller holds c.mu.
func newTCPConnection(base *connBase, links *tcpLinks) (_ *tcpConnection, err error) {
	c := base.c
	if links == nil || len(links.out) == 0 || len(links.out) != len(links.in) {
		closeLinks(links)
		return nil, base.errorf("no sockets")
	}
	n := len(links.out)
	t := &tcpConnection{connBase: base, dev: c.dev, stage: c.net.stage, chunk: c.net.cfg.ChunkBytes, links: links,
		wait: c.timeouts.Wait, ackCh: make(chan struct{}, 1), stopCh: make(chan struct{}), dead: make(chan struct{})}
	t.rxCond = sync.NewCond(&t.rxMu)
	t.rxBufs = tcpRxBufs(ReceiveAheadOff)
	if ahead := c.net.cfg.ReceiveAhead; ahead > 0 && t.stage {
		t.ahead, t.rxBufs = true, tcpRxBufs(ahead)
		t.rxPending = make(map[uint64]*tcpRxMsg)
		t.rxHeld = make([]int, n)
	}
	defer func() {
		if err != nil {
			closeLinks(links)
			err = errors.Join(err, t.freeStaging())
		}
	}()
	if t.stage {
		if err := t.allocStaging(n); err != nil {
			return nil, err
		}
	}
	t.queues = make([]chan tcpMsg, n)
	for k := range n {
		t.queues[k] = make(chan tcpMsg, tcpQueue)
	}
	t.trCall = newTraceTrack(c.rank, base.peer, RoleConn, -1)
	for k := range n {
		t.trSend = append(t.trSend, newTraceTrack(c.rank, base.peer, RoleSender, k))
		t.trRx = append(t.trRx, newTraceTrack(c.rank, base.peer, RoleReceiver, k))
	}
	t.senders.Add(n)
	t.readers.Add(2 * n)
	for k := range n {
		go t.sender(k)
		go t.ackReader(k)
		if t.ahead {
			go t.receiverAhead(k)
		} else {
			go t.receiver(k)
		}
	}
	base.release = t.release
	base.settle = t.settle
	return t, nil
}

// allocStaging makes the streams and the pinned buffers: per socket
// tcpTxBufs to send (chunks are copied out while an earlier one is on the
// wire) and rxBufs to receive.
func (t *tcpConnection) allocStaging(n int) error {
	c := t.c
	// Loaded now: the first atomic add must not wait for the kernel cache
	// while the sender's kernels spin.
	if err := t.dev.Preload(devapi.KernelProxyAtomicAdd); err != nil {
		return t.errorf("preload: %w", err)
	}
	var err error
	var shared bool
	if t.tx, shared, err = c.connStream(); err != nil {
		return t.errorf("stream: %w", err)
	}
	t.txOwn = !shared
	if t.rx, shared, err = c.connStream(); err != nil {
		return t.errorf("stream: %w", err)
	}
	t.rxOwn = !shared
	// A wrapper of a host device (the Buffer's accounting one) may have
	// the method and no context.
	if cd, ok := t.dev.(interface{ Context() *cuda.Context }); ok && cd.Context() != nil {
		t.cudaCtx = cd.Context()
		t.rxOps = cuda.WrapStream(t.cudaCtx, t.rx.Handle())
	}
	// Every buffer is a slice of one pinned allocation: one driver call
	// instead of 3 + ReceiveAhead a socket, and on GPUs no slower than
	// separate ones (session 15, alternated: EP2 on 2 H200s at 4096
	// tokens, cached dispatch 4.71 -> 4.46 ms and combine 3.99 -> 4.05 ms;
	// EP4 and 4 ranks on 2 GPUs the same within the spread).
	slots := tcpStagingSlots(n, t.rxBufs) // NetworkConfig.StagingBytes counts the same
	if slots <= 0 || t.chunk <= 0 || t.chunk > math.MaxInt/slots {
		return t.errorf("staging buffers: %d of %d bytes overflow", slots, t.chunk)
	}
	h, err := t.dev.AllocHostMapped(slots * t.chunk)
	if err != nil {
		return t.errorf("staging buffers (%d of %d bytes): %w", slots, t.chunk, err)
	}
	t.pool = &h
	for i := range slots {
		lo, hi := i*t.chunk, (i+1)*t.chunk
		t.staging = append(t.staging, device.HostMapped{Host: h.Host[lo:hi:hi], Dev: h.Dev + uintptr(lo)})
		e, err := t.dev.NewEvent()
		if err != nil {
			return t.errorf("staging event: %w", err)
		}
		t.events = append(t.events, e)
	}
	return nil
}

func (t *tcpConnection) freeStaging() error {
	var errs []error
	for _, e := range t.events {
		errs = append(errs, e.Close())
	}
	if t.pool != nil {
		errs = append(errs, t.dev.FreeHostMapped(*t.pool))
		t.pool = nil
	}
	for _, s := range []struct {
		s   device.Stream
		own bool
	}{{t.tx, t.txOwn}, {t.rx, t.rxOwn}} {
		if s.s != nil && s.own {
			errs = append(errs, s.s.Close())
		}
	}
	t.events, t.staging, t.tx, t.rx, t.rxOps = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

// slot is staging buffer j of socket k (tx 0 to tcpTxBufs - 1, rx
// tcpTxBufs to tcpTxBufs + rxBufs - 1).
func (t *tcpConnection) slot(k, j int) (device.HostMapped, device.Event) {
	i := (tcpTxBufs+t.rxBufs)*k + j
	return t.staging[i], t.events[i]
}

// ---------------------------------------------------------------------------
// Sending side.

// remote checks that dst is the peer's memory reached by key.
func (t *tcpConnection) remote(op string, dst RegisteredMemory) error {
	if dst.IsLocal() || dst.r.key == 0 {
		return t.errorf("%s destination %v: a TCP connection reaches only rank %d's registered memory", op, dst, t.peer)
	}
	return nil
}

func (t *tcpConnection) Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if err := t.checkWrite(dst, dstOff, src, srcOff, size); err != nil {
		return err
	}
	if err := t.remote("write", dst); err != nil {
		return err
	}
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	off := uint64(dst.off) + uint64(dstOff)
	p, host := src.Ptr()+uintptr(srcOff), src.IsHost()
	if host {
		p = src.hostAddr(srcOff)
	}
	for done := 0; done < size; {
		n := min(t.chunk, size-done)
		m := tcpHeaderFor(tcpOpWrite, dst.r.key, off+uint64(done), uint64(n))
		m.src, m.n, m.host = p+uintptr(done), n, host
		if err := t.enqueue(m); err != nil {
			return t.errorf("write %d bytes: %w", size, err)
		}
		done += n
	}
	return nil
}

func (t *tcpConnection) UpdateAndSync(dst RegisteredMemory, dstOff int, value uint64) error {
	return t.word(tcpOpUpdate, "update", dst, dstOff, value)
}

func (t *tcpConnection) AtomicAdd(dst RegisteredMemory, dstOff int, value uint64) error {
	return t.word(tcpOpAdd, "atomic add", dst, dstOff, value)
}

func (t *tcpConnection) word(op byte, what string, dst RegisteredMemory, dstOff int, value uint64) error {
	if err := t.checkWord(what, dst, dstOff); err != nil {
		return err
	}
	if err := t.remote(what, dst); err != nil {
		return err
	}
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if err := t.enqueue(tcpHeaderFor(op, dst.r.key, uint64(dst.off)+uint64(dstOff), value)); err != nil {
		return t.errorf("%s: %w", what, err)
	}
	return nil
}

// enqueue numbers m and queues it on its socket. The caller holds sendMu.
func (t *tcpConnection) enqueue(m tcpMsg) error {
	seq := t.seq
	if start := traceStart(); start != 0 {
		defer t.trCall.rec(StageEnqueue, tcpTraceOp(m.hdr[0]), seq, int64(m.n), start)
	}
	binary.LittleEndian.PutUint64(m.hdr[8:], seq)
	// release closes the queues after stopCh, under sendMu: a send on a
	// closed queue must not be tried.
	select {
	case <-t.stopCh:
		return fmt.Errorf("%w", ErrClosed)
	default:
	}
	q := t.queues[seq%uint64(len(t.queues))]
	// Counted before the sender can see it, so the count never goes
	// below what is really queued.
	t.queued.Add(int64(m.n))
	select {
	case q <- m:
		t.seq++
		return nil
	case <-t.dead:
		t.queued.Add(-int64(m.n))
		return t.failure()
	case <-t.stopCh:
		t.queued.Add(-int64(m.n))
		return fmt.Errorf("%w", ErrClosed)
	}
}

// boundsOwnQueues: Write and the word operations wait while the socket's
// queue (tcpQueue messages) is full, so the proxy needs no flow-control
// flush for this connection (Proxy.queued).
func (t *tcpConnection) boundsOwnQueues() {}

// backlog is the payload bytes queued on the sockets and not yet written
// to them: how long the connection stays busy with work it already has
// (0 once it failed: nothing queued there will be sent).
func (t *tcpConnection) backlog() int64 {
	select {
	case <-t.dead:
		return 0
	default:
	}
	return t.queued.Load()
}

func (t *tcpConnection) Flush() error {
	if err := t.usable(); err != nil {
		return err
	}
	return t.flushWait("flush")
}

// drain waits for everything sent to land whether or not the communicator
// still accepts calls (a stopping proxy).
func (t *tcpConnection) drain() error { return t.flushWait("drain") }

func (t *tcpConnection) flushWait(what string) error {
	t.sendMu.Lock()
	if t.seq == t.acked.Load() {
		t.sendMu.Unlock()
		return t.failure()
	}
	seq := t.seq
	start := traceStart()
	err := t.enqueue(tcpHeaderFor(tcpOpFlush, 0, 0, 0))
	t.sendMu.Unlock()
	if err != nil {
		return t.errorf("%s: %w", what, err)
	}
	if start != 0 {
		defer t.trCall.rec(StageFlush, OpFlush, seq, 0, start)
	}
	timer := time.NewTimer(t.wait)
	defer timer.Stop()
	for t.acked.Load() <= seq {
		select {
		case <-t.ackCh:
		case <-t.dead:
			return t.errorf("%s: %w", what, t.failure())
		case <-t.stopCh:
			return t.errorf("%s: %w", what, ErrClosed)
		case <-timer.C:
			return t.errorf("%s: rank %d did not acknowledge within %s", what, t.peer, t.wait)
		}
	}
	return nil
}

// failure is the sending side's first error, nil while none.
func (t *tcpConnection) failure() error {
	t.failMu.Lock()
	defer t.failMu.Unlock()
	return t.err
}

func (t *tcpConnection) fail(err error) {
	t.failMu.Lock()
	defer t.failMu.Unlock()
	if t.err == nil {
		t.err = err
		close(t.dead)
	}
}

// peerGone describes a socket error: the peer closing or resetting it is
// named as such.
func (t *tcpConnection) peerGone(dir string, k int, err error) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("rank %d closed the connection (%s socket %d) without a goodbye: %w", t.peer, dir, k, err)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		err = fmt.Errorf("rank %d reset the connection (%s socket %d): %w", t.peer, dir, k, err)
	default:
		err = fmt.Errorf("%s socket %d to rank %d: %w", dir, k, t.peer, err)
	}
	return &PeerGoneError{Peer: t.peer, Err: err}
}

// sender writes socket k's queue in order. With staging it copies up to
// the next tcpTxBufs - 1 chunks out of the GPU while the current one is
// written. Once the queue is closed and empty it says goodbye and ends.
func (t *tcpConnection) sender(k int) {
	defer t.senders.Done()
	conn := t.links.out[k]
	q := t.queues[k]
	type staged struct {
		m      tcpMsg
		buf    []byte
		ev     device.Event
		issued int64 // trace: when its copy-out was queued (0: off)
	}
	// inflight: chunks copied out (or being copied) and not yet written,
	// oldest first; they use the tcpTxBufs slots round robin, at most
	// tcpTxBufs - 1 of them ahead of the one being written.
	var inflight []*staged
	which := 0
	tr := t.trSend[k]
	send := func(m tcpMsg, payload []byte) error {
		start := traceStart()
		if payload == nil {
			_, err := conn.Write(m.hdr[:])
			tr.rec(StageSend, tcpTraceOp(m.hdr[0]), tcpSeq(m.hdr[:]), 0, start)
			return err
		}
		bufs := net.Buffers{m.hdr[:], payload}
		_, err := bufs.WriteTo(conn)
		t.queued.Add(-int64(m.n))
		tr.rec(StageSend, tcpTraceOp(m.hdr[0]), tcpSeq(m.hdr[:]), int64(m.n), start)
		return err
	}
	sendOldest := func() error {
		s := inflight[0]
		inflight = inflight[1:]
		wait := traceStart()
		if err := s.ev.Synchronize(); err != nil {
			return fmt.Errorf("staging copy: %w", err)
		}
		if wait != 0 {
			seq := tcpSeq(s.m.hdr[:])
			tr.rec(StageCopyOutWait, OpWrite, seq, int64(s.m.n), wait)
			tr.rec(StageCopyOut, OpWrite, seq, int64(s.m.n), s.issued)
		}
		return send(s.m, s.buf)
	}
	sendAll := func() error {
		for len(inflight) > 0 {
			if err := sendOldest(); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		var m tcpMsg
		var ok bool
		if len(inflight) > 0 {
			select {
			case m, ok = <-q:
			default:
				// Nothing behind them: put the oldest staged chunk on the wire now.
				if err := sendOldest(); err != nil {
					t.senderFailed(k, err)
					return
				}
				continue
			}
		} else {
			m, ok = <-q
		}
		if !ok {
			err := sendAll()
			if err == nil {
				err = send(tcpHeaderFor(tcpOpBye, 0, 0, 0), nil)
			}
			if err != nil {
				t.senderFailed(k, err)
			}
			return
		}
		var err error
		switch {
		case m.n > 0 && t.stage && !m.host:
			h, ev := t.slot(k, which)
			which = (which + 1) % tcpTxBufs
			next := &staged{m: m, buf: h.Host[:m.n], ev: ev, issued: traceStart()}
			if err = t.copyOut(h, m.src, m.n); err == nil {
				if err = ev.Record(t.tx); err == nil {
					inflight = append(inflight, next)
					for err == nil && len(inflight) > tcpTxBufs-1 {
						err = sendOldest()
					}
				}
			}
		default:
			if err = sendAll(); err == nil {
				var payload []byte
				if m.n > 0 {
					payload = devapi.Bytes(m.src, uint64(m.n))
				}
				err = send(m, payload)
			}
		}
		if err != nil {
			t.senderFailed(k, err)
			return
		}
	}
}

func (t *tcpConnection) senderFailed(k int, err error) {
	if !t.closing.Load() {
		t.fail(t.peerGone("send", k, err))
	}
}

// copyOut queues the copy of n bytes at src (device memory) into the
// staging buffer h on the tx stream.
func (t *tcpConnection) copyOut(h device.HostMapped, src uintptr, n int) error {
	if t.cudaCtx != nil {
		return cuda.MemcpyDtoHAsync(h.Host[:n], cuda.DevicePtr(src), cuda.WrapStream(t.cudaCtx, t.tx.Handle()))
	}
	return t.dev.CopyAsync(h.Dev, src, n, t.tx)
}

// ackReader reads the peer's acknowledgements on socket k.
func (t *tcpConnection) ackReader(k int) {
	defer t.readers.Done()
	conn := t.links.out[k]
	var h [tcpHeader]byte
	for {
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			switch {
			case t.closing.Load():
			case t.peerBye.Load():
				t.fail(fmt.Errorf("rank %d closed the connection", t.peer))
			default:
				t.fail(t.peerGone("acknowledgement", k, err))
			}
			return
		}
		if h[0] != tcpOpAck {
			t.fail(fmt.Errorf("rank %d sent message type %d on acknowledgement socket %d", t.peer, h[0], k))
			return
		}
		v := binary.LittleEndian.Uint64(h[8:]) + 1
		for {
			old := t.acked.Load()
			if v <= old || t.acked.CompareAndSwap(old, v) {
				break
			}
		}
		select {
		case t.ackCh <- struct{}{}:
		default:
		}
	}
}

// ---------------------------------------------------------------------------
// Receiving side.

// receiver applies the operations arriving on socket k, each in its turn.
func (t *tcpConnection) receiver(k int) {
	defer t.readers.Done()
	conn := t.links.in[k]
	which := 0 // this socket's next receive buffer (staging)
	tr := t.trRx[k]
	for {
		m, arrived, ok := t.readHeader(k)
		if !ok {
			return
		}
		top := tcpTraceOp(m.op)
		// A staged write's payload goes into this socket's own pinned
		// buffer before the write's turn: the sockets of a connection then
		// read (the CPU copy out of the kernel, most of a byte's cost) in
		// parallel, and only applying it (queueing the copy-in) waits for
		// the operations numbered before it. The host backend without
		// staging reads straight into the destination, so it must wait
		// first (an earlier write may cover the same bytes).
		if m.op == tcpOpWrite && t.stage {
			var err error
			if m.staged, err = t.readStaged(conn, k, &which, m.val); err != nil {
				t.receiverFailed(err)
				return
			}
			tr.rec(StageRecv, top, m.seq, int64(m.val), arrived)
		} else {
			tr.rec(StageRecv, top, m.seq, 0, arrived)
		}
		waited := traceStart()
		if !t.turn(m.seq) {
			return
		}
		tr.rec(StageTurn, top, m.seq, 0, waited)
		if err := t.apply(m); err != nil {
			t.receiverFailed(err)
			return
		}
		t.rxMu.Lock()
		t.rxNext++
		t.rxCond.Broadcast()
		t.rxMu.Unlock()
	}
}

// readHeader reads socket k's next message header. ok is false when the
// reader should end: the peer said goodbye, or the socket failed (then
// reported). arrived is the trace's start of the message's receive, once
// its header is in (before that the reader just waits for the peer).
func (t *tcpConnection) readHeader(k int) (m *tcpRxMsg, arrived int64, ok bool) {
	var h [tcpHeader]byte
	if _, err := io.ReadFull(t.links.in[k], h[:]); err != nil {
		t.receiverFailed(t.peerGone("receive", k, err))
		return nil, 0, false
	}
	arrived = traceStart()
	le := binary.LittleEndian
	m = &tcpRxMsg{op: h[0], key: le.Uint32(h[4:]), seq: le.Uint64(h[8:]), off: le.Uint64(h[16:]), val: le.Uint64(h[24:]), k: k}
	if m.op == tcpOpBye {
		t.peerBye.Store(true)
		return nil, 0, false
	}
	return m, arrived, true
}

// tcpRxMsg is an operation read from socket k (a staged write's payload
// in staged), applied in sequence order.
type tcpRxMsg struct {
	op            byte
	key           uint32
	seq, off, val uint64
	k             int
	staged        *tcpStaged
	waited        int64 // trace: when it was ready to apply
}

// apply carries out one operation in its turn: a write's copy-in (or, not
// staged, its read from the socket), a word's store or add, a flush's
// acknowledgement (on the socket the flush came on, once everything
// before it landed).
func (t *tcpConnection) apply(m *tcpRxMsg) error {
	conn, tr, top := t.links.in[m.k], t.trRx[m.k], tcpTraceOp(m.op)
	var err error
	switch m.op {
	case tcpOpWrite:
		in := traceStart()
		err = t.applyWrite(conn, m.k, m.staged, m.key, m.off, m.val)
		tr.rec(StageCopyIn, top, m.seq, int64(m.val), in)
	case tcpOpUpdate, tcpOpAdd:
		err = t.applyWord(m.op, m.key, m.off, m.val)
	case tcpOpFlush:
		ackStart := traceStart()
		if t.stage {
			if err = t.rx.Synchronize(); err != nil {
				return fmt.Errorf("flush: %w", err)
			}
		}
		ack := tcpHeaderFor(tcpOpAck, 0, 0, 0)
		binary.LittleEndian.PutUint64(ack.hdr[8:], m.seq)
		if _, werr := conn.Write(ack.hdr[:]); werr != nil {
			err = t.peerGone("acknowledge", m.k, werr)
		}
		tr.rec(StageAck, top, m.seq, 0, ackStart)
	default:
		err = fmt.Errorf("rank %d sent unknown message type %d (sequence %d)", t.peer, m.op, m.seq)
	}
	if err == nil {
		if start := traceStart(); start != 0 {
			tr.rec(StageApply, top, m.seq, 0, start)
		}
	}
	return err
}

// receiverAhead is socket k's reader with read-ahead
// (NetworkConfig.ReceiveAhead): it stages each write's payload in the
// next of the socket's rxBufs buffers (once the write that used it last
// was applied) without waiting for its turn, and hands every operation to
// deliver, which applies whatever has become consecutive. A socket whose
// message is not next so goes on draining its kernel buffer instead of
// holding it full while an earlier message is still on another socket.
func (t *tcpConnection) receiverAhead(k int) {
	defer t.readers.Done()
	conn := t.links.in[k]
	next := 0 // this socket's next receive buffer
	tr := t.trRx[k]
	for {
		m, arrived, ok := t.readHeader(k)
		if !ok {
			return
		}
		var n int64
		if m.op == tcpOpWrite {
			if !t.takeRxBuffer(k) {
				return
			}
			st, err := t.readStagedInto(conn, k, tcpTxBufs+next, m.val)
			if err != nil {
				t.receiverFailed(err)
				return
			}
			next = (next + 1) % t.rxBufs
			m.staged, n = st, int64(m.val)
		}
		tr.rec(StageRecv, tcpTraceOp(m.op), m.seq, n, arrived)
		m.waited = traceStart()
		if err := t.deliver(m); err != nil {
			t.receiverFailed(err)
			return
		}
	}
}

// takeRxBuffer waits until fewer than rxBufs of socket k's writes wait to
// be applied (its next buffer is then free once its copy-in is done) and
// counts one more; false when the connection stops first.
func (t *tcpConnection) takeRxBuffer(k int) bool {
	t.rxMu.Lock()
	defer t.rxMu.Unlock()
	for t.rxHeld[k] >= t.rxBufs && !t.rxStop {
		t.rxCond.Wait()
	}
	if t.rxStop {
		return false
	}
	t.rxHeld[k]++
	return true
}

// deliver parks m and, unless another reader is applying now, applies
// every operation from the next sequence number on that is parked, in
// order (the lock is not held while one is applied; a reader that parks
// the next one meanwhile leaves it to this loop, which looks again).
func (t *tcpConnection) deliver(m *tcpRxMsg) error {
	t.rxMu.Lock()
	defer t.rxMu.Unlock()
	if t.rxStop {
		return nil
	}
	if m.seq < t.rxNext || t.rxPending[m.seq] != nil {
		return fmt.Errorf("rank %d sent sequence number %d twice: the stream is corrupt", t.peer, m.seq)
	}
	t.rxPending[m.seq] = m
	if t.rxApplying {
		return nil
	}
	t.rxApplying = true
	defer func() { t.rxApplying = false }()
	for !t.rxStop {
		a := t.rxPending[t.rxNext]
		if a == nil {
			return nil
		}
		delete(t.rxPending, t.rxNext)
		t.rxMu.Unlock()
		t.trRx[a.k].rec(StageTurn, tcpTraceOp(a.op), a.seq, 0, a.waited)
		err := t.apply(a)
		t.rxMu.Lock()
		if a.op == tcpOpWrite {
			t.rxHeld[a.k]--
		}
		if err != nil {
			return err
		}
		t.rxNext++
		t.rxCond.Broadcast()
	}
	return nil
}

// turn waits until seq is the next operation to apply; false when the
// connection stops first.
func (t *tcpConnection) turn(seq uint64) bool {
	t.rxMu.Lock()
	defer t.rxMu.Unlock()
	for t.rxNext != seq && !t.rxStop {
		if seq < t.rxNext {
			t.rxStop = true // a duplicate number: the stream is corrupt
			break
		}
		t.rxCond.Wait()
	}
	return !t.rxStop
}

// tcpStaged is a staged write's payload, read into socket k's receive
// buffer h before its turn; ev is recorded after its copy-in.
type tcpStaged struct {
	h  device.HostMapped
	ev device.Event
	n  uint64
}

// readStaged reads a write's n payload bytes into the next of socket k's
// two receive buffers, once that buffer's previous copy-in is done.
func (t *tcpConnection) readStaged(conn net.Conn, k int, which *int, n uint64) (*tcpStaged, error) {
	j := tcpTxBufs + *which
	*which ^= 1
	return t.readStagedInto(conn, k, j, n)
}

// readStagedInto reads a write's n payload bytes into socket k's staging
// buffer j once that buffer's previous copy-in is done.
func (t *tcpConnection) readStagedInto(conn net.Conn, k, j int, n uint64) (*tcpStaged, error) {
	if n > uint64(t.chunk) {
		return nil, fmt.Errorf("rank %d sent a write of %d bytes, above the %d-byte chunk", t.peer, n, t.chunk)
	}
	h, ev := t.slot(k, j)
	if err := ev.Synchronize(); err != nil {
		return nil, fmt.Errorf("staging copy: %w", err)
	}
	if _, err := io.ReadFull(conn, h.Host[:n]); err != nil {
		return nil, t.peerGone("receive", k, err)
	}
	return &tcpStaged{h: h, ev: ev, n: n}, nil
}

// applyWrite applies a write in its turn: the staged payload's copy-in
// queued on rx, or (no staging) the payload read from the socket straight
// into the destination.
func (t *tcpConnection) applyWrite(conn net.Conn, k int, staged *tcpStaged, key uint32, off, n uint64) error {
	if n > uint64(t.chunk) {
		return fmt.Errorf("rank %d sent a write of %d bytes, above the %d-byte chunk", t.peer, n, t.chunk)
	}
	p, r, err := t.c.netRegion(key, off, n)
	if err != nil {
		return fmt.Errorf("write from rank %d: %w", t.peer, err)
	}
	// Done once the bytes are read (host) or their copy-in is queued on rx
	// (GPU: DeregisterMemory then settles rx before the memory is freed).
	defer r.applying.Done()
	if staged == nil {
		if _, err := io.ReadFull(conn, devapi.Bytes(p, n)); err != nil {
			return t.peerGone("receive", k, err)
		}
		return nil
	}
	if err := t.dev.CopyInAsync(p, staged.h.Host[:n], t.rx); err != nil {
		return fmt.Errorf("copy in %d bytes: %w", n, err)
	}
	return staged.ev.Record(t.rx)
}

// applyWord stores (update) or adds (atomic add) val at the word.
func (t *tcpConnection) applyWord(op byte, key uint32, off, val uint64) error {
	what := map[byte]string{tcpOpUpdate: "update", tcpOpAdd: "atomic add"}[op]
	p, r, err := t.c.netRegion(key, off, 8)
	if err != nil {
		return fmt.Errorf("%s from rank %d: %w", what, t.peer, err)
	}
	defer r.applying.Done()
	if p%8 != 0 {
		return fmt.Errorf("%s from rank %d: address %#x is not 8-byte aligned", what, t.peer, p)
	}
	if t.c.kind == device.Host {
		// Host backend: copies are done when issued.
		if op == tcpOpAdd {
			devapi.U64(p).Add(val)
		} else {
			devapi.U64(p).Store(val)
		}
		return nil
	}
	if op == tcpOpAdd {
		// Device atomics on the GPU word, in stream order after the data.
		args := device.NewArgs(2).Ptr(p).U64(val)
		if err := t.dev.Launch(devapi.KernelProxyAtomicAdd, device.D1(1), device.D1(1), 0, t.rx, args); err != nil {
			return fmt.Errorf("atomic add: %w", err)
		}
		return nil
	}
	// A stream write lands the 8 bytes in one piece after the copies.
	if t.rxOps != nil {
		if err := t.rxOps.WriteValue64(cuda.DevicePtr(p), val, cuda.WriteValueDefault); err == nil {
			return nil
		}
	}
	if err := t.rx.Synchronize(); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	if err := t.dev.CopyIn(p, binary.LittleEndian.AppendUint64(nil, val)); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return nil
}

// settle waits for the copy-ins and adds queued on the receive stream
// (nothing to wait for on the host backend: writes are done when read).
func (t *tcpConnection) settle() error {
	if !t.stage || t.rx == nil {
		return nil
	}
	if err := t.rx.Synchronize(); err != nil {
		return t.errorf("settle receive stream: %w", err)
	}
	return nil
}

// receiverFailed stops applying and breaks the communicator: the peer's
// operations no longer arrive, so this rank's kernels waiting for them must
// end now (abort flag) rather than at the timeout.
func (t *tcpConnection) receiverFailed(err error) {
	if t.closing.Load() {
		return
	}
	t.rxMu.Lock()
	t.rxStop = true
	t.rxCond.Broadcast()
	t.rxMu.Unlock()
	err = t.errorf("%w", err)
	t.fail(err)
	// Close holds c.mu while it waits for this goroutine: never block on
	// it, give up once closing.
	c := t.c
	for !c.mu.TryLock() {
		if t.closing.Load() {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	defer c.mu.Unlock()
	if c.closed || t.closing.Load() {
		return
	}
	_ = c.wd.abort()
	if c.broken == nil {
		c.broken = err
	}
}

// release closes the connection (c.mu held): what is queued is still
// delivered, then each sender's goodbye, within tcpCloseGrace (the
// sockets' write deadline); then the sockets close and every goroutine is
// waited for.
func (t *tcpConnection) release() error {
	dropTraceTracks(append(append([]*traceTrack{t.trCall}, t.trSend...), t.trRx...)...)
	t.closing.Store(true)
	t.stopOnce.Do(func() { close(t.stopCh) })
	t.sendMu.Lock()
	grace := time.Now().Add(tcpCloseGrace)
	for _, conn := range t.links.out {
		_ = conn.SetWriteDeadline(grace)
	}
	for _, q := range t.queues {
		close(q)
	}
	t.sendMu.Unlock()
	// Senders end after the goodbye (or at the write deadline); closing
	// the sockets then ends the readers.
	t.senders.Wait()
	closeLinks(t.links)
	t.rxMu.Lock()
	t.rxStop = true
	t.rxCond.Broadcast()
	t.rxMu.Unlock()
	t.readers.Wait()
	return t.freeStaging()
}

// tcpTraceOp is the trace's name for a message type.
func tcpTraceOp(op byte) TraceOp {
	switch op {
	case tcpOpWrite:
		return OpWrite
	case tcpOpUpdate:
		return OpUpdate
	case tcpOpAdd:
		return OpAtomicAdd
	case tcpOpFlush:
		return OpFlush
	}
	return 0
}

// tcpSeq is a message header's sequence number.
func tcpSeq(hdr []byte) uint64 { return binary.LittleEndian.Uint64(hdr[8:]) }
