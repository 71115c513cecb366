package channels

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TCP connection setup. A ConnectAll that reaches peers on other nodes
// opens one listener for the call and sends each of those peers, over the
// bootstrap, a setup message: a fresh random nonce for that position, the
// host identity, the socket count, the port and the addresses to dial.
// Each rank then dials Sockets sockets to every such peer (its sending
// direction) and accepts as many from each (the receiving direction); a
// dialer opens each socket with a hello carrying the nonce it was sent, its
// rank and the socket's index, so the acceptor files every socket under the
// right position (two connections to one peer in one call included) and
// drops strays. The listener lives only for the call.

const (
	tcpSetupMagic = "goepTS01"
	tcpHelloMagic = "goepTH01"
	tcpHelloSize  = 24
	// tcpDialAttempt bounds one dial of one advertised address.
	tcpDialAttempt = 5 * time.Second
)

// tcpLinks are one connection's sockets: out carries this rank's
// operations (and the peer's acknowledgements back), in the peer's.
type tcpLinks struct {
	out []net.Conn
	in  []net.Conn
}

func closeLinks(ls ...*tcpLinks) {
	for _, l := range ls {
		if l == nil {
			continue
		}
		for _, s := range append(l.out, l.in...) {
			if s != nil {
				_ = s.Close()
			}
		}
	}
}

// tcpSetup connects this rank to peers[i] for every i in pos over TCP,
// filling links[i]. On error nothing stays open.
func (c *Communicator) tcpSetup(ctx context.Context, tag int, peers, pos []int, links []*tcpLinks) (err error) {
	n := c.net.cfg.Sockets
	deadline := time.Now().Add(c.Timeouts().Wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer func() {
		if err != nil {
			closeLinks(links...)
			for i := range links {
				links[i] = nil
			}
		}
	}()

	lc := net.ListenConfig{}
	listenAddr := ":0"
	if h := c.net.cfg.ListenHost; h != "" {
		listenAddr = net.JoinHostPort(h, "0")
	}
	ln, err := lc.Listen(ctx, "tcp", listenAddr)
	if err != nil {
		return c.errorf("tcp setup (tag %d): listen on %s: %w", tag, listenAddr, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	addrs, err := c.advertise()
	if err != nil {
		return err
	}

	nonces := make(map[uint64]int, len(pos)) // nonce -> position
	msgs := make([][]byte, len(pos))
	for j, i := range pos {
		var nb [8]byte
		for {
			if _, err := rand.Read(nb[:]); err != nil {
				return c.errorf("tcp setup: %w", err)
			}
			if _, dup := nonces[binary.LittleEndian.Uint64(nb[:])]; !dup {
				break
			}
		}
		nonces[binary.LittleEndian.Uint64(nb[:])] = i
		b := append([]byte(tcpSetupMagic), nb[:]...)
		b = append(b, c.hostID[:]...)
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
		b = binary.LittleEndian.AppendUint32(b, uint32(port))
		msgs[j] = append(b, strings.Join(addrs, ",")...)
		links[i] = &tcpLinks{out: make([]net.Conn, n), in: make([]net.Conn, n)}
	}
	netPeers := make([]int, len(pos))
	for j, i := range pos {
		netPeers[j] = peers[i]
	}
	theirs, err := c.exchange(ctx, kindNetSetup, tag, netPeers, func(j int) []byte { return msgs[j] })
	if err != nil {
		return err
	}

	// Accept and dial at once: every rank does both, so waiting for one
	// before the other could deadlock.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	fail := func(e error) {
		mu.Lock()
		errs = append(errs, e)
		mu.Unlock()
		cancel()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if e := c.tcpAccept(ctx, ln, peers, nonces, links, len(pos)*n); e != nil {
			fail(e)
		}
	}()
	for j, i := range pos {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if e := c.tcpDial(ctx, peers[i], tag, theirs[j], links[i].out); e != nil {
				fail(e)
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// advertise lists the addresses peers on other hosts may dial.
func (c *Communicator) advertise() ([]string, error) {
	if h := c.net.cfg.ListenHost; h != "" {
		return []string{h}, nil
	}
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, c.errorf("tcp setup: interface addresses: %w", err)
	}
	var out []string
	for _, a := range ifs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsMulticast() {
			continue
		}
		out = append(out, ipn.IP.String())
	}
	return out, nil
}

// tcpDial opens the sockets of this rank's sending direction to peer, as
// its setup message msg says.
func (c *Communicator) tcpDial(ctx context.Context, peer, tag int, msg []byte, out []net.Conn) error {
	le := binary.LittleEndian
	if len(msg) < 40 || !bytes.Equal(msg[:8], []byte(tcpSetupMagic)) {
		return c.errorf("tcp setup with rank %d (tag %d): malformed setup message (%d bytes)", peer, tag, len(msg))
	}
	nonce := msg[8:16]
	if n := int(le.Uint32(msg[32:])); n != len(out) {
		return c.errorf("tcp setup with rank %d (tag %d): Network.Sockets is %d on rank %d and %d on rank %d", peer, tag, len(out), c.rank, n, peer)
	}
	port := strconv.Itoa(int(le.Uint32(msg[36:])))
	var cands []string
	if bytes.Equal(msg[16:32], c.hostID[:]) && c.net.cfg.ListenHost == "" {
		cands = append(cands, "127.0.0.1")
	}
	if s := string(msg[40:]); s != "" {
		cands = append(cands, strings.Split(s, ",")...)
	}
	if len(cands) == 0 {
		return c.errorf("tcp setup with rank %d (tag %d): rank %d advertised no address (set Network.ListenHost or $%s)", peer, tag, peer, NetListenEnv)
	}
	var d net.Dialer
	addr := ""
	var tried []string
	for k := range out {
		for out[k] == nil {
			var conn net.Conn
			var err error
			if addr != "" {
				conn, err = d.DialContext(ctx, "tcp", addr)
			} else {
				for _, h := range cands {
					a := net.JoinHostPort(h, port)
					actx, cancel := context.WithTimeout(ctx, tcpDialAttempt)
					conn, err = d.DialContext(actx, "tcp", a)
					cancel()
					if err == nil {
						addr = a
						break
					}
					tried = append(tried, fmt.Sprintf("%s (%v)", a, err))
				}
			}
			if err != nil || conn == nil {
				if err == nil {
					err = fmt.Errorf("tried %s", strings.Join(tried, ", "))
				}
				return c.errorf("tcp setup with rank %d (tag %d): dial: %w", peer, tag, err)
			}
			hello := append([]byte(tcpHelloMagic), nonce...)
			hello = le.AppendUint32(hello, uint32(c.rank))
			hello = le.AppendUint32(hello, uint32(k))
			if dl, ok := ctx.Deadline(); ok {
				_ = conn.SetWriteDeadline(dl)
			}
			if _, err := conn.Write(hello); err != nil {
				_ = conn.Close()
				return c.errorf("tcp setup with rank %d (tag %d): hello on socket %d: %w", peer, tag, k, err)
			}
			_ = conn.SetWriteDeadline(time.Time{})
			tuneTCP(conn)
			out[k] = conn
		}
	}
	return nil
}

// tcpAccept accepts want sockets and files each under its position's
// links (in), by the hello's nonce, rank and index.
func (c *Communicator) tcpAccept(ctx context.Context, ln net.Listener, peers []int, nonces map[uint64]int, links []*tcpLinks, want int) error {
	le := binary.LittleEndian
	if dl, ok := ctx.Deadline(); ok {
		_ = ln.(*net.TCPListener).SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var rejected []string
	for got := 0; got < want; {
		conn, err := ln.Accept()
		if err != nil {
			missing := c.missingSockets(peers, links)
			why := ""
			if len(rejected) > 0 {
				why = "; rejected: " + strings.Join(rejected, ", ")
			}
			return c.errorf("tcp setup: accept: still waiting for sockets from %s: %w%s", missing, err, why)
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetReadDeadline(dl)
		}
		var h [tcpHelloSize]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil || !bytes.Equal(h[:8], []byte(tcpHelloMagic)) {
			rejected = append(rejected, fmt.Sprintf("%v (no hello)", conn.RemoteAddr()))
			_ = conn.Close()
			continue
		}
		i, ok := nonces[le.Uint64(h[8:])]
		rank, k := int(le.Uint32(h[16:])), int(le.Uint32(h[20:]))
		if !ok || rank != peers[i] || k >= len(links[i].in) || links[i].in[k] != nil {
			rejected = append(rejected, fmt.Sprintf("%v (rank %d socket %d: unknown or duplicate)", conn.RemoteAddr(), rank, k))
			_ = conn.Close()
			continue
		}
		_ = conn.SetReadDeadline(time.Time{})
		tuneTCP(conn)
		links[i].in[k] = conn
		got++
	}
	return nil
}

func (c *Communicator) missingSockets(peers []int, links []*tcpLinks) string {
	var miss []string
	for i, l := range links {
		if l == nil {
			continue
		}
		for _, s := range l.in {
			if s == nil {
				miss = append(miss, "rank "+strconv.Itoa(peers[i]))
				break
			}
		}
	}
	return strings.Join(miss, ", ")
}

// tcpSocketBuffer is the kernel buffer size asked for each direction of a
// socket.
const tcpSocketBuffer = 4 << 20

// tuneTCP: no Nagle (a signal must not wait for more bytes) and large
// kernel buffers so one socket keeps a long pipe full. Linux caps SO_RCVBUF
// and SO_SNDBUF at net.core.rmem_max / wmem_max (212,992 bytes unless the
// host raised them) and a set size turns the kernel's autotuning off, so a
// plain set can leave a socket far below the 1 MiB chunk it carries: every
// chunk then takes several blocking writes and reads. Where the process may
// (CAP_NET_ADMIN), the forced options set the size past the cap
// (forceSocketBuffers); else the plain set.
func tuneTCP(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if forceSocketBuffers(tc, tcpSocketBuffer) {
			return
		}
		_ = tc.SetReadBuffer(tcpSocketBuffer)
		_ = tc.SetWriteBuffer(tcpSocketBuffer)
	}
}
