package internode_test

// The real kernels/internode.cu on CPU threads (internal/cpuemu), on
// goroutine ranks over host memory split into virtual nodes: the emulated
// threads push port-channel triggers into the FIFO and the Go proxy
// carries them over TCP between the nodes, while ranks of a node write
// each other's workspaces directly. Results are compared with the
// reference (ReferenceLayout, ReferenceDispatch), as the twins' tests do.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
)

// The notify kernel: 2 virtual nodes x 2 and x 4 ranks, 4 rounds on one
// setup (both parities reused; random routings with -1 and out-of-range
// ids, T = 0 on a rank, a last round with no tokens anywhere).
func TestEmulatedNotify(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) {
			before := cpuemu.Launches(internode.KernelNotify)
			checkNotifyRounds(t, emuBackend, topo, 4, 100+int64(topo.World()))
			if got, want := cpuemu.Launches(internode.KernelNotify)-before, int64(4*topo.World()); got != want {
				t.Fatalf("%d emulated notify launches, want %d (one per rank and round)", got, want)
			}
		})
	}
}

// The dispatch kernel after the notify kernel: 2 virtual nodes x 2 ranks
// and 3 x 2 (more than one other node: the senders' counts of the tokens
// before their chunk, node after node; TestEmulatedCombine runs it on 2 x
// 4, checked as well), 4 rounds on one setup (BF16 with weights, FP8 with scales
// without, FP8 with, BF16 without), every rank's rows, sources, prefixes
// and relayed tokens equal to ReferenceDispatch's.
func TestEmulatedDispatch(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 3, RanksPerNode: 2}} {
		t.Run(topo.String(), func(t *testing.T) {
			before := cpuemu.Launches(internode.KernelDispatch)
			checkDispatchRounds(t, emuBackend, topo, int64(300+topo.World()))
			if got, want := cpuemu.Launches(internode.KernelDispatch)-before, int64(4*topo.World()); got != want {
				t.Fatalf("%d emulated dispatch launches, want %d (one per rank and round)", got, want)
			}
		})
	}
}

// The combine kernel after notify and dispatch (both checked too): 2
// virtual nodes x 4 ranks, 4 rounds (BF16 and FP8 dispatch; with and without weights, 0,
// 1 and 2 biases, BF16 and fp32 partials; outputs of magnitudes 2^-24..4
// so that another order of additions or rounding shows), every rank's
// result equal bit for bit to ReferenceCombine's.
func TestEmulatedCombine(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) {
			before := cpuemu.Launches(internode.KernelCombine)
			checkCombineRounds(t, emuBackend, topo, int64(500+topo.World()))
			if got, want := cpuemu.Launches(internode.KernelCombine)-before, int64(4*topo.World()); got != want {
				t.Fatalf("%d emulated combine launches, want %d (one per rank and round)", got, want)
			}
		})
	}
	// The kernels' rows for other nodes in host memory
	// (channels.RegisterHostMemory) with the transport staging as on GPUs.
	t.Run("send=host/staged", func(t *testing.T) {
		withSendMemory(t, internode.SendHost)
		t.Setenv("GOEP_TCP_STAGE", "always")
		checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 505)
	})
}

// A rank that never launches its notify, dispatch or combine: the kernels'
// waits on it give up within the watchdog's timeout and name it (or the
// forwarder stuck on it), and the Notify refuses further calls. The module is built first, so that no
// rank's wait runs while another waits for g++.
func TestEmulatedPeerNeverArrives(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	_, err := cpuemu.Unknown(internode.KernelNotify)
	require.NoError(t, err)
	t.Run("notify", func(t *testing.T) { checkNotifyPeerNeverArrives(t, emuBackend, time.Second) })
	t.Run("dispatch", func(t *testing.T) { checkDispatchPeerNeverArrives(t, emuBackend, time.Second) })
	t.Run("combine", func(t *testing.T) { checkCombinePeerNeverArrives(t, emuBackend, time.Second) })
}

// Every kernel of internode.cu runs in the emulation's tests.
func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"internode.cu"}, nil)
}
