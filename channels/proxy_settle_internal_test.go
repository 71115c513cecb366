package channels

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeSettler is a connection whose queue is settled or not as told.
type fakeSettler struct {
	Connection
	done bool
}

func (f *fakeSettler) settled() bool { return f.done }

// fakeConn is a connection that cannot tell.
type fakeConn struct{ Connection }

// The proxy's flow control forgets only the counts of connections that
// report every queued operation landed; a connection that cannot tell
// (TCP bounds its own queues, the host backend's copies are done when
// issued) keeps its count until the bound's flush.
func TestProxyForgetsSettledWork(t *testing.T) {
	idle, busy := &fakeSettler{done: true}, &fakeSettler{}
	var plain Connection = &fakeConn{}
	p := &Proxy{pending: map[Connection]int{idle: 40, busy: 50, plain: 60}}
	p.forgetSettled()
	require.Equal(t, map[Connection]int{busy: 50, plain: 60}, p.pending)
	busy.done = true
	p.forgetSettled()
	require.Equal(t, map[Connection]int{plain: 60}, p.pending)
}

// fakeWindowed records the proxy's marks, waits and flushes, and which
// operation (its count of queued work) each mark and wait came after.
type fakeWindowed struct {
	Connection
	queued         int
	markedAt       int
	landed         int // work known to have landed (waited for)
	marks, flushes int
}

func (f *fakeWindowed) mark() error     { f.marks++; f.markedAt = f.queued; return nil }
func (f *fakeWindowed) waitMark() error { f.landed = f.markedAt; return nil }
func (f *fakeWindowed) Flush() error    { f.flushes++; f.landed = f.queued; return nil }

// A windowed connection (CUDA IPC) is never flushed for flow control: at
// the bound the proxy waits for the mark it recorded half a bound earlier,
// so at most MaxPending operations are ever in flight and the newer half
// stays queued (the copy engine never idles for it). Checked against a
// plain count of queued and landed work over random batch sizes.
func TestProxyWindowKeepsHalfQueued(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, bound := range []int{1, 2, 3, 8, 64} {
		f := &fakeWindowed{}
		p := &Proxy{cfg: ProxyConfig{MaxPending: bound}, pending: map[Connection]int{}, marks: map[Connection]int{}}
		waits, leftMin := 0, bound
		for range 2000 {
			work := 1 + rng.IntN(2) // an operation, or a put with its signal
			before := f.landed
			f.queued += work
			require.NoError(t, p.queued(f, work))
			inFlight := f.queued - f.landed
			if f.landed != before {
				waits++
				leftMin = min(leftMin, inFlight)
			}
			require.LessOrEqual(t, inFlight, bound, "bound %d: in flight after queued", bound)
			require.Equal(t, inFlight, p.pending[f], "bound %d: the proxy's count", bound)
		}
		require.Zero(t, f.flushes, "bound %d", bound)
		require.Greater(t, waits, 2000/(bound+1), "bound %d: waits", bound)
		if bound >= 8 {
			// Every wait left the newer part of the bound queued behind it.
			require.GreaterOrEqual(t, leftMin, bound/2-2, "bound %d: least left queued by a wait", bound)
		}
	}
	// A settled connection's mark is forgotten with its count.
	f := &fakeWindowed{}
	p := &Proxy{cfg: ProxyConfig{MaxPending: 8}, pending: map[Connection]int{}, marks: map[Connection]int{}}
	require.NoError(t, p.queued(f, 5))
	require.Equal(t, map[Connection]int{f: 5}, p.marks)
	p.forget(f)
	require.Empty(t, p.marks)
	require.Empty(t, p.pending)
}
