package internode_test

// GPU variants: goroutine ranks spread over the GPUs present (rank r on GPU
// r mod n: with one GPU every rank shares it and its primary context),
// split into 2 virtual nodes whose traffic goes over the network transport
// (TCP, staged through pinned host memory) while ranks of a node map each
// other's workspaces over CUDA IPC. Notify preloads its module and checks
// its one-block launch against the spin budget at setup.

import (
	"flag"
	"testing"
	"time"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internode"
)

var gpuRounds = flag.Int("internode.rounds", 0, "checked rounds of TestNotifyRepeatedGPU and TestRoundsRepeatedGPU (0 skips them)")

func skipNoGPU(t *testing.T) {
	t.Helper()
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA GPU (%v)", err)
	}
}

// The notify kernel against the reference: 2 virtual nodes x 2 and x 4
// ranks, 4 rounds on one setup.
func TestNotifyGPU(t *testing.T) {
	skipNoGPU(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkNotifyRounds(t, cudaBackend, topo, 4, 200+int64(topo.World())) })
	}
}

// The dispatch kernel after the notify kernel against ReferenceDispatch:
// 2 virtual nodes x 2 and x 4 ranks, 4 rounds (BF16 and FP8, with and
// without weights).
func TestDispatchGPU(t *testing.T) {
	skipNoGPU(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkDispatchRounds(t, cudaBackend, topo, 400+int64(topo.World())) })
	}
}

// The combine kernel after notify and dispatch against ReferenceCombine,
// bit for bit: 2 virtual nodes x 2 and x 4 ranks, 4 rounds.
func TestCombineGPU(t *testing.T) {
	skipNoGPU(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkCombineRounds(t, cudaBackend, topo, 600+int64(topo.World())) })
	}
	// The rows for other nodes in pinned host memory, which the TCP
	// transport sends from unstaged (the default is device memory).
	t.Run("send=host", func(t *testing.T) {
		withSendMemory(t, internode.SendHost)
		checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 605)
	})
}

// -internode.rounds N checked notify rounds on one setup (2 x 4 ranks):
// counters and both parities of every buffer reused N times.
func TestNotifyRepeatedGPU(t *testing.T) {
	skipNoGPU(t)
	if *gpuRounds <= 0 {
		t.Skip("set -internode.rounds N to run N checked rounds")
	}
	checkNotifyRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, *gpuRounds, 300)
}

// -internode.rounds N checked rounds of notify, dispatch and combine on
// one setup (2 x 4 ranks), cycling through BF16 / FP8 dispatch, weights or
// none, 0..2 biases and both partial formats; with the rows for other
// nodes in device memory (the default), then in pinned host memory.
func TestRoundsRepeatedGPU(t *testing.T) {
	skipNoGPU(t)
	if *gpuRounds <= 0 {
		t.Skip("set -internode.rounds N to run N checked rounds")
	}
	for _, m := range []internode.SendMemory{internode.SendDevice, internode.SendHost} {
		t.Run("send="+m.String(), func(t *testing.T) {
			withSendMemory(t, m)
			checkRepeatedRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, *gpuRounds, 700)
		})
	}
}

// A rank that never launches: the kernels' waits give up within the
// watchdog's timeout, naming it or the forwarder stuck on it.
func TestPeerNeverArrivesGPU(t *testing.T) {
	skipNoGPU(t)
	t.Run("notify", func(t *testing.T) { checkNotifyPeerNeverArrives(t, cudaBackend, 2*time.Second) })
	t.Run("dispatch", func(t *testing.T) { checkDispatchPeerNeverArrives(t, cudaBackend, 2*time.Second) })
	t.Run("combine", func(t *testing.T) { checkCombinePeerNeverArrives(t, cudaBackend, 2*time.Second) })
}
