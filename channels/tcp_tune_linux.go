package channels

import (
	"net"
	"syscall"
)

// forceSocketBuffers sets both kernel buffers of tc to size with
// SO_RCVBUFFORCE / SO_SNDBUFFORCE, which ignore net.core.rmem_max and
// wmem_max; false where the process lacks the capability (or the options
// fail), and the caller falls back to the capped options.
func forceSocketBuffers(tc *net.TCPConn, size int) bool {
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = raw.Control(func(fd uintptr) {
		ok = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, size) == nil &&
			syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, size) == nil
	})
	return ok
}
