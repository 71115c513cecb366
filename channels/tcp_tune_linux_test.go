package channels

import (
	"net"
	"syscall"
	"testing"
)

// tuneTCP leaves both kernel buffers of a socket at least the asked size
// (Linux reports twice what was set) when the forced options are allowed,
// and at least the capped plain set otherwise.
func TestTuneTCPBuffers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	forced := forceSocketBuffers(tc, tcpSocketBuffer)
	tuneTCP(c)
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var rcv, snd int
	var rerr, serr error
	if err := raw.Control(func(fd uintptr) {
		rcv, rerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		snd, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	}); err != nil || rerr != nil || serr != nil {
		t.Fatal(err, rerr, serr)
	}
	if forced && (rcv < tcpSocketBuffer || snd < tcpSocketBuffer) {
		t.Fatalf("forced buffers of %d bytes: SO_RCVBUF %d, SO_SNDBUF %d", tcpSocketBuffer, rcv, snd)
	}
	t.Logf("forced %v: SO_RCVBUF %d, SO_SNDBUF %d", forced, rcv, snd)
}
