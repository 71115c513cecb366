package internode_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
)

// Internode over the port over CUDA IPC between the virtual nodes
// ($GOEP_NET_TRANSPORT=ipc): the same protocol with the network leg carried
// out by the proxy on the backend's own transport (copy engines on GPUs,
// host memory copies on the host backend and under the CPU emulation)
// instead of TCP. The checks are the TCP ones (every helper asserts the
// network peers' transport through wantNetTransport).

// Host backend (the Go twins) and the CPU emulation (the kernels): notify,
// dispatch and combine rounds, the repeated rounds and the device-pointer
// rounds with their kept layouts, against the reference.
func TestPortOverIPC(t *testing.T) {
	withPortOverIPC(t)
	t.Run("host/rounds", func(t *testing.T) {
		checkRepeatedRounds(t, hostBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 6, 1201)
	})
	t.Run("host/combine", func(t *testing.T) {
		checkCombineRounds(t, hostBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 1202)
	})
	t.Run("emu/combine", func(t *testing.T) {
		cpuemu.SkipUnavailable(t)
		checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 1203)
	})
	t.Run("emu/device-pointers", func(t *testing.T) {
		cpuemu.SkipUnavailable(t)
		checkDeviceRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 1204, false)
	})
}

// The same on the GPUs present (ranks spread over them; with one GPU the
// copy engines move the rows within it): notify, dispatch and combine
// rounds, the device-pointer rounds (cached, route-only and resumed
// layouts) and the 1000-round soak with -internode.rounds.
func TestPortOverIPCGPU(t *testing.T) {
	skipNoGPU(t)
	withPortOverIPC(t)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String()+"/combine", func(t *testing.T) { checkCombineRounds(t, cudaBackend, topo, 1300+int64(topo.World())) })
		t.Run(topo.String()+"/device-pointers", func(t *testing.T) {
			checkDeviceRounds(t, cudaBackend, topo, 1310+int64(topo.World()), false)
		})
	}
	t.Run("send=host", func(t *testing.T) {
		withSendMemory(t, internode.SendHost)
		checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 1320)
	})
	if *gpuRounds > 0 {
		t.Run("repeated", func(t *testing.T) {
			checkRepeatedRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, *gpuRounds, 1330)
		})
	}
}
