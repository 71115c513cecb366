package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// transport moves one message to another rank. Both implementations (TCP and
// in-process) plug into core, which owns the semantics: validation, queues,
// timeouts, collectives and error wording.
type transport interface {
	// send hands data (not retained) to peer != self. It returns nil, a
	// *PeerClosedError, or errWaitInterrupted when ctx or deadline expired
	// before anything was written.
	send(ctx context.Context, deadline time.Time, peer int, tag int64, data []byte) error
	// close stops goroutines, releases sockets and tells peers we are gone.
	close() error
}

// core implements Bootstrap on top of a transport and the local inbox.
type core struct {
	rank, size int
	uid        string
	timeout    time.Duration
	in         *inbox[[]byte]
	tr         transport

	collMu sync.Mutex // serialises collectives so sequence numbers match across ranks
	seq    int64      // collectives started; collective k uses tag -k

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Bootstrap = (*core)(nil)

func (c *core) Rank() int { return c.rank }
func (c *core) Size() int { return c.size }

// UniqueID is the job id; FDExchanger uses it to name its sockets.
func (c *core) UniqueID() string { return c.uid }

// Timeout is the bound applied to every wait.
func (c *core) Timeout() time.Duration { return c.timeout }

func (c *core) errorf(format string, args ...any) error {
	return fmt.Errorf("bootstrap: rank %d: "+format, append([]any{c.rank}, args...)...)
}

func (c *core) checkPeer(op string, peer, tag int) error {
	if peer < 0 || peer >= c.size {
		return c.errorf("%s: peer %d is outside [0, %d)", op, peer, c.size)
	}
	if tag < 0 {
		return c.errorf("%s: tag %d is negative; negative tags are reserved for collectives", op, tag)
	}
	return nil
}

// finish words the outcome of an operation that waited on missing ranks.
func (c *core) finish(ctx context.Context, op string, start time.Time, err error, missing []int) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errWaitInterrupted):
		return c.errorf("%w", waitError(ctx, op, start, c.timeout, missing, ""))
	default:
		return c.errorf("%s: %w", op, err)
	}
}

// deliver sends one message, including to ourselves, refusing early when the
// peer is already known to be gone.
func (c *core) deliver(ctx context.Context, deadline time.Time, peer int, tag int64, data []byte) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if peer == c.rank {
		if !c.in.push(peer, tag, clone(data)) {
			return ErrClosed
		}
		return nil
	}
	if err := c.in.peerError(peer); err != nil {
		return err
	}
	return c.tr.send(ctx, deadline, peer, tag, data)
}

func (c *core) Send(ctx context.Context, peer, tag int, data []byte) error {
	op := fmt.Sprintf("send to rank %d tag %d", peer, tag)
	if err := c.checkPeer(op, peer, tag); err != nil {
		return err
	}
	if len(data) > MaxMessageSize {
		return c.errorf("%s: %d bytes exceed the %d-byte message limit", op, len(data), MaxMessageSize)
	}
	start := time.Now()
	err := c.deliver(ctx, start.Add(c.timeout), peer, int64(tag), data)
	return c.finish(ctx, op, start, err, []int{peer})
}

func (c *core) Recv(ctx context.Context, peer, tag int) ([]byte, error) {
	op := fmt.Sprintf("recv from rank %d tag %d", peer, tag)
	if err := c.checkPeer(op, peer, tag); err != nil {
		return nil, err
	}
	start := time.Now()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	var msg []byte
	missing, err := c.in.collect(ctx, timer.C, int64(tag), []int{peer}, func(_ int, v []byte) { msg = v })
	if err != nil {
		return nil, c.finish(ctx, op, start, err, missing)
	}
	return msg, nil
}

// Collective kinds, sent as the first payload byte so that ranks calling
// different collectives at the same sequence number fail loudly instead of
// silently pairing a Barrier with an AllGather.
const (
	opAllGather byte = 1
	opBarrier   byte = 2
)

func opName(op byte) string {
	switch op {
	case opAllGather:
		return "allgather"
	case opBarrier:
		return "barrier"
	}
	return fmt.Sprintf("unknown collective %d", op)
}

func (c *core) AllGather(ctx context.Context, mine []byte) ([][]byte, error) {
	if len(mine) >= MaxMessageSize {
		return nil, c.errorf("allgather: %d bytes exceed the %d-byte message limit", len(mine), MaxMessageSize-1)
	}
	return c.gather(ctx, opAllGather, mine)
}

func (c *core) Barrier(ctx context.Context) error {
	_, err := c.gather(ctx, opBarrier, nil)
	return err
}

// gather is everyone-to-everyone: send our contribution to each peer, then
// wait for each peer's. See the package comment for why not a ring.
func (c *core) gather(ctx context.Context, op byte, mine []byte) ([][]byte, error) {
	name := opName(op)
	c.collMu.Lock()
	defer c.collMu.Unlock()
	if c.closed.Load() {
		return nil, c.errorf("%s: %w", name, ErrClosed)
	}
	c.seq++
	seq, tag := c.seq, -c.seq
	start := time.Now()
	deadline := start.Add(c.timeout)
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()

	msg := make([]byte, 1+len(mine))
	msg[0] = op
	copy(msg[1:], mine)
	peers := make([]int, 0, c.size-1)
	var gone error
	for p := 0; p < c.size; p++ {
		if p == c.rank {
			continue
		}
		peers = append(peers, p)
		err := c.deliver(ctx, deadline, p, tag, msg)
		switch {
		case err == nil:
		case errors.Is(err, ErrPeerClosed):
			// Keep going: the live peers should get our part and see the
			// dead rank themselves rather than wait for us.
			if gone == nil {
				gone = err
			}
		default:
			return nil, c.finish(ctx, name, start, err, []int{p})
		}
	}
	if gone != nil {
		return nil, c.finish(ctx, name, start, gone, nil)
	}

	out := make([][]byte, c.size)
	out[c.rank] = msg
	missing, err := c.in.collect(ctx, timer.C, tag, peers, func(p int, v []byte) { out[p] = v })
	if err != nil {
		return nil, c.finish(ctx, name, start, err, missing)
	}
	for p, v := range out {
		if len(v) == 0 || v[0] != op {
			theirs := "nothing"
			if len(v) > 0 {
				theirs = opName(v[0])
			}
			return nil, c.errorf("collective #%d mismatch: this rank called %s but rank %d called %s", seq, name, p, theirs)
		}
		out[p] = v[1:]
	}
	return out, nil
}

func (c *core) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.in.close(ErrClosed)
		if c.tr != nil {
			c.closeErr = c.tr.close()
		}
	})
	return c.closeErr
}

// clone copies b into a new non-nil slice, so that an empty message arrives
// as an empty slice on every transport.
func clone(b []byte) []byte {
	out := make([]byte, len(b))
	copy(out, b)
	return out
}
