package channels

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a pacer's clock that moves only when the pacer sleeps or the
// test says so.
type fakeClock struct {
	mu    sync.Mutex
	t     int64
	step  int64 // ns each reading moves the clock (a spinning wait must see time pass)
	slept []time.Duration
}

func (c *fakeClock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t += c.step
	return c.t
}

func (c *fakeClock) sleep(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.t += int64(d)
}

func fakePacer(t *testing.T, gbps float64) (*pacer, *fakeClock) {
	t.Helper()
	p, err := newPacer(gbps)
	require.NoError(t, err)
	c := &fakeClock{step: 1000}
	p.now, p.sleep = c.now, c.sleep
	return p, c
}

// The rate's arithmetic against a plain model: pieces of paceBytes
// covering the put in order, the k-th issued no earlier than the bytes
// before it take at the rate, and a link that was idle starting at once.
func TestPacerIssuesAtTheRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 2))
	for _, gbps := range []float64{0.1, 1, 12.5, 50, 400, 10000} {
		p, c := fakePacer(t, gbps)
		wantPiece := int(gbps*25e3) / 4096 * 4096
		wantPiece = min(max(wantPiece, 64<<10), 16<<20)
		require.Equal(t, wantPiece, p.piece, "%v GB/s", gbps)
		for range 20 {
			size := rng.IntN(5*p.piece) + 1
			start := c.now()
			var issued []int64
			next := 0
			require.NoError(t, p.write(size, func(off, n int) error {
				require.Equal(t, next, off, "pieces in order, without gaps")
				require.LessOrEqual(t, n, p.piece)
				require.Positive(t, n)
				next = off + n
				issued = append(issued, c.now())
				return nil
			}))
			require.Equal(t, size, next, "the pieces cover the put")
			for k, at := range issued {
				before := float64(min(k*p.piece, size))
				require.GreaterOrEqual(t, float64(at-start), before/gbps-1, "%v GB/s: piece %d of a %d-byte put", gbps, k, size)
			}
			// The link is idle once the last piece's time has passed.
			c.sleep(time.Duration(float64(size)/gbps) + time.Millisecond)
		}
	}
}

// A zero-byte put is still issued (a put with a signal carries the signal).
func TestPacerZeroBytes(t *testing.T) {
	p, _ := fakePacer(t, 50)
	calls := 0
	require.NoError(t, p.write(0, func(off, n int) error {
		require.Zero(t, off)
		require.Zero(t, n)
		calls++
		return nil
	}))
	require.Equal(t, 1, calls)
}

// Proxies of one rank share the pacer: concurrent reservations never
// overlap, and together they book exactly their bytes' time.
func TestPacerSharedByProxies(t *testing.T) {
	p, c := fakePacer(t, 10)
	c.mu.Lock()
	c.t = 1 << 40 // far from zero, and still: reservations after the first start at next, not now
	c.step = 0
	c.mu.Unlock()
	const workers, each, n = 8, 200, 100_000
	var mu sync.Mutex
	var starts []int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				s := p.reserve(n)
				mu.Lock()
				starts = append(starts, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	d := int64(n / 10) // 100,000 bytes at 10 GB/s: 10 us
	seen := map[int64]bool{}
	for _, s := range starts {
		require.False(t, seen[s], "two reservations start at %d", s)
		seen[s] = true
	}
	lo := starts[0]
	for _, s := range starts {
		lo = min(lo, s)
	}
	require.Equal(t, lo+workers*each*d, p.next.Load(), "booked time is the sum of the reservations")
	for _, s := range starts {
		require.Zero(t, (s-lo)%d, "reservations tile the link")
	}
}

// Rates outside 0.1-10000 GB/s are refused, 0 is off.
func TestPacerRates(t *testing.T) {
	p, err := newPacer(0)
	require.NoError(t, err)
	require.Nil(t, p)
	for _, bad := range []float64{-1, 0.05, 10001, 1e300} {
		_, err := newPacer(bad)
		require.ErrorContains(t, err, "want 0 (off) or 0.1 to 10000 GB/s", "%v", bad)
	}
}

// pacedConn records the proxy's writes.
type pacedConn struct {
	Connection
	network bool
	writes  [][2]int // [dstOff, size]
}

func (k *pacedConn) overNetwork() bool { return k.network }

func (k *pacedConn) Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if dstOff-srcOff != 1000 {
		panic("source and destination offsets moved apart")
	}
	k.writes = append(k.writes, [2]int{dstOff, size})
	return nil
}

// The proxy paces writes to peers on other nodes only, and a paced put
// reaches the connection as its pieces, in order.
func TestProxyPacesNetworkPuts(t *testing.T) {
	p, _ := fakePacer(t, 0.1) // pieces of 64 KiB
	prox := &Proxy{c: &Communicator{}}
	prox.c.net.pace = p
	local, remote := &pacedConn{}, &pacedConn{network: true}
	const size = 200_000
	require.NoError(t, prox.write(local, RegisteredMemory{}, 1500, RegisteredMemory{}, 500, size))
	require.NoError(t, prox.write(remote, RegisteredMemory{}, 1500, RegisteredMemory{}, 500, size))
	require.Equal(t, [][2]int{{1500, size}}, local.writes)
	require.Equal(t, [][2]int{{1500, 65536}, {1500 + 65536, 65536}, {1500 + 131072, 65536}, {1500 + 196608, size - 196608}}, remote.writes)

	// No pacer: one write.
	prox.c.net.pace = nil
	remote.writes = nil
	require.NoError(t, prox.write(remote, RegisteredMemory{}, 1500, RegisteredMemory{}, 500, size))
	require.Equal(t, [][2]int{{1500, size}}, remote.writes)
}

// On the real clock a paced write takes at least its bytes' time (minus
// the first piece, issued at once).
func TestPacerRealClock(t *testing.T) {
	p, err := newPacer(0.1)
	require.NoError(t, err)
	const size = 1 << 20
	start := time.Now()
	pieces := 0
	require.NoError(t, p.write(size, func(off, n int) error { pieces++; return nil }))
	elapsed := time.Since(start)
	require.Equal(t, 16, pieces)
	require.GreaterOrEqual(t, elapsed, time.Duration(float64(size-p.piece)/0.1))
}
