package internode_test

import (
	"testing"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
)

// Forwarding by sender block (ForwardBlocks): each sender block stores a
// word per node naming its run of relay rows after its last put there, and
// the forwarder blocks claim runs of rows of the landed units. The grids
// cover one of each, more forwarders than senders (several claim one
// unit), fewer (one claims several), pieces (several puts before a block's
// word), the shared grid, and ranks that launch different splits (a
// forwarder learns a source's S from its words, not from its own grid).
// Dispatch (2 x 2 and 3 x 2, 4 formats) byte for byte and combine (2 x 4)
// bit for bit against the reference; then the graph-shaped sequence
// (cached and route-only dispatches: the words and claims are cleared
// between rounds with no notify round) and the device-pointer rounds with
// resumed layouts.
func TestEmulatedForwardBlocks(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	withForward(t, internode.ForwardBlocks)
	for _, tc := range []struct {
		name   string
		splits []internode.Split
		put    int
	}{
		{"1,1,1", []internode.Split{{Senders: 1, Forwarders: 1, Receivers: 1}}, 0},
		{"2,3,1", []internode.Split{{Senders: 2, Forwarders: 3, Receivers: 1}}, 0},
		{"3,2,1/put=1000", []internode.Split{{Senders: 3, Forwarders: 2, Receivers: 1}}, 1000},
		{"shared", []internode.Split{{Shared: true}}, 0},
		{"ranks-differ", []internode.Split{{Senders: 1, Forwarders: 3, Receivers: 1}, {Senders: 3, Forwarders: 1, Receivers: 1},
			{Senders: 2, Forwarders: 2, Receivers: 2}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withSplits(t, tc.splits...)
			withPutBytes(t, tc.put)
			checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4100)
			checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 3, RanksPerNode: 2}, 4200)
			checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 4300)
		})
	}
	for _, sp := range []internode.Split{{Shared: true}, {Senders: 2, Forwarders: 1, Receivers: 1}} {
		t.Run("graph/split="+sp.String(), func(t *testing.T) {
			checkGraphReplays(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4400, 4, sp)
		})
	}
	t.Run("device-pointers", func(t *testing.T) {
		checkDeviceRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4500, false)
	})
	// ForwardAuto with its bar at a few rows: in each round some sources'
	// rows at a node go by block and others by node, and a pair changes
	// from one to the other between rounds (the node counters advance in
	// every round either way).
	t.Run("auto", func(t *testing.T) {
		withForward(t, internode.ForwardAuto)
		prev := internode.SetForwardAutoBytes(4 << 10)
		t.Cleanup(func() { internode.SetForwardAutoBytes(prev) })
		withSplits(t, internode.Split{Senders: 2, Forwarders: 2, Receivers: 1})
		checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 3, RanksPerNode: 2}, 4600)
		checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 4700)
		checkGraphReplays(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4800, 4, internode.Split{Shared: true})
	})
}

// The same on the GPUs present, over TCP and over the port over CUDA IPC:
// the split grids of the emulated test and the default one (Shared from
// SharedSplitTokens tokens on), 2 x 2 and 2 x 4 (8 ranks on one GPU).
func TestForwardBlocksGPU(t *testing.T) {
	skipNoGPU(t)
	withForward(t, internode.ForwardBlocks)
	for _, tr := range []string{"tcp", "ipc"} {
		for _, tc := range []struct {
			name   string
			splits []internode.Split
		}{
			{"default", nil},
			{"2,3,1", []internode.Split{{Senders: 2, Forwarders: 3, Receivers: 1}}},
			{"3,2,1", []internode.Split{{Senders: 3, Forwarders: 2, Receivers: 1}}},
			{"ranks-differ", []internode.Split{{Senders: 1, Forwarders: 3, Receivers: 1}, {Senders: 3, Forwarders: 1, Receivers: 1}}},
		} {
			t.Run(tr+"/"+tc.name, func(t *testing.T) {
				t.Setenv(channels.NetTransportEnv, tr)
				withSplits(t, tc.splits...)
				checkDispatchRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4600)
				checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 4700)
			})
		}
		t.Run(tr+"/graph", func(t *testing.T) {
			t.Setenv(channels.NetTransportEnv, tr)
			checkGraphReplays(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 4800, 120, internode.Split{Shared: true})
		})
		t.Run(tr+"/device-pointers", func(t *testing.T) {
			t.Setenv(channels.NetTransportEnv, tr)
			checkDeviceRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 4900, false)
		})
		t.Run(tr+"/auto", func(t *testing.T) {
			t.Setenv(channels.NetTransportEnv, tr)
			withForward(t, internode.ForwardAuto)
			prev := internode.SetForwardAutoBytes(8 << 10)
			t.Cleanup(func() { internode.SetForwardAutoBytes(prev) })
			checkDispatchRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 5000)
			checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 5100)
		})
	}
}
