package bootstrap

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTCPRootStartsLast(t *testing.T) {
	checkLeaks(t)
	const size = 8
	addr, id := freeAddr(t), NewUniqueID()
	bs := make([]Bootstrap, size)
	errs := forAll(size, func(r int) error {
		if r == 0 {
			time.Sleep(500 * time.Millisecond) // the others are already retrying
		}
		var err error
		bs[r], err = Connect(context.Background(), Config{Rank: r, Size: size, RootAddr: addr, UniqueID: id, Timeout: 10 * time.Second})
		return err
	})
	defer closeAll(t, bs)
	requireAllOK(t, errs)
	requireAllOK(t, forAll(size, func(r int) error { return bs[r].Barrier(context.Background()) }))
}

// TestTCPOneConnectionPerPair checks the mesh: every pair has exactly one
// connection, seen from both ends.
func TestTCPOneConnectionPerPair(t *testing.T) {
	checkLeaks(t)
	const size = 5
	bs := connectTCP(t, size, 10*time.Second)
	defer closeAll(t, bs)
	links := func(r int) []*tcpLink { return bs[r].(*core).tr.(*tcpTransport).links }
	for i := range size {
		require.Nil(t, links(i)[i])
		for j := range size {
			if i == j {
				continue
			}
			a, b := links(i)[j], links(j)[i]
			require.NotNil(t, a, "link %d->%d", i, j)
			require.Equal(t, a.conn.LocalAddr().String(), b.conn.RemoteAddr().String(), "pair %d,%d", i, j)
			require.Equal(t, a.conn.RemoteAddr().String(), b.conn.LocalAddr().String(), "pair %d,%d", i, j)
		}
	}
}

func TestTCPUnreachableRoot(t *testing.T) {
	checkLeaks(t)
	addr := freeAddr(t) // closed port: connection refused every time
	start := time.Now()
	_, err := Connect(context.Background(), Config{Rank: 1, Size: 2, RootAddr: addr, UniqueID: NewUniqueID(), Timeout: time.Second})
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ErrTimeout)
	requireMentions(t, err, "rank 1:", "root at "+addr, "refused")
	require.GreaterOrEqual(t, elapsed, 900*time.Millisecond, "it should keep retrying")
	require.Less(t, elapsed, 1500*time.Millisecond, "but stop at the timeout")
}

func TestTCPTimeoutFromEnvironment(t *testing.T) {
	checkLeaks(t)
	t.Setenv(TimeoutEnv, "300ms")
	start := time.Now()
	_, err := Connect(context.Background(), Config{Rank: 1, Size: 2, RootAddr: freeAddr(t), UniqueID: NewUniqueID()})
	require.ErrorIs(t, err, ErrTimeout)
	require.Less(t, time.Since(start), time.Second)
	requireMentions(t, err, "after 300ms")

	t.Setenv(TimeoutEnv, "soon")
	_, err = Connect(context.Background(), Config{Rank: 1, Size: 2, RootAddr: freeAddr(t), UniqueID: NewUniqueID()})
	requireMentions(t, err, TimeoutEnv, `"soon"`)
}

func TestTCPConnectCanceled(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Connect(ctx, Config{Rank: 1, Size: 2, RootAddr: freeAddr(t), UniqueID: NewUniqueID(), Timeout: 10 * time.Second})
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, time.Since(start), time.Second)
}

func TestTCPRankNeverArrives(t *testing.T) {
	checkLeaks(t)
	const size = 4
	addr, id := freeAddr(t), NewUniqueID()
	start := time.Now()
	errs := forAll(size-1, func(r int) error { // rank 3 never starts
		b, err := Connect(context.Background(), Config{Rank: r, Size: size, RootAddr: addr, UniqueID: id, Timeout: time.Second})
		if err == nil {
			b.Close()
		}
		return err
	})
	require.Less(t, time.Since(start), 2*time.Second)
	for r, err := range errs {
		require.ErrorIs(t, err, ErrTimeout, "rank %d", r)
		requireMentions(t, err, fmt.Sprintf("rank %d:", r), "waiting for ranks [3]")
	}
	requireMentions(t, errs[0], "connect timed out after 1s waiting for ranks [3]")
}

func TestTCPMismatchedUniqueIDRejected(t *testing.T) {
	checkLeaks(t)
	addr, id := freeAddr(t), NewUniqueID()
	start := time.Now()
	errs := forAll(2, func(r int) error {
		cfg := Config{Rank: r, Size: 2, RootAddr: addr, UniqueID: id, Timeout: time.Second}
		if r == 1 {
			cfg.UniqueID = NewUniqueID()
		}
		b, err := Connect(context.Background(), cfg)
		if err == nil {
			b.Close()
		}
		return err
	})
	// The impostor learns why at once.
	require.ErrorIs(t, errs[1], ErrRejected)
	requireMentions(t, errs[1], "rank 1:", "rejected", "unique id mismatch", id)
	// The root keeps waiting for the real rank 1, then says what it turned away.
	require.ErrorIs(t, errs[0], ErrTimeout)
	requireMentions(t, errs[0], "waiting for ranks [1]", "rejected 1 handshake(s)", "unique id mismatch")
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestTCPMismatchedSizeAndDuplicateRank(t *testing.T) {
	checkLeaks(t)
	addr, id := freeAddr(t), NewUniqueID()
	cfg := func(r, size int) Config {
		return Config{Rank: r, Size: size, RootAddr: addr, UniqueID: id, Timeout: 5 * time.Second}
	}
	type result struct {
		b   Bootstrap
		err error
	}
	connect := func(c Config) chan result {
		ch := make(chan result, 1)
		go func() {
			b, err := Connect(context.Background(), c)
			ch <- result{b, err}
		}()
		return ch
	}
	root := connect(cfg(0, 3))
	first := connect(cfg(1, 3))
	time.Sleep(300 * time.Millisecond) // let the real rank 1 register first
	dup := <-connect(cfg(1, 3))
	require.ErrorIs(t, dup.err, ErrRejected)
	requireMentions(t, dup.err, "duplicate rank")
	wrongSize := <-connect(cfg(2, 4))
	require.ErrorIs(t, wrongSize.err, ErrRejected)
	requireMentions(t, wrongSize.err, "size mismatch", "has size 3, you sent 4")

	// The job still completes once the real rank 2 comes.
	last := connect(cfg(2, 3))
	var bs []Bootstrap
	for _, ch := range []chan result{root, first, last} {
		res := <-ch
		require.NoError(t, res.err)
		bs = append(bs, res.b)
	}
	defer closeAll(t, bs)
	requireAllOK(t, forAll(3, func(r int) error { return bs[r].Barrier(context.Background()) }))
}

// TestTCPStrayConnections checks that garbage on the root port is refused
// without disturbing the job.
func TestTCPStrayConnections(t *testing.T) {
	checkLeaks(t)
	const size = 3
	addr, id := freeAddr(t), NewUniqueID()
	bs := make([]Bootstrap, size)
	errs := forAll(size+2, func(r int) error {
		switch r {
		case size: // an HTTP client
			time.Sleep(100 * time.Millisecond)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil // the job may already be done
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
			c.Read(make([]byte, 100))
			return nil
		case size + 1: // a silent client
			time.Sleep(100 * time.Millisecond)
			if c, err := net.Dial("tcp", addr); err == nil {
				defer c.Close()
				c.Read(make([]byte, 100))
			}
			return nil
		case 2:
			time.Sleep(300 * time.Millisecond)
		}
		var err error
		bs[r], err = Connect(context.Background(), Config{Rank: r, Size: size, RootAddr: addr, UniqueID: id, Timeout: 5 * time.Second})
		return err
	})
	defer closeAll(t, bs)
	requireAllOK(t, errs)
}

// TestTCPAbruptReset simulates a crashed process: its sockets are reset
// (SO_LINGER 0) without a goodbye, and nothing on its side is closed cleanly.
func TestTCPAbruptReset(t *testing.T) {
	checkLeaks(t)
	const size, victim = 4, 2
	bs := connectTCP(t, size, 20*time.Second)
	defer closeAll(t, bs)
	time.AfterFunc(100*time.Millisecond, func() {
		for _, l := range bs[victim].(*core).tr.(*tcpTransport).links {
			if l != nil {
				l.conn.(*net.TCPConn).SetLinger(0)
				l.conn.Close()
			}
		}
	})
	start := time.Now()
	errs := forAll(size, func(r int) error {
		if r == victim {
			return nil
		}
		return bs[r].Barrier(context.Background())
	})
	require.Less(t, time.Since(start), 2*time.Second)
	for r, err := range errs {
		if r != victim {
			require.ErrorIs(t, err, ErrPeerClosed, "rank %d", r)
			requireMentions(t, err, "peer rank 2 is gone")
		}
	}
}

func TestTCPConfigErrors(t *testing.T) {
	ctx := context.Background()
	id := NewUniqueID()
	_, err := Connect(ctx, Config{Rank: 2, Size: 2, RootAddr: "127.0.0.1:1", UniqueID: id})
	requireMentions(t, err, "rank 2 is outside [0, 2)")
	_, err = Connect(ctx, Config{Rank: 0, Size: 2, RootAddr: "127.0.0.1:1"})
	requireMentions(t, err, "UniqueID is empty")
	_, err = Connect(ctx, Config{Rank: 0, Size: 2, RootAddr: "nowhere", UniqueID: id})
	requireMentions(t, err, `root address "nowhere" is not host:port`)
	_, err = Connect(ctx, Config{Rank: 0, Size: 2, RootAddr: "127.0.0.1:1", UniqueID: id, Timeout: -time.Second})
	requireMentions(t, err, "negative")
	// The root port is taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = Connect(ctx, Config{Rank: 0, Size: 2, RootAddr: ln.Addr().String(), UniqueID: id, Timeout: time.Second})
	requireMentions(t, err, "rank 0: listen on root address "+ln.Addr().String())
}

func TestUniqueID(t *testing.T) {
	a, b := NewUniqueID(), NewUniqueID()
	require.Len(t, a, 32)
	require.NotEqual(t, a, b)
	require.NoError(t, validateUniqueID(a))
	d := DeriveUniqueID("10.0.0.1", 29500, "run-7")
	require.Len(t, d, 32)
	require.Equal(t, d, DeriveUniqueID("10.0.0.1", 29500, "run-7"))
	require.NotEqual(t, d, DeriveUniqueID("10.0.0.1", 29500, "run-8"))
	require.NotEqual(t, d, DeriveUniqueID("10.0.0.1", 29501, "run-7"))
	require.Error(t, validateUniqueID("has space"))
}
