package channels

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeBatcher records what the proxy issues and claims batches in flight
// as told.
type fakeBatcher struct {
	Connection
	inFlight int
	batches  [][]batchedWrite
}

func (f *fakeBatcher) writeBatch(ws []batchedWrite) error {
	f.batches = append(f.batches, append([]batchedWrite(nil), ws...))
	return nil
}

func (f *fakeBatcher) batchesInFlight() (int, error) { return f.inFlight, nil }

// hostMem is registered-looking memory at a fixed address, for span checks.
func hostMem(ptr uintptr, size int) RegisteredMemory {
	return RegisteredMemory{r: &region{base: ptr, size: size}, size: size}
}

func batchProxy() *Proxy {
	return &Proxy{c: &Communicator{}, cfg: ProxyConfig{MaxPending: 1 << 20}, pending: map[Connection]int{},
		marks: map[Connection]int{}, batching: true}
}

// Puts gather while the connection has batchesAhead batches in flight, go
// out as one batch when one lands, and a write whose destination overlaps
// a gathered write's destination or source (or whose source overlaps a
// gathered destination) starts a new batch: a batch's writes land in no
// particular order.
func TestProxyGathersPuts(t *testing.T) {
	p := batchProxy()
	a, b := &fakeBatcher{inFlight: batchesAhead}, &fakeBatcher{inFlight: batchesAhead}
	src, dst := hostMem(0x10000, 1<<20), hostMem(0x200000, 1<<20)
	w := func(dstOff, srcOff, n int) batchedWrite {
		return batchedWrite{dst: dst, src: src, dstOff: dstOff, srcOff: srcOff, n: n}
	}
	put := func(c *fakeBatcher, x batchedWrite) {
		t.Helper()
		require.NoError(t, p.gather(c, x))
		require.NoError(t, p.issueIfAhead(c))
	}
	put(a, w(0, 0, 100))
	put(a, w(100, 0, 100)) // the same source twice: reads may overlap
	put(b, w(0, 0, 100))   // another connection: its own batch
	require.Empty(t, a.batches, "held: two batches in flight")
	put(a, w(150, 500, 10)) // overlaps the second destination: a new batch
	require.Equal(t, [][]batchedWrite{{w(0, 0, 100), w(100, 0, 100)}}, a.batches)
	// A source inside a gathered destination: a new batch again.
	put(a, batchedWrite{dst: dst, src: dst, dstOff: 300, srcOff: 155, n: 4})
	require.Len(t, a.batches, 2)
	require.Equal(t, []batchedWrite{w(150, 500, 10)}, a.batches[1])

	// Nothing lands: issueReady keeps both open.
	require.NoError(t, p.issueReady())
	require.Len(t, a.batches, 2)
	require.Empty(t, b.batches)
	b.inFlight = 1
	require.NoError(t, p.issueReady())
	require.Equal(t, [][]batchedWrite{{w(0, 0, 100)}}, b.batches)
	require.Len(t, p.open, 1)

	// With room ahead a put goes at once.
	a.inFlight = 0
	put(a, w(400, 0, 8))
	require.Len(t, a.batches, 3)
	require.Equal(t, []batchedWrite{{dst: dst, src: dst, dstOff: 300, srcOff: 155, n: 4}, w(400, 0, 8)}, a.batches[2])
	require.Empty(t, p.open)
	require.Equal(t, 3, p.pending[a], "each batch counts as one operation")

	// A full batch goes out before the next write joins.
	a.inFlight = batchesAhead
	for i := range maxBatchWrites + 1 {
		put(a, w(8*i, 0, 8))
	}
	require.Len(t, a.batches, 4)
	require.Len(t, a.batches[3], maxBatchWrites)
	require.NoError(t, p.issueAll())
	require.Len(t, a.batches, 5)
	require.Equal(t, []batchedWrite{w(8*maxBatchWrites, 0, 8)}, a.batches[4])
	require.Empty(t, p.open)
}

// No batching with $GOEP_PROXY_BATCH=off, nor on a connection whose puts
// the pacer cuts (EmulatedGBps over the network); a bad value is refused.
func TestProxyBatchSwitch(t *testing.T) {
	p := batchProxy()
	conn := &fakeBatcherNet{fakeBatcher: fakeBatcher{}, network: true}
	require.NotNil(t, p.batcher(conn))
	p.c.net.pace, _ = newPacer(50)
	require.Nil(t, p.batcher(conn))
	conn.network = false
	require.NotNil(t, p.batcher(conn), "local connections are not paced")
	p.batching = false
	require.Nil(t, p.batcher(conn))

	for v, want := range map[string]bool{"": true, "on": true, " OFF ": false, "0": false} {
		t.Setenv(proxyBatchEnv, v)
		got, err := proxyBatchFromEnv()
		require.NoError(t, err, v)
		require.Equal(t, want, got, v)
	}
	t.Setenv(proxyBatchEnv, "sometimes")
	_, err := proxyBatchFromEnv()
	require.ErrorContains(t, err, "GOEP_PROXY_BATCH")
}

type fakeBatcherNet struct {
	fakeBatcher
	network bool
}

func (f *fakeBatcherNet) overNetwork() bool { return f.network }
