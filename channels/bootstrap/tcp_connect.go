package bootstrap

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Connect joins the TCP bootstrap of cfg.Size ranks (see the package comment
// for the protocol). It returns when this rank is connected to every other
// rank. The registration phase and the mesh phase are each bounded by the
// timeout, so Connect takes at most about twice Config.Timeout; with Size 1
// it opens no sockets at all.
func Connect(ctx context.Context, cfg Config) (Bootstrap, error) {
	if err := validateRankSize(cfg.Rank, cfg.Size); err != nil {
		return nil, err
	}
	if err := validateUniqueID(cfg.UniqueID); err != nil {
		return nil, err
	}
	timeout, err := resolveTimeout(cfg.Timeout)
	if err != nil {
		return nil, err
	}
	s := &setup{rank: cfg.Rank, size: cfg.Size, uid: cfg.UniqueID, timeout: timeout, cfg: cfg}
	if cfg.Size == 1 {
		return s.finish(nil), nil
	}
	if _, _, err := net.SplitHostPort(cfg.RootAddr); err != nil {
		return nil, s.errorf("root address %q is not host:port: %w", cfg.RootAddr, err)
	}
	var links []*tcpLink
	if cfg.Rank == 0 {
		links, err = s.root(ctx)
	} else {
		links, err = s.nonRoot(ctx)
	}
	if err != nil {
		return nil, err
	}
	return s.finish(links), nil
}

// setup holds what Connect needs while the mesh is being built.
type setup struct {
	rank, size int
	uid        string
	timeout    time.Duration
	cfg        Config
}

func (s *setup) errorf(format string, args ...any) error {
	return fmt.Errorf("bootstrap: rank %d: "+format, append([]any{s.rank}, args...)...)
}

func (s *setup) finish(links []*tcpLink) *core {
	c := &core{rank: s.rank, size: s.size, uid: s.uid, timeout: s.timeout, in: newInbox[[]byte](s.size)}
	if links != nil {
		c.tr = newTCPTransport(links, c.in)
	}
	return c
}

func closeLinks(links []*tcpLink) {
	for _, l := range links {
		if l != nil {
			l.conn.Close()
		}
	}
}

// root accepts a registration from every other rank, then sends each the
// address table. The registration connections become the links to rank 0.
func (s *setup) root(ctx context.Context) ([]*tcpLink, error) {
	start := time.Now()
	addr := s.cfg.RootAddr
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, "tcp", s.rootListenAddr())
	if err != nil {
		return nil, s.errorf("listen on root address %s: %w", s.rootListenAddr(), err)
	}
	actx, cancel := context.WithDeadline(ctx, start.Add(s.timeout))
	defer cancel()
	a := newAcceptor(s, kindRegister, rankRange(1, s.size))
	missing, ok := a.run(actx, ln)
	links := make([]*tcpLink, s.size)
	for r, l := range a.got {
		links[r] = l
	}
	if !ok {
		what := "to register at " + addr
		if rej := a.rejections(); rej != "" {
			what += "; " + rej
		}
		err := waitError(ctx, "connect", start, s.timeout, missing, what)
		abortLinks(links, tableMsg{Abort: "root " + err.Error(), Missing: missing})
		return nil, s.errorf("%w", err)
	}
	table := tableMsg{Addrs: make([]string, s.size)}
	for r, a := range a.addrs {
		table.Addrs[r] = a
	}
	deadline := time.Now().Add(s.timeout)
	for r, l := range links {
		if l == nil {
			continue
		}
		err := within(ctx, l.conn.SetDeadline, deadline, func() error { return writeMsg(l.conn, table) })
		if err != nil {
			err = s.errorf("connect: sending the address table to rank %d: %w", r, err)
			abortLinks(links, tableMsg{Abort: err.Error()})
			return nil, err
		}
	}
	return links, nil
}

// rootListenAddr is where rank 0 listens. A loopback root address is used as
// is (single host; nothing exposed). Otherwise rank 0 listens on every
// interface at that port, as torch's TCPStore does: the name the others dial
// (a Kubernetes service, a hostname mapped to 127.0.1.1) often is not an
// address rank 0 could bind. Config.ListenHost pins it instead.
func (s *setup) rootListenAddr() string {
	host, port, _ := net.SplitHostPort(s.cfg.RootAddr) // validated by Connect
	switch {
	case s.cfg.ListenHost != "":
		return net.JoinHostPort(s.cfg.ListenHost, port)
	case host == "localhost":
		return s.cfg.RootAddr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return s.cfg.RootAddr
	}
	return net.JoinHostPort("", port)
}

// abortLinks tells registered ranks why the root gives up, so their errors
// say so instead of "connection closed", then closes the links.
func abortLinks(links []*tcpLink, why tableMsg) {
	deadline := time.Now().Add(time.Second)
	for _, l := range links {
		if l != nil {
			l.conn.SetDeadline(deadline)
			writeMsg(l.conn, why)
		}
	}
	closeLinks(links)
}

func rankRange(lo, hi int) []int {
	var r []int
	for i := lo; i < hi; i++ {
		r = append(r, i)
	}
	return r
}

// nonRoot registers with the root, waits for the table and builds its part of
// the mesh: it accepts from lower non-root ranks and dials higher ones, so
// every pair gets exactly one connection.
func (s *setup) nonRoot(ctx context.Context) (_ []*tcpLink, err error) {
	start := time.Now()
	deadline := start.Add(s.timeout)
	rootAddr := s.cfg.RootAddr
	c0, err := dialRetry(ctx, rootAddr, deadline)
	if err != nil {
		// Name the rank, not only the address: the usual cause is that rank
		// 0 died or was never started, which "connection refused" hides.
		return nil, s.errorf("%w", waitError(ctx, "connect", start, s.timeout, []int{0},
			fmt.Sprintf("the root at %s: rank 0's bootstrap server never accepted (rank 0 not started, dead, or elsewhere; last error: %v)", rootAddr, err)))
	}
	links := make([]*tcpLink, s.size)
	links[0] = &tcpLink{peer: 0, conn: c0, br: bufio.NewReader(c0)}
	var ln net.Listener
	defer func() {
		if ln != nil {
			ln.Close()
		}
		if err != nil {
			closeLinks(links)
		}
	}()
	addr := ""
	if s.rank >= 2 { // ranks 2.. accept from lower non-root ranks
		if ln, addr, err = s.listenPeers(ctx, c0); err != nil {
			return nil, err
		}
	}

	h := helloMsg{Proto: protoName, Kind: kindRegister, ID: s.uid, Rank: s.rank, Size: s.size, Addr: addr}
	if err := handshake(ctx, c0, links[0].br, deadline, h); err != nil {
		if errors.Is(err, ErrRejected) {
			return nil, s.errorf("connect: root at %s rejected this rank: %w", rootAddr, err)
		}
		if isTimeout(err) || ctx.Err() != nil {
			return nil, s.errorf("%w", waitError(ctx, "connect", start, s.timeout, nil, "root at "+rootAddr+" to answer the registration"))
		}
		return nil, s.errorf("connect: registering with root at %s: %w", rootAddr, err)
	}
	addrs, err := s.awaitTable(ctx, links[0], start, deadline)
	if err != nil {
		return nil, err
	}
	return links, s.buildMesh(ctx, ln, addrs, links)
}

// awaitTable waits for the root's second message. It allows a little longer
// than our own deadline: the root started at about the same time, and its
// verdict names the ranks that never registered, which ours could not.
func (s *setup) awaitTable(ctx context.Context, l *tcpLink, start, deadline time.Time) ([]string, error) {
	rootAddr := s.cfg.RootAddr
	grace := min(s.timeout/4, 5*time.Second)
	var tab tableMsg
	err := within(ctx, l.conn.SetDeadline, deadline.Add(grace), func() error { return readMsg(l.br, &tab) })
	switch {
	case err != nil && (isTimeout(err) || ctx.Err() != nil):
		return nil, s.errorf("%w", waitError(ctx, "connect", start, s.timeout, nil,
			"the address table from root at "+rootAddr+", which waits until every rank has registered"))
	case err != nil:
		return nil, s.errorf("connect: %w", &PeerClosedError{Rank: 0, Err: fmt.Errorf("root at %s hung up before sending the address table: %w", rootAddr, err)})
	case len(tab.Missing) > 0:
		return nil, s.errorf("%w", &TimeoutError{Op: "connect", After: time.Since(start).Round(time.Millisecond),
			Ranks: tab.Missing, What: "the root at " + rootAddr + " gave up waiting for them"})
	case tab.Abort != "":
		return nil, s.errorf("connect: %w", &PeerClosedError{Rank: 0, Err: fmt.Errorf("root at %s aborted: %s", rootAddr, tab.Abort)})
	case len(tab.Addrs) != s.size:
		return nil, s.errorf("connect: root at %s sent %d addresses for %d ranks", rootAddr, len(tab.Addrs), s.size)
	}
	return tab.Addrs, nil
}

// listenPeers opens this rank's listener for the mesh and returns the address
// to advertise. By default it listens on the local address of the
// connection to the root: an interface the root reached us through.
func (s *setup) listenPeers(ctx context.Context, c0 net.Conn) (net.Listener, string, error) {
	local := c0.LocalAddr().(*net.TCPAddr).IP
	host := s.cfg.ListenHost
	if host == "" {
		host = local.String()
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, "", s.errorf("listen for peers on %s: %w", host, err)
	}
	la := ln.Addr().(*net.TCPAddr)
	ip := la.IP
	if ip.IsUnspecified() { // "0.0.0.0" is no address to give others
		ip = local
	}
	return ln, net.JoinHostPort(ip.String(), fmt.Sprint(la.Port)), nil
}

// buildMesh connects to every non-root peer within a fresh timeout and fills
// links. A rejection or protocol error ends it at once; otherwise a timeout
// names every peer that did not connect.
func (s *setup) buildMesh(ctx context.Context, ln net.Listener, addrs []string, links []*tcpLink) error {
	start := time.Now()
	deadline := start.Add(s.timeout)
	mctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	type result struct {
		peer int
		link *tcpLink
		err  error
	}
	results := make(chan result)
	n := 0
	for p := s.rank + 1; p < s.size; p++ {
		n++
		go func() {
			l, err := s.dialPeer(mctx, p, addrs[p], deadline)
			if err != nil && mctx.Err() != nil {
				err = errWaitInterrupted // the peer never answered in time
			}
			results <- result{p, l, err}
		}()
	}
	var a *acceptor
	var acceptMissing []int
	acceptDone := make(chan struct{})
	if ln != nil {
		a = newAcceptor(s, kindPeer, rankRange(1, s.rank))
		go func() {
			defer close(acceptDone)
			acceptMissing, _ = a.run(mctx, ln)
		}()
	} else {
		close(acceptDone)
	}

	var firstErr error
	var missing []int
	for ; n > 0; n-- {
		r := <-results
		switch {
		case r.err == nil:
			links[r.peer] = r.link
		case errors.Is(r.err, errWaitInterrupted):
			missing = append(missing, r.peer)
		case firstErr == nil:
			firstErr = r.err
			cancel() // no point waiting for the others
		}
	}
	<-acceptDone
	if a != nil {
		for r, l := range a.got {
			links[r] = l
		}
	}
	missing = append(acceptMissing, missing...) // lower ranks first: both lists are sorted
	switch {
	case firstErr != nil:
		return s.errorf("connect: %w", firstErr)
	case len(missing) > 0:
		what := "to complete the mesh"
		if rej := a.rejectionsOrEmpty(); rej != "" {
			what += "; " + rej
		}
		return s.errorf("%w", waitError(ctx, "connect", start, s.timeout, missing, what))
	}
	return nil
}
