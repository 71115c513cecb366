//go:build !linux

package channels

import "net"

// forceSocketBuffers: no forced options outside Linux.
func forceSocketBuffers(*net.TCPConn, int) bool { return false }
