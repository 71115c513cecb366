package channels_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/device"
)

// The port over CUDA IPC between virtual nodes (NetworkConfig.Transport =
// TransportCudaIPC, $GOEP_NET_TRANSPORT=ipc): every pair of ranks on
// different virtual nodes gets a connection of the backend's own transport
// (CUDA IPC on GPUs, host memory on the host backend), the port-channel
// checks hold over it, and it still stands for a network: a memory
// semaphore (hence a memory channel) across nodes is refused.

// ipcNet is every rank its own virtual node over the port over CUDA IPC.
func ipcNet(ranks int) channels.NetworkConfig {
	return channels.NetworkConfig{VirtualNodes: ranks, Transport: channels.TransportCudaIPC}
}

func TestPortOverIPC(t *testing.T) {
	for _, w := range tcpWorlds(t) {
		t.Run(w.String(), func(t *testing.T) {
			rounds, adds, grid, maxBytes := 200, 3000, 1, 64<<10
			if w.gpu() {
				rounds, adds, grid, maxBytes = 5_000, 20_000, 4, 1<<20
			}
			want := channels.TransportHostMemory
			if w.gpu() {
				want = channels.TransportCudaIPC
			}
			runRanksNet(t, w, ipcNet(w.ranks), maxBytes, func(ctx context.Context, r *channeltest.Rank) error {
				topo, err := r.Comm.Topology(ctx)
				if err != nil {
					return err
				}
				if topo.Nodes != w.ranks {
					return fmt.Errorf("%d nodes, want %d", topo.Nodes, w.ranks)
				}
				if r.Mesh != nil {
					return fmt.Errorf("a memory channel mesh across virtual nodes was built")
				}
				if err := r.EnsurePort(ctx); err != nil {
					return err
				}
				for _, conn := range r.PortMesh.Connections {
					if conn.Transport() != want {
						return fmt.Errorf("port channel to rank %d over %s, want %s", conn.RemoteRank(), conn.Transport(), want)
					}
				}
				if err := r.CheckPortStream(ctx, seed, rounds, maxBytes); err != nil {
					return err
				}
				if err := r.CheckPortAtomics(ctx, seed, adds, grid); err != nil {
					return err
				}
				// A memory channel mesh to the other nodes: refused on every
				// rank (each refuses its own semaphores before any exchange
				// a peer would wait on).
				_, err = r.Comm.NewMemoryChannelMesh(ctx, channels.MeshConfig{Tag: 77, Local: r.Mem})
				if err == nil {
					return fmt.Errorf("a memory channel mesh across virtual nodes over the port over CUDA IPC was built")
				}
				if want := "on another node, which only port channels and host semaphores reach"; !strings.Contains(err.Error(), want) {
					return fmt.Errorf("memory channel mesh across nodes: %v, want an error saying %q", err, want)
				}
				return nil
			})
		})
	}
}

// With an emulated line rate (NetworkConfig.EmulatedGBps) the proxy cuts
// puts into paced pieces: the same checks hold (ordered byte-exact puts
// with signals and flushes, atomic adds summing exactly), with puts of up
// to 16 pieces at random offsets. TestTCPPortPaced runs them over TCP.
func TestPortOverIPCPaced(t *testing.T) {
	for _, w := range tcpWorlds(t) {
		t.Run(w.String(), func(t *testing.T) { pacedPortChecks(t, w, channels.TransportCudaIPC) })
	}
}

// TestTCPPortPaced is TestPortOverIPCPaced over TCP (host backend; the
// pacing is the proxy's, the same for every transport).
func TestTCPPortPaced(t *testing.T) {
	for _, w := range tcpWorlds(t) {
		if !w.gpu() {
			t.Run(w.String(), func(t *testing.T) { pacedPortChecks(t, w, channels.TransportEthernet) })
		}
	}
}

// pacedPortChecks runs the port checks on w over transport tr, every rank
// its own virtual node, at an emulated rate.
func pacedPortChecks(t *testing.T, w world, tr channels.Transport) {
	nc := ipcNet(w.ranks)
	nc.Transport = tr
	nc.EmulatedGBps = 2 // pieces of 64 KiB
	rounds, maxBytes := 100, 1<<20
	if w.gpu() {
		nc.EmulatedGBps = 20 // pieces of 496 KiB
		rounds, maxBytes = 400, 2<<20
	}
	runRanksNet(t, w, nc, maxBytes, func(ctx context.Context, r *channeltest.Rank) error {
		if err := r.CheckPortStream(ctx, seed, rounds, maxBytes); err != nil {
			return err
		}
		return r.CheckPortAtomics(ctx, seed, 500, 1)
	})
}

// The emulated rate's setting: Config, else the environment; bad values
// are refused by name.
func TestEmulatedRateConfig(t *testing.T) {
	nc, err := channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportCudaIPC}.Resolve(4)
	require.NoError(t, err)
	require.Zero(t, nc.EmulatedGBps)
	t.Setenv(channels.NetEmulateEnv, "50")
	nc, err = channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportCudaIPC}.Resolve(4)
	require.NoError(t, err)
	require.Equal(t, 50.0, nc.EmulatedGBps)
	nc, err = channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportCudaIPC, EmulatedGBps: 12.5}.Resolve(4)
	require.NoError(t, err)
	require.Equal(t, 12.5, nc.EmulatedGBps, "the Config wins over the environment")
	for _, bad := range []string{"fast", "-3", "0.01", "1e6", "NaN"} {
		t.Setenv(channels.NetEmulateEnv, bad)
		_, err = channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportCudaIPC}.Resolve(4)
		require.ErrorContains(t, err, channels.NetEmulateEnv, bad)
	}
	t.Setenv(channels.NetEmulateEnv, "")
	_, err = channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportCudaIPC, EmulatedGBps: -1}.Resolve(4)
	require.ErrorContains(t, err, "EmulatedGBps -1: want 0 (off) or 0.1 to 10000 GB/s")
}

// The configuration: names, the refusal without virtual nodes (the port
// over CUDA IPC reaches one host only), no TCP staging.
func TestPortOverIPCConfig(t *testing.T) {
	for _, s := range []string{"ipc", "cuda-ipc", "port", " IPC "} {
		tr, err := channels.ParseTransport(s)
		require.NoError(t, err, s)
		require.Equal(t, channels.TransportCudaIPC, tr, s)
	}
	_, err := channels.ParseTransport("nvlink")
	require.ErrorContains(t, err, "want tcp, ipc or ib")

	_, err = channels.NetworkConfig{Transport: channels.TransportCudaIPC}.Resolve(4)
	require.ErrorContains(t, err, "connects virtual nodes of one host: set VirtualNodes")
	t.Setenv(channels.NetTransportEnv, "ipc")
	_, err = channels.NetworkConfig{}.Resolve(4)
	require.ErrorContains(t, err, "connects virtual nodes of one host")
	nc, err := channels.NetworkConfig{VirtualNodes: 2}.Resolve(4)
	require.NoError(t, err)
	require.Equal(t, channels.TransportCudaIPC, nc.Transport)
	staging, err := nc.StagingBytes()
	require.NoError(t, err)
	require.Zero(t, staging)
	_, err = channels.NetworkConfig{VirtualNodes: 2, Transport: channels.TransportHostMemory}.Resolve(4)
	require.ErrorContains(t, err, "is not a network transport")

	// NewCommunicator refuses it the same way.
	bss, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	defer bss[0].Close()
	dev := device.OpenHost(0)
	defer dev.Close()
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{})
	require.ErrorContains(t, err, "connects virtual nodes of one host")
}
