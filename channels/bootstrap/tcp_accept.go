package bootstrap

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
)

// acceptor collects the handshakes this rank expects on a listener: at the
// root, a registration from every other rank; elsewhere, a mesh connection
// from every lower non-root rank. Anything else that connects (another job,
// a port scanner, a duplicate rank) is answered with the reason and dropped,
// and we keep waiting for the real one.
type acceptor struct {
	s      *setup
	kind   string
	expect map[int]bool // ranks that should connect

	mu       sync.Mutex
	claimed  map[int]bool
	got      map[int]*tcpLink
	addrs    map[int]string    // Addr from each registration
	inflight map[net.Conn]bool // handshakes in progress, closed when we stop
	stopped  bool
	rejected []string
	full     chan struct{} // closed once every expected rank is in
}

func newAcceptor(s *setup, kind string, ranks []int) *acceptor {
	a := &acceptor{
		s: s, kind: kind, expect: map[int]bool{},
		claimed: map[int]bool{}, got: map[int]*tcpLink{}, addrs: map[int]string{},
		inflight: map[net.Conn]bool{}, full: make(chan struct{}),
	}
	for _, r := range ranks {
		a.expect[r] = true
	}
	if len(ranks) == 0 {
		close(a.full)
	}
	return a
}

// run accepts until every expected rank has completed its handshake or ctx
// ends, then closes ln and any half-done handshake. On failure it returns the
// ranks still missing. Successful links are in a.got either way; the caller
// owns (and on failure closes) them.
func (a *acceptor) run(ctx context.Context, ln net.Listener) (missing []int, ok bool) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // ln closed below
			}
			if !a.track(c) {
				c.Close()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.handle(ctx, c)
			}()
		}
	}()
	select {
	case <-a.full:
		ok = true
	case <-ctx.Done():
	}
	ln.Close()
	a.mu.Lock()
	a.stopped = true
	for c := range a.inflight {
		c.Close()
	}
	a.mu.Unlock()
	wg.Wait()
	return a.missing(), ok
}

func (a *acceptor) track(c net.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return false
	}
	a.inflight[c] = true
	return true
}

func (a *acceptor) missing() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var m []int
	for r := range a.expect {
		if a.got[r] == nil {
			m = append(m, r)
		}
	}
	sort.Ints(m)
	return m
}

// rejections summarises refused handshakes for timeout messages: a stray with
// the wrong unique id is the usual reason a rank "never arrives".
func (a *acceptor) rejections() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.rejected) == 0 {
		return ""
	}
	const show = 3
	r := a.rejected
	more := ""
	if len(r) > show {
		more = fmt.Sprintf("; and %d more", len(r)-show)
		r = r[:show]
	}
	return fmt.Sprintf("rejected %d handshake(s): %s%s", len(a.rejected), strings.Join(r, "; "), more)
}

// handle runs one handshake. The reply is written before the rank counts as
// arrived, so a rank that got "ok" is really in.
func (a *acceptor) handle(ctx context.Context, c net.Conn) {
	br := bufio.NewReader(c)
	var h helloMsg
	deadline, _ := ctx.Deadline()
	err := within(ctx, c.SetDeadline, deadline, func() error { return readMsg(br, &h) })
	if err != nil {
		a.drop(c, fmt.Sprintf("%s: %v", c.RemoteAddr(), err))
		return
	}
	if reason := a.claim(h); reason != "" {
		within(ctx, c.SetDeadline, deadline, func() error { return writeMsg(c, replyMsg{Error: reason}) })
		a.drop(c, fmt.Sprintf("%s (claiming rank %d): %s", c.RemoteAddr(), h.Rank, reason))
		return
	}
	err = within(ctx, c.SetDeadline, deadline, func() error { return writeMsg(c, replyMsg{}) })
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.inflight, c)
	if err != nil || a.stopped {
		delete(a.claimed, h.Rank)
		c.Close()
		return
	}
	a.got[h.Rank] = &tcpLink{peer: h.Rank, conn: c, br: br}
	a.addrs[h.Rank] = h.Addr
	if len(a.got) == len(a.expect) {
		close(a.full)
	}
}

func (a *acceptor) drop(c net.Conn, why string) {
	c.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.inflight, c)
	a.rejected = append(a.rejected, why)
}

// claim validates a hello and reserves its rank; it returns the reason for a
// rejection, worded for the rejected process.
func (a *acceptor) claim(h helloMsg) string {
	s := a.s
	switch {
	case h.Proto != protoName:
		return fmt.Sprintf("protocol %q, rank %d speaks %q", h.Proto, s.rank, protoName)
	case h.Kind != a.kind:
		return fmt.Sprintf("rank %d expected a %q handshake here, got %q", s.rank, a.kind, h.Kind)
	case h.ID != s.uid:
		return fmt.Sprintf("unique id mismatch: rank %d belongs to job %s, you sent %s", s.rank, s.uid, h.ID)
	case h.Size != s.size:
		return fmt.Sprintf("size mismatch: rank %d has size %d, you sent %d", s.rank, s.size, h.Size)
	case !a.expect[h.Rank]:
		return fmt.Sprintf("rank %d did not expect a %s handshake from rank %d", s.rank, a.kind, h.Rank)
	case a.kind == kindRegister && h.Rank >= 2 && h.Addr == "":
		return fmt.Sprintf("rank %d registered without a listen address", h.Rank)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.claimed[h.Rank] {
		return fmt.Sprintf("duplicate rank: rank %d already connected to rank %d", h.Rank, s.rank)
	}
	a.claimed[h.Rank] = true
	return ""
}

func (a *acceptor) rejectionsOrEmpty() string {
	if a == nil {
		return ""
	}
	return a.rejections()
}
