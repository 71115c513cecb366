package bootstrap

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"time"
)

// keepAlive makes a peer whose host vanished (no FIN, no RST) show up as a
// broken connection in about 20 s instead of the kernel's default minutes.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3}

// dialRetry dials addr until it answers or the deadline passes: the process
// behind it may simply not have started yet. Attempts back off exponentially
// with jitter so that many ranks do not knock on the root in lockstep. On
// failure it returns the last dial error.
func dialRetry(ctx context.Context, addr string, deadline time.Time) (net.Conn, error) {
	delay := 10 * time.Millisecond
	var last error
	for {
		d := net.Dialer{Deadline: deadline, KeepAliveConfig: keepAlive}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		// "connection refused" says more than the "i/o timeout" of an attempt
		// cut short by our own deadline.
		if last == nil || !isTimeout(err) {
			last = err
		}
		rem := time.Until(deadline)
		if ctx.Err() != nil || rem <= 0 {
			return nil, last
		}
		sleep := delay/2 + rand.N(delay/2+1)
		if sleep >= rem {
			sleep = rem
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, last
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			return nil, last
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// handshake sends hello on a fresh connection and reads the reply.
func handshake(ctx context.Context, c net.Conn, br *bufio.Reader, deadline time.Time, h helloMsg) error {
	var rep replyMsg
	err := within(ctx, c.SetDeadline, deadline, func() error {
		if err := writeMsg(c, h); err != nil {
			return err
		}
		return readMsg(br, &rep)
	})
	if err != nil {
		return err
	}
	if rep.Error != "" {
		return fmt.Errorf("%s: %w", rep.Error, ErrRejected)
	}
	return nil
}

// dialPeer connects to a higher rank's listener and identifies us.
func (s *setup) dialPeer(ctx context.Context, peer int, addr string, deadline time.Time) (*tcpLink, error) {
	c, err := dialRetry(ctx, addr, deadline)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	h := helloMsg{Proto: protoName, Kind: kindPeer, ID: s.uid, Rank: s.rank, Size: s.size}
	if err := handshake(ctx, c, br, deadline, h); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake with rank %d at %s: %w", peer, addr, err)
	}
	return &tcpLink{peer: peer, conn: c, br: br}, nil
}
