package lowlatency_test

// Groups across nodes: virtual nodes of one host (channels'
// NetworkConfig.VirtualNodes), ranks of a node storing into each other's
// workspaces, rows and counters for the other nodes over port channels
// (the Go proxy, TCP between the nodes). The scenarios and the reference
// are the single-node ones: the transport must not change any result.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/lowlatency"
)

// newNodeGroup builds one rank per device over c.Nodes virtual nodes:
// a communicator each, the workspace joined by lowlatency.Connect. spin
// caps grids (ranks sharing a GPU).
func newNodeGroup(t testing.TB, devs []device.Device, c lowlatency.Config, timeout time.Duration, spin int) *group {
	l, err := lowlatency.NewLayout(c)
	require.NoError(t, err)
	boots, err := bootstrap.NewInProcess(c.Ranks, bootstrap.Config{Timeout: time.Minute})
	require.NoError(t, err)
	g := &group{ranks: make([]*rank, c.Ranks)}
	for i := range g.ranks {
		g.ranks[i] = &rank{dev: devs[i]}
	}
	t.Cleanup(func() {
		// Every rank's streams drain before any proxy stops, and every
		// proxy drains (its puts need the peers' connections) before any
		// communicator closes.
		var drained, closed sync.WaitGroup
		drained.Add(len(g.ranks))
		closed.Add(len(g.ranks))
		_ = g.each(func(i int, r *rank) error {
			if r.stream != nil {
				_ = r.stream.Synchronize()
			}
			drained.Done()
			drained.Wait()
			_ = r.conn.Close()
			closed.Done()
			closed.Wait()
			if r.stream != nil {
				_ = r.stream.Close()
			}
			if r.comm != nil {
				_ = r.comm.Close()
			}
			for _, b := range r.bufs {
				_ = r.dev.Free(b)
			}
			return boots[i].Close()
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = g.each(func(i int, r *rank) error {
		dev := r.dev
		comm, err := channels.NewCommunicator(boots[i], dev, channels.Config{Timeouts: channels.Timeouts{Wait: timeout},
			Network: channels.NetworkConfig{VirtualNodes: c.Nodes, Sockets: 2, ChunkBytes: 16 << 10}})
		if err != nil {
			return err
		}
		r.comm = comm
		// Placement before any connection: ranks sharing a GPU then share
		// one connection stream (ARCHITECTURE.md, "Ranks sharing a GPU").
		if _, err := comm.Placement(ctx); err != nil {
			return err
		}
		ws, err := r.newWorkspace(l)
		if err != nil {
			return err
		}
		if r.stream, err = dev.NewStream(); err != nil {
			return err
		}
		if r.conn, r.ws, err = lowlatency.Connect(ctx, comm, ws, l, 1000); err != nil {
			return err
		}
		r.ws.WaitID = comm.NewWaitID("lowlatency test kernels")
		r.ws.SpinBlocks = spin
		if err := r.ws.Validate(); err != nil {
			return err
		}
		return comm.Barrier(ctx)
	})
	require.NoError(t, err)
	return g
}

// Across 2 virtual nodes of 2 and of 4 ranks: random routings with -1 and
// out-of-range ids, an expert no token picks, T = 0, 1 and max, FP8 and
// UE8M0, a masked rank on the other node (then cleared, then another),
// rank-major, split steps with two micro-batches on alternating sets over
// several iterations (the same workspaces and send regions reused).
func nodeCases() []llCase {
	return []llCase{
		{name: "2x2-bf16-random", nodes: 2, ranks: 4, maxTokens: 6, hidden: 64, topk: 3, le: 2, weights: true, split: true,
			microBatches: 2, iters: 3, minus1: 10, bad: 5, hot: -1, cold: 3},
		{name: "2x2-fp8-t0-t1-max", nodes: 2, ranks: 4, maxTokens: 4, hidden: 256, topk: 4, le: 2, format: lowlatency.FP8,
			tokens: []int{0, 4, 1, 4}, weights: true, microBatches: 2, iters: 2, dups: 10, hot: -1, cold: -1},
		{name: "2x4-ue8m0-masked", nodes: 2, ranks: 8, maxTokens: 4, hidden: 128, topk: 4, le: 2, format: lowlatency.UE8M0,
			weights: true, split: true, microBatches: 2, iters: 3, masks: []uint32{1 << 5, 0, 1<<1 | 1<<6},
			minus1: 5, bad: 5, hot: -1, cold: 0},
		{name: "2x2-rank-major", nodes: 2, ranks: 4, maxTokens: 5, hidden: 128, topk: 2, le: 2, rankMajor: true,
			weights: true, microBatches: 1, iters: 2, minus1: 10, hot: -1, cold: -1},
	}
}

func TestNodesMatchReferenceHost(t *testing.T) {
	for _, c := range nodeCases() {
		t.Run(c.name, func(t *testing.T) {
			c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
			g := newNodeGroup(t, hostDevices(t, c.ranks), c.config(), 20*time.Second, 0)
			runCase(t, g, c)
		})
	}
}

// The real kernels (CPU emulation): 2x2 and 2x4 (one block of 64 threads
// a rank: every emulated thread is an OS thread).
func TestEmulatedNodes(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, c := range nodeCases() {
		if c.name != "2x2-bf16-random" && c.name != "2x4-ue8m0-masked" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			c.cfg = lowlatency.LaunchConfig{NumSMs: 1, Threads: 64}
			if c.ranks <= 4 {
				c.cfg.NumSMs = 2
			} else {
				// CI time: two iterations (a rank of the other node
				// masked, then the mask cleared).
				c.iters, c.masks = 2, c.masks[:2]
			}
			g := newNodeGroup(t, emuDevices(t, c.ranks), c.config(), 60*time.Second, 0)
			runCase(t, g, c)
		})
	}
}

// The same over the port over CUDA IPC between the virtual nodes
// ($GOEP_NET_TRANSPORT=ipc: host-memory connections on the host backend and
// under the CPU emulation, the GPUs' copy engines on CUDA) instead of TCP:
// two node cases on each backend here, every node case on GPUs.
func TestNodesOverPort(t *testing.T) {
	t.Setenv(channels.NetTransportEnv, "ipc")
	for _, c := range nodeCases() {
		if c.name != "2x2-bf16-random" && c.name != "2x4-ue8m0-masked" {
			continue
		}
		t.Run("host/"+c.name, func(t *testing.T) {
			c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
			runCase(t, newNodeGroup(t, hostDevices(t, c.ranks), c.config(), 20*time.Second, 0), c)
		})
		if c.ranks > 4 {
			continue // CI time: the emulation runs the 2 x 2 case
		}
		t.Run("emulated/"+c.name, func(t *testing.T) {
			cpuemu.SkipUnavailable(t)
			c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
			runCase(t, newNodeGroup(t, emuDevices(t, c.ranks), c.config(), 60*time.Second, 0), c)
		})
	}
}

func TestNodesOverPortGPU(t *testing.T) {
	t.Setenv(channels.NetTransportEnv, "ipc")
	for _, c := range nodeCases() {
		t.Run(c.name, func(t *testing.T) {
			devs, spin := gpuDevices(t, c.ranks)
			c.cfg = lowlatency.LaunchConfig{NumSMs: min(4, spin), Threads: 128}
			runCase(t, newNodeGroup(t, devs, c.config(), 20*time.Second, spin), c)
		})
	}
}

// Graph-style replays across nodes on the host backend: the same captured
// calls on both sets, every replay checked.
func TestNodesGraphReplaysHost(t *testing.T) {
	graphReplays(t, hostDevices(t, 4), 0, 3, 2)
}

// GPU: every node case on goroutine ranks over the GPUs present (2 virtual
// nodes may share one GPU), then the graph replays across nodes.
func TestNodesMatchReferenceGPU(t *testing.T) {
	for _, c := range nodeCases() {
		t.Run(c.name, func(t *testing.T) {
			devs, spin := gpuDevices(t, c.ranks)
			c.cfg = lowlatency.LaunchConfig{NumSMs: min(4, spin), Threads: 128}
			g := newNodeGroup(t, devs, c.config(), 20*time.Second, spin)
			runCase(t, g, c)
		})
	}
}

// 8 ranks in 2 virtual nodes (sharing the GPUs present), 200 replays.
func TestNodesGraphReplaysGPU(t *testing.T) {
	devs, spin := gpuDevices(t, 8)
	graphReplays(t, devs, spin, 200, 2)
}

// A Config across nodes is refused where it cannot work.
func TestNodesConfigRefused(t *testing.T) {
	base := lowlatency.Config{Ranks: 8, MaxTokens: 4, Hidden: 64, TopK: 2, LocalExperts: 2}
	for name, mod := range map[string]func(*lowlatency.Config){
		"nodes do not divide ranks": func(c *lowlatency.Config) { c.Nodes = 3 },
		"negative nodes":            func(c *lowlatency.Config) { c.Nodes = -1 },
		"16 ranks on one node":      func(c *lowlatency.Config) { c.Ranks = 16 },
		"33 ranks":                  func(c *lowlatency.Config) { c.Ranks, c.Nodes = 33, 33 },
	} {
		c := base
		mod(&c)
		require.Error(t, c.Validate(), name)
	}
	ok := base
	ok.Ranks, ok.Nodes = 16, 2
	require.NoError(t, ok.Validate())
	require.Equal(t, uint32(0xff00), ok.NodeMask(9))
	require.Equal(t, uint32(0xff), ok.NodeMask(0))
	l, err := lowlatency.NewLayout(ok)
	require.NoError(t, err)
	require.NotZero(t, l.Set[1].SendX.Size)
	one, err := lowlatency.NewLayout(base)
	require.NoError(t, err)
	require.Zero(t, one.Set[1].SendX.Size+one.Set[1].CSend.Size, "one node needs no send regions")
	// A workspace across nodes without port channels is refused.
	w := lowlatency.Workspace{Layout: l, Base: 256, Size: l.Size, Peers: 8, Watchdog: 8}
	require.ErrorContains(t, w.Validate(), "port channels")
	var conn *lowlatency.Connection
	require.NoError(t, conn.Close())
	_, _, err = lowlatency.Connect(context.Background(), nil, device.Buffer{}, l, 0)
	require.Error(t, err)
	require.False(t, errors.Is(err, context.Canceled))
}
