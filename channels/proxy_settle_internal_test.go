package channels

import (
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
