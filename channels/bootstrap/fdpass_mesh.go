//go:build linux

package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"syscall"
	"time"
)

// fdHello opens each exchanger connection; the names tie it to one exchanger
// instance on each side.
type fdHello struct {
	Rank int    `json:"rank"`
	From string `json:"from"`
	To   string `json:"to"`
}

// connectHost links this rank with every same-host rank: it accepts from the
// lower ones and dials the higher ones, concurrently so that chains of dials
// cannot deadlock.
func (x *FDExchanger) connectHost(ctx context.Context) error {
	start := time.Now()
	deadline := start.Add(x.timeout)
	var lower, higher []int
	for r := range x.size {
		if r != x.rank && x.sameHost(r) {
			if r < x.rank {
				lower = append(lower, r)
			} else {
				higher = append(higher, r)
			}
		}
	}
	actx, stopAccept := context.WithCancel(ctx)
	defer stopAccept()
	acceptErr := make(chan error, 1)
	go func() {
		acceptErr <- within(actx, x.ln.SetDeadline, deadline, func() error { return x.acceptLower(actx, lower, deadline) })
	}()
	dialErr := x.dialHigher(ctx, higher, deadline)
	if dialErr != nil {
		stopAccept() // we are failing anyway
	}
	aErr := <-acceptErr
	var missing []int
	for _, r := range append(lower, higher...) {
		if x.links[r] == nil {
			missing = append(missing, r)
		}
	}
	sort.Ints(missing)
	for _, err := range []error{dialErr, aErr} {
		if err != nil && !isTimeout(err) && ctx.Err() == nil {
			return x.errorf("fd exchanger: %w", err)
		}
	}
	if len(missing) > 0 {
		return x.errorf("%w", waitError(ctx, "fd exchanger setup", start, x.timeout, missing, ""))
	}
	return nil
}

func (x *FDExchanger) dialHigher(ctx context.Context, higher []int, deadline time.Time) error {
	me := x.peers[x.rank].Name
	for _, r := range higher {
		d := net.Dialer{Deadline: deadline}
		c, err := d.DialContext(ctx, "unixpacket", x.peers[r].Name)
		if err != nil {
			return fmt.Errorf("connect to rank %d at %s: %w", r, x.peers[r].Name, err)
		}
		uc := c.(*net.UnixConn)
		err = within(ctx, uc.SetDeadline, deadline, func() error {
			hello, _ := json.Marshal(fdHello{Rank: x.rank, From: me, To: x.peers[r].Name})
			if _, err := uc.Write(hello); err != nil {
				return err
			}
			buf := make([]byte, 512)
			n, err := uc.Read(buf)
			if err != nil {
				return err
			}
			if reply := string(buf[:n]); reply != "ok" {
				return fmt.Errorf("rank %d refused the connection: %s: %w", r, reply, ErrRejected)
			}
			return nil
		})
		if err != nil {
			uc.Close()
			return fmt.Errorf("handshake with rank %d: %w", r, err)
		}
		x.links[r] = &fdLink{peer: r, conn: uc}
	}
	return nil
}

// acceptLower accepts until every lower same-host rank is connected. A
// connection that fails the checks is refused and the wait goes on.
func (x *FDExchanger) acceptLower(ctx context.Context, lower []int, deadline time.Time) error {
	want := map[int]bool{}
	for _, r := range lower {
		want[r] = true
	}
	for len(want) > 0 {
		c, err := x.ln.AcceptUnix()
		if err != nil {
			return err
		}
		r, err := x.admit(ctx, c, want, deadline)
		if err != nil {
			c.Close()
			if isTimeout(err) {
				return err
			}
			continue
		}
		delete(want, r)
		x.links[r] = &fdLink{peer: r, conn: c}
	}
	return nil
}

func (x *FDExchanger) admit(ctx context.Context, c *net.UnixConn, want map[int]bool, deadline time.Time) (int, error) {
	var rank int
	err := within(ctx, c.SetDeadline, deadline, func() error {
		buf := make([]byte, 1024)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		var h fdHello
		reason := ""
		if err := json.Unmarshal(buf[:n], &h); err != nil {
			reason = "malformed hello"
		} else {
			reason = x.vet(c, h, want)
		}
		if reason != "" {
			c.Write([]byte(reason))
			return errors.New(reason)
		}
		rank = h.Rank
		_, err = c.Write([]byte("ok"))
		return err
	})
	return rank, err
}

// vet checks that the connecting process is the rank it claims to be.
func (x *FDExchanger) vet(c *net.UnixConn, h fdHello, want map[int]bool) string {
	if h.Rank < 0 || h.Rank >= x.size || !want[h.Rank] {
		return fmt.Sprintf("rank %d does not expect a connection from rank %d", x.rank, h.Rank)
	}
	p := x.peers[h.Rank]
	if h.From != p.Name || h.To != x.peers[x.rank].Name {
		return "connection for another exchanger instance"
	}
	cred, err := peerCred(c)
	if err != nil {
		return fmt.Sprintf("cannot identify the peer process: %v", err)
	}
	if p.PidNS == x.peers[x.rank].PidNS {
		if int(cred.Pid) != p.Pid {
			return fmt.Sprintf("process %d claims rank %d, which is process %d", cred.Pid, h.Rank, p.Pid)
		}
	} else if int(cred.Uid) != p.Uid {
		return fmt.Sprintf("user %d claims rank %d, which runs as user %d", cred.Uid, h.Rank, p.Uid)
	}
	return ""
}

func peerCred(c *net.UnixConn) (*syscall.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}
