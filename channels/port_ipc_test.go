package channels_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
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

// CopyStreams and CopyBand: defaults, the environment, and the bounds.
func TestCopyStreamsConfig(t *testing.T) {
	nc, err := channels.NetworkConfig{}.Resolve(2)
	require.NoError(t, err)
	require.Equal(t, 1, nc.CopyStreams)
	require.Equal(t, 1<<20, nc.CopyBand)
	t.Setenv(channels.IPCStreamsEnv, "4")
	t.Setenv(channels.IPCBandEnv, "65536")
	nc, err = channels.NetworkConfig{}.Resolve(2)
	require.NoError(t, err)
	require.Equal(t, 4, nc.CopyStreams)
	require.Equal(t, 64<<10, nc.CopyBand)
	nc, err = channels.NetworkConfig{CopyStreams: 2, CopyBand: 4 << 20}.Resolve(2)
	require.NoError(t, err, "the Config wins over the environment")
	require.Equal(t, 2, nc.CopyStreams)
	require.Equal(t, 4<<20, nc.CopyBand)
	for _, bad := range []struct {
		nc   channels.NetworkConfig
		want string
	}{
		{channels.NetworkConfig{CopyStreams: 9}, "CopyStreams 9: want 1 to 8"},
		{channels.NetworkConfig{CopyStreams: -1}, "CopyStreams -1"},
		{channels.NetworkConfig{CopyBand: 3 << 20}, "CopyBand 3145728: want a power of two"},
		{channels.NetworkConfig{CopyBand: 32 << 10}, "CopyBand 32768"},
		{channels.NetworkConfig{CopyBand: 128 << 20}, "CopyBand 134217728"},
	} {
		_, err := bad.nc.Resolve(2)
		require.ErrorContains(t, err, bad.want)
	}
	t.Setenv(channels.IPCStreamsEnv, "many")
	_, err = channels.NetworkConfig{}.Resolve(2)
	require.ErrorContains(t, err, channels.IPCStreamsEnv+`="many" is not an integer`)
}

// TestCopyStreamsKeepOrder: with the port over CUDA IPC on 4 copy streams
// and the smallest band, rank 0 writes 300 random overlapping pieces of
// random bytes into rank 1's memory straight through the connection, then
// flushes; rank 1's bytes must be what applying the writes in order gives
// (computed here). A write landing before an earlier one to the same bytes
// shows as wrong bytes. Then the port-channel stream check (every signal
// after its data, four put flavours) runs over the same streams. Lanes
// exist only where a rank has its GPU to itself (cuda-2 on 2+ GPUs); the
// host backend checks the same contract on its one path.
func TestCopyStreamsKeepOrder(t *testing.T) {
	for _, w := range tcpWorlds(t) {
		if w.ranks != 2 {
			continue
		}
		t.Run(w.String(), func(t *testing.T) {
			const maxBytes, writes, maxWrite = 1 << 20, 300, 512 << 10
			nc := ipcNet(2)
			nc.CopyStreams, nc.CopyBand = 4, 64<<10
			runRanksNet(t, w, nc, maxBytes, func(ctx context.Context, r *channeltest.Rank) error {
				if err := r.EnsurePort(ctx); err != nil {
					return err
				}
				region, dstBase := r.Layout.Region, r.Layout.Region+r.Layout.Guard
				rng := rand.New(rand.NewPCG(seed, 0x6f72646572))
				src := make([]byte, region)
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				type write struct{ src, dst, n int }
				plan := make([]write, writes)
				for i := range plan {
					n := int(math.Exp(rng.Float64() * math.Log(maxWrite)))
					n = min(max(n, 1), maxWrite)
					plan[i] = write{src: rng.IntN(region - n + 1), dst: rng.IntN(region - n + 1), n: n}
				}
				want := bytes.Repeat([]byte{0xA5}, region)
				for _, p := range plan {
					copy(want[p.dst:p.dst+p.n], src[p.src:p.src+p.n])
				}
				me := r.Comm.Rank()
				if me == 0 {
					if err := r.Dev.CopyIn(r.Buf.Ptr, src); err != nil {
						return err
					}
				} else {
					if err := r.Dev.CopyIn(r.Buf.Ptr+uintptr(dstBase), bytes.Repeat([]byte{0xA5}, region)); err != nil {
						return err
					}
				}
				if err := r.Comm.Barrier(ctx); err != nil {
					return err
				}
				if me == 0 {
					conn, remote := r.PortMesh.Connections[0], r.PortMesh.Remote[0]
					for _, p := range plan {
						if err := conn.Write(remote, dstBase+p.dst, r.Mem, p.src, p.n); err != nil {
							return err
						}
					}
					if err := conn.Flush(); err != nil {
						return err
					}
				}
				if err := r.Comm.Barrier(ctx); err != nil {
					return err
				}
				if me == 1 {
					got := make([]byte, region)
					if err := r.Dev.CopyOut(got, r.Buf.Ptr+uintptr(dstBase)); err != nil {
						return err
					}
					if i := firstDiff(got, want); i >= 0 {
						return fmt.Errorf("byte %d of the destination is %#x, want %#x (%d bytes differ)", i, got[i], want[i], countDiff(got, want))
					}
				}
				rounds := 300
				if w.gpu() {
					rounds = 3000
				}
				return r.CheckPortStream(ctx, seed, rounds, maxBytes)
			})
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}
