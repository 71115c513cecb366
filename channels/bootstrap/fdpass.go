//go:build linux

package bootstrap

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// FDExchanger passes file descriptors (CUDA VMM handles exported as POSIX fds,
// memfds, pipes) between the ranks of one host, over Linux abstract Unix
// sockets with SCM_RIGHTS. The Bootstrap is used only to rendezvous: every
// rank publishes its socket name, pid and host identity with one AllGather.
// Ranks on one host then connect pairwise (lower dials higher) with
// SOCK_SEQPACKET, so each message and its descriptors stay one unit, and a
// reader goroutine per connection queues what arrives per (peer, tag).
//
// The acceptor checks the connecting process with SO_PEERCRED against what
// that rank published, because an abstract socket is reachable by every
// process in the network namespace.
type FDExchanger struct {
	rank, size int
	timeout    time.Duration
	ln         *net.UnixListener
	peers      []fdPeerInfo
	links      []*fdLink // same-host peers only
	in         *inbox[[]int]
	closing    atomic.Bool
	closeOnce  sync.Once
	wg         sync.WaitGroup
}

type fdLink struct {
	peer int
	conn *net.UnixConn
	wmu  sync.Mutex
}

// fdPeerInfo is what each rank publishes in the rendezvous AllGather.
type fdPeerInfo struct {
	Name    string `json:"name"`     // abstract socket name, with the leading '@'
	Pid     int    `json:"pid"`      // to check SO_PEERCRED
	Uid     int    `json:"uid"`      // checked instead of pid across pid namespaces
	PidNS   string `json:"pidns"`    // "pid:[4026531836]"
	HostKey string `json:"host_key"` // boot id + network namespace: same key, same abstract socket space
	Host    string `json:"host"`     // hostname, for messages
}

// MaxFDsPerMessage is the kernel's limit on descriptors in one SCM_RIGHTS message.
const MaxFDsPerMessage = 253

// errNilFDExchanger is what the calls of a nil *FDExchanger return.
var errNilFDExchanger = errors.New("bootstrap: nil FDExchanger (NewFDExchanger makes one)")

// NewFDExchanger sets up descriptor passing among the ranks of b that share a
// host. It is collective: every rank of b must call it. timeout bounds every
// wait (zero: the Bootstrap's own timeout, or the default).
func NewFDExchanger(ctx context.Context, b Bootstrap, timeout time.Duration) (*FDExchanger, error) {
	rank, size := b.Rank(), b.Size()
	if timeout == 0 {
		if t, ok := b.(interface{ Timeout() time.Duration }); ok {
			timeout = t.Timeout()
		}
	}
	timeout, err := resolveTimeout(timeout)
	if err != nil {
		return nil, err
	}
	uid := "anon"
	if u, ok := b.(interface{ UniqueID() string }); ok && u.UniqueID() != "" {
		uid = u.UniqueID()
	}
	x := &FDExchanger{rank: rank, size: size, timeout: timeout, links: make([]*fdLink, size), in: newInbox[[]int](size)}

	// The suffix lets several exchangers share one bootstrap.
	var nonce [4]byte
	rand.Read(nonce[:])
	me := localFDPeerInfo(fmt.Sprintf("@goep-%s-%d-%s", uid, rank, hex.EncodeToString(nonce[:])))
	x.ln, err = net.ListenUnix("unixpacket", &net.UnixAddr{Name: me.Name, Net: "unixpacket"})
	if err != nil {
		return nil, x.errorf("fd exchanger: listen on abstract socket %s: %w", me.Name, err)
	}
	ok := false
	defer func() {
		if !ok {
			x.Close()
		}
	}()

	blob, _ := json.Marshal(me)
	all, err := b.AllGather(ctx, blob)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: rank %d: fd exchanger rendezvous: %w", rank, err)
	}
	x.peers = make([]fdPeerInfo, size)
	for r, blob := range all {
		if err := json.Unmarshal(blob, &x.peers[r]); err != nil {
			return nil, x.errorf("fd exchanger: bad rendezvous data from rank %d: %w", r, err)
		}
	}
	if err := x.connectHost(ctx); err != nil {
		return nil, err
	}
	for _, l := range x.links {
		if l != nil {
			x.wg.Add(1)
			go x.readLoop(l)
		}
	}
	ok = true
	return x, nil
}

func (x *FDExchanger) errorf(format string, args ...any) error {
	return fmt.Errorf("bootstrap: rank %d: "+format, append([]any{x.rank}, args...)...)
}

func (x *FDExchanger) sameHost(r int) bool { return x.peers[r].HostKey == x.peers[x.rank].HostKey }

// checkPeer validates a SendFD/RecvFD target.
func (x *FDExchanger) checkPeer(op string, peer, tag int) error {
	switch {
	case x.closing.Load():
		return x.errorf("%s: %w", op, ErrClosed)
	case peer < 0 || peer >= x.size:
		return x.errorf("%s: peer %d is outside [0, %d)", op, peer, x.size)
	case tag < 0:
		return x.errorf("%s: tag %d is negative", op, tag)
	case !x.sameHost(peer):
		return x.errorf("%s: rank %d is on host %s and this rank on %s; file descriptors can only be passed within one host (and network namespace)",
			op, peer, x.peers[peer].Host, x.peers[x.rank].Host)
	}
	return nil
}

// SendFD passes fds to peer under tag. The peer receives duplicates; the
// caller still owns (and may close) its own fds as soon as SendFD returns.
func (x *FDExchanger) SendFD(ctx context.Context, peer, tag int, fds []int) error {
	if x == nil {
		return errNilFDExchanger
	}
	op := fmt.Sprintf("sendfd to rank %d tag %d", peer, tag)
	if err := x.checkPeer(op, peer, tag); err != nil {
		return err
	}
	if len(fds) == 0 || len(fds) > MaxFDsPerMessage {
		return x.errorf("%s: %d fds; one message carries 1 to %d", op, len(fds), MaxFDsPerMessage)
	}
	for _, fd := range fds {
		if fd < 0 {
			return x.errorf("%s: invalid fd %d", op, fd)
		}
	}
	if peer == x.rank {
		dups, err := dupFDs(fds)
		if err != nil {
			return x.errorf("%s: %w", op, err)
		}
		if !x.in.push(peer, int64(tag), dups) {
			closeFDs(dups)
			return x.errorf("%s: %w", op, ErrClosed)
		}
		return nil
	}
	if err := x.in.peerError(peer); err != nil {
		return x.errorf("%s: %w", op, err)
	}
	l := x.links[peer]
	l.wmu.Lock()
	defer l.wmu.Unlock()
	start := time.Now()
	hdr := encodeFDHeader(int64(tag), len(fds))
	err := within(ctx, l.conn.SetWriteDeadline, start.Add(x.timeout), func() error {
		_, _, err := l.conn.WriteMsgUnix(hdr[:], syscall.UnixRights(fds...), nil)
		return err
	})
	switch {
	case err == nil:
		return nil
	case isTimeout(err):
		// A packet is sent whole or not at all, so the link survives.
		return x.errorf("%w", waitError(ctx, op, start, x.timeout, []int{peer}, ""))
	case !linkBroken(err):
		return x.errorf("%s: %w", op, err) // e.g. EBADF for a closed fd: nothing was sent
	}
	x.in.failPeer(peer, &PeerClosedError{Rank: peer, Err: err})
	l.conn.Close()
	return x.errorf("%s: %w", op, x.in.peerError(peer))
}

// RecvFD returns the next fds peer sent under tag. The caller owns them
// (they are close-on-exec). Messages with the same (peer, tag) arrive in order.
func (x *FDExchanger) RecvFD(ctx context.Context, peer, tag int) ([]int, error) {
	if x == nil {
		return nil, errNilFDExchanger
	}
	op := fmt.Sprintf("recvfd from rank %d tag %d", peer, tag)
	if err := x.checkPeer(op, peer, tag); err != nil {
		return nil, err
	}
	start := time.Now()
	timer := time.NewTimer(x.timeout)
	defer timer.Stop()
	var fds []int
	missing, err := x.in.collect(ctx, timer.C, int64(tag), []int{peer}, func(_ int, v []int) { fds = v })
	switch {
	case err == nil:
		return fds, nil
	case errors.Is(err, errWaitInterrupted):
		return nil, x.errorf("%w", waitError(ctx, op, start, x.timeout, missing, ""))
	}
	return nil, x.errorf("%s: %w", op, err)
}

// Close stops the reader goroutines, closes the sockets and closes any
// received descriptors nobody took. Peers see ErrPeerClosed.
func (x *FDExchanger) Close() error {
	if x == nil {
		return nil
	}
	x.closeOnce.Do(func() {
		x.closing.Store(true)
		if x.ln != nil {
			x.ln.Close()
		}
		for _, l := range x.links {
			if l != nil {
				l.conn.Close()
			}
		}
		x.wg.Wait()
		for _, fds := range x.in.close(ErrClosed) {
			closeFDs(fds)
		}
	})
	return nil
}

// A descriptor packet: tag int64, fd count uint32, magic uint32; the fds
// travel as SCM_RIGHTS ancillary data.
const (
	fdMagic     uint32 = 0x67657064 // "gepd"
	fdHeaderLen        = 16
)

func encodeFDHeader(tag int64, n int) [fdHeaderLen]byte {
	var h [fdHeaderLen]byte
	binary.BigEndian.PutUint64(h[0:8], uint64(tag))
	binary.BigEndian.PutUint32(h[8:12], uint32(n))
	binary.BigEndian.PutUint32(h[12:16], fdMagic)
	return h
}

func (x *FDExchanger) readLoop(l *fdLink) {
	defer x.wg.Done()
	buf := make([]byte, 64)
	oob := make([]byte, syscall.CmsgSpace(MaxFDsPerMessage*4))
	for {
		tag, fds, err := readFDPacket(l.conn, buf, oob)
		if err != nil {
			if !x.closing.Load() {
				x.in.failPeer(l.peer, &PeerClosedError{Rank: l.peer, Err: err})
			}
			l.conn.Close()
			return
		}
		if !x.in.push(l.peer, tag, fds) {
			closeFDs(fds)
		}
	}
}

// readFDPacket reads one packet and takes ownership of any descriptors in it,
// closing them again if the packet is malformed.
func readFDPacket(c *net.UnixConn, buf, oob []byte) (int64, []int, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0, nil, fmt.Errorf("protocol error: control message: %w", err)
		}
		for i := range msgs {
			got, err := syscall.ParseUnixRights(&msgs[i])
			if err == nil {
				fds = append(fds, got...)
			}
		}
	}
	for _, fd := range fds {
		syscall.CloseOnExec(fd)
	}
	bad := func(format string, args ...any) (int64, []int, error) {
		closeFDs(fds)
		return 0, nil, fmt.Errorf("protocol error: "+format, args...)
	}
	switch {
	case n == 0 && oobn == 0:
		return 0, nil, errors.New("connection closed (EOF)") // seqpacket EOF: an empty read
	case flags&(syscall.MSG_CTRUNC|syscall.MSG_TRUNC) != 0:
		return bad("packet or descriptors truncated (flags %#x)", flags)
	case n != fdHeaderLen || binary.BigEndian.Uint32(buf[12:16]) != fdMagic:
		return bad("bad packet of %d bytes", n)
	}
	if want := int(binary.BigEndian.Uint32(buf[8:12])); want != len(fds) {
		return bad("packet announces %d fds but carries %d", want, len(fds))
	}
	return int64(binary.BigEndian.Uint64(buf[0:8])), fds, nil
}

// linkBroken tells errors that end the connection from ones that only
// refused this packet.
func linkBroken(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ENOTCONN) || errors.Is(err, net.ErrClosed)
}

func dupFDs(fds []int) ([]int, error) {
	out := make([]int, 0, len(fds))
	for _, fd := range fds {
		syscall.ForkLock.RLock() // no fork may inherit the dup before it is close-on-exec
		d, err := syscall.Dup(fd)
		if err == nil {
			syscall.CloseOnExec(d)
		}
		syscall.ForkLock.RUnlock()
		if err != nil {
			closeFDs(out)
			return nil, fmt.Errorf("dup fd %d: %w", fd, err)
		}
		out = append(out, d)
	}
	return out, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// localFDPeerInfo describes this process. Two ranks can reach each other's
// abstract sockets iff they share a kernel (boot id) and network namespace.
func localFDPeerInfo(name string) fdPeerInfo {
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	netns, _ := os.Readlink("/proc/self/ns/net")
	pidns, _ := os.Readlink("/proc/self/ns/pid")
	key := string(boot) + "|" + netns
	if len(boot) == 0 {
		key = "host:" + host + "|" + netns
	}
	return fdPeerInfo{Name: name, Pid: os.Getpid(), Uid: os.Getuid(), PidNS: pidns, HostKey: key, Host: host}
}
