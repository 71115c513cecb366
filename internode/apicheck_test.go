package internode_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internode"
)

// Every exported method of the package answers on nil receivers, zero
// values and out-of-range values with an error or a zero value, never a
// panic (issue 18 class 1); the guard fails when a new exported type with
// methods is not added here. A closed Notify is covered by
// TestNotifyBadInput.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", []any{
		(*internode.Notify)(nil), new(internode.Notify),
		internode.Shape{}, internode.Shape{Topology: internode.Topology{Nodes: -1, RanksPerNode: -3}, Experts: -5, Hidden: -1},
		internode.Topology{}, internode.Topology{Nodes: -1, RanksPerNode: -1},
		internode.Split{}, internode.Split{Senders: -1, Forwarders: 1 << 40, Receivers: -7, Shared: true},
		internode.SendDevice, internode.SendHost, internode.SendMemory(-3), internode.SendMemory(99),
		internode.ForwardNodes, internode.ForwardBlocks, internode.ForwardAuto, internode.Forward(-1), internode.Forward(7),
		internode.ReduceAfter, internode.ReduceByUnits, internode.ReduceUnits(-1), internode.ReduceUnits(9),
		internode.Memory{}, internode.Memory{RDMA: -1, Send: 5, SendHost: true, Kernels: -7},
		internode.KernelTrace{}, internode.KernelTrace{Events: []string{"entry", "exit"}, Blocks: []internode.BlockTrace{{Round: 3}, {Round: 3, Stamps: []uint64{5}}}},
	}, apicheck.Options{})
}
