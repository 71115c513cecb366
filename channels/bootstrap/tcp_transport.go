package bootstrap

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tcpLink is the one connection between this rank and a peer.
type tcpLink struct {
	peer int
	conn net.Conn
	br   *bufio.Reader // kept from the handshake: it may hold early frames
	wmu  sync.Mutex    // one frame at a time
}

// tcpTransport runs one reader goroutine per link that demultiplexes frames
// into the inbox, so no Recv ever reads a socket itself.
type tcpTransport struct {
	links   []*tcpLink // links[self] is nil
	in      *inbox[[]byte]
	closing atomic.Bool
	wg      sync.WaitGroup
}

func newTCPTransport(links []*tcpLink, in *inbox[[]byte]) *tcpTransport {
	t := &tcpTransport{links: links, in: in}
	for _, l := range links {
		if l != nil {
			t.wg.Add(1)
			go t.readLoop(l)
		}
	}
	return t
}

func (t *tcpTransport) readLoop(l *tcpLink) {
	defer t.wg.Done()
	for {
		tag, payload, err := readFrame(l.br)
		if err != nil {
			if !t.closing.Load() {
				t.in.failPeer(l.peer, &PeerClosedError{Rank: l.peer, Err: err})
			}
			// Closing our end makes the peer see us gone too, even when the
			// failure was a protocol error rather than a hang-up.
			l.conn.Close()
			return
		}
		t.in.push(l.peer, tag, payload)
	}
}

func (t *tcpTransport) send(ctx context.Context, deadline time.Time, peer int, tag int64, data []byte) error {
	l := t.links[peer]
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if ctx.Err() != nil {
		return errWaitInterrupted
	}
	hdr := encodeHeader(tag, len(data))
	var n int64
	err := within(ctx, l.conn.SetWriteDeadline, deadline, func() error {
		bufs := net.Buffers{hdr[:], data}
		var err error
		n, err = bufs.WriteTo(l.conn)
		return err
	})
	if err == nil {
		return nil
	}
	if t.closing.Load() {
		return ErrClosed // Close raced with this send
	}
	if n == 0 && isTimeout(err) {
		return errWaitInterrupted // nothing written: the link is still usable
	}
	// A partial frame or a broken socket: the stream cannot be resumed, so
	// the peer is as good as gone; closing tells it so.
	if n > 0 && isTimeout(err) {
		err = fmt.Errorf("send interrupted after %d of %d bytes; connection dropped", n, frameHeaderLen+len(data))
	}
	t.in.failPeer(peer, &PeerClosedError{Rank: peer, Err: err})
	l.conn.Close()
	return t.in.peerError(peer)
}

func (t *tcpTransport) close() error {
	t.closing.Store(true)
	for _, l := range t.links {
		if l != nil {
			l.conn.Close()
		}
	}
	t.wg.Wait()
	return nil
}
