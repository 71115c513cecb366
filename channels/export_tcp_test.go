package channels

import (
	"fmt"
	"net"
)

// ResetTCPForTest resets conn's sockets as a dying process's kernel would
// (no goodbye, RST), to test how the peer reports it.
func ResetTCPForTest(conn Connection) error {
	t, ok := conn.(*tcpConnection)
	if !ok {
		return fmt.Errorf("%v is not a TCP connection", conn)
	}
	t.closing.Store(true) // this side's own readers stay quiet
	for _, s := range append(append([]net.Conn(nil), t.links.out...), t.links.in...) {
		if tc, ok := s.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = s.Close()
	}
	return nil
}

// TCPBacklogForTest is conn's count of payload bytes queued on its sockets
// and not yet written (what the proxy's idle policy reads).
func TCPBacklogForTest(conn Connection) (int64, error) {
	t, ok := conn.(*tcpConnection)
	if !ok {
		return 0, fmt.Errorf("%v is not a TCP connection", conn)
	}
	return t.backlog(), nil
}
