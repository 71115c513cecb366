package channels

import (
	"runtime"
	"testing"
)

// The socket default follows the host's CPUs (8 from 16 CPUs, 4 from 8,
// else 2: on 2 CPUs four sockets halved a loopback put), and a config that
// sets nothing gets it.
func TestDefaultSockets(t *testing.T) {
	for cpus, want := range map[int]int{1: 2, 2: 2, 7: 2, 8: 4, 15: 4, 16: 8, 64: 8, 512: 8} {
		if got := defaultSockets(cpus); got != want {
			t.Errorf("defaultSockets(%d) = %d, want %d", cpus, got, want)
		}
	}
	t.Setenv(TCPSocketsEnv, "")
	n, err := NetworkConfig{}.resolve(2)
	if err != nil {
		t.Fatal(err)
	}
	if want := defaultSockets(runtime.NumCPU()); n.Sockets != want {
		t.Errorf("resolved Sockets = %d, want %d on %d CPUs", n.Sockets, want, runtime.NumCPU())
	}
}
