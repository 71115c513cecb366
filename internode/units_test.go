package internode_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// Reducing by units (NotifyConfig.ReduceUnits): each forwarder names its
// puts of partials to a source node in words stored after them, and the
// source's combine blocks claim the landed units and sum each token once
// every node's partial of it is in (the own node's from its own
// reducers). The cases put a unit per row piece (put=1000: one or two
// rows a put), a unit per put group, a unit per block with one put each,
// and a unit per block of several pieces (the kernel's fallback where a
// forwarder's puts would overflow its unit table); on the shared
// grid, a split grid, and ranks launching different grids (the source
// learns a node's unit count from its words, not from its own grid); 2 x
// 4, and 3 x 2, where a token waits for partials from two other nodes.
// Every round's result equals ReferenceCombine's bit for bit, with no
// final-reduce kernel launched (the combine kernel summed every token).
// Then the graph-shaped sequence (cached and route-only dispatches, the
// words, claims and pending counts reused with no notify round between)
// and the device-pointer rounds.
func TestEmulatedReduceByUnits(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	withReduceUnits(t, internode.ReduceByUnits)
	for _, tc := range []struct {
		name     string
		splits   []internode.Split
		put      int
		groups   int
		perBlock bool
	}{
		{"shared/put=1000", []internode.Split{{Shared: true}}, 1000, 0, false},
		{"shared/groups=2", []internode.Split{{Shared: true}}, 0, 2, false},
		{"2,3,1/block", []internode.Split{{Senders: 2, Forwarders: 3, Receivers: 1}}, 0, 0, false},
		{"ranks-differ/put=1000", []internode.Split{{Senders: 1, Forwarders: 3, Receivers: 1}, {Shared: true},
			{Senders: 2, Forwarders: 2, Receivers: 2}}, 1000, 0, false},
		{"per-block/shared/put=1000", []internode.Split{{Shared: true}}, 1000, 0, true},
		{"per-block/ranks-differ/put=1000", []internode.Split{{Senders: 2, Forwarders: 1, Receivers: 1}, {Shared: true}},
			1000, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withCombUnitsPerBlock(t, tc.perBlock)
			withSplits(t, tc.splits...)
			withPutBytes(t, tc.put)
			withPutGroups(t, tc.groups)
			before := cpuemu.Launches(internode.KernelCombineReduce)
			checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 7100)
			checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 3, RanksPerNode: 2}, 7200)
			require.Equal(t, before, cpuemu.Launches(internode.KernelCombineReduce), "a final-reduce kernel ran: the combine did not reduce by units")
		})
	}
	for _, sp := range []internode.Split{{Shared: true}, {Senders: 2, Forwarders: 1, Receivers: 1}} {
		t.Run("graph/split="+sp.String(), func(t *testing.T) {
			withPutBytes(t, 1000)
			checkGraphReplays(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 7300, 4, sp)
		})
	}
	t.Run("device-pointers", func(t *testing.T) {
		checkDeviceRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 7400, false)
	})
}

// The same on the GPUs present, over TCP and over the port over CUDA IPC
// (with puts in pieces, as at an emulated rate, and in the port's put
// groups), 2 x 4 and 3 x 2 ranks sharing the GPUs.
func TestReduceByUnitsGPU(t *testing.T) {
	skipNoGPU(t)
	withReduceUnits(t, internode.ReduceByUnits)
	for _, tr := range []string{"tcp", "ipc"} {
		for _, tc := range []struct {
			name     string
			put      int
			groups   int
			perBlock bool
		}{
			{"pieces", 64 << 10, 0, false},
			{"groups", 0, 4, false},
			{"per-block", 64 << 10, 0, true},
		} {
			t.Run(tr+"/"+tc.name, func(t *testing.T) {
				t.Setenv(channels.NetTransportEnv, tr)
				withCombUnitsPerBlock(t, tc.perBlock)
				withPutBytes(t, tc.put)
				withPutGroups(t, tc.groups)
				withHidden(t, 2048)
				checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 7500)
				checkCombineRounds(t, cudaBackend, internode.Topology{Nodes: 3, RanksPerNode: 2}, 7600)
			})
		}
		t.Run(tr+"/graph", func(t *testing.T) {
			t.Setenv(channels.NetTransportEnv, tr)
			withPutBytes(t, 64<<10)
			checkGraphReplays(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 7700, 60, internode.Split{Shared: true})
		})
		t.Run(tr+"/device-pointers", func(t *testing.T) {
			t.Setenv(channels.NetTransportEnv, tr)
			checkDeviceRounds(t, cudaBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 7800, false)
		})
	}
}

// ParseReduceUnits' forms and refusals, and the default by transport and
// rate.
func TestParseReduceUnits(t *testing.T) {
	for in, want := range map[string]internode.ReduceUnits{"units": internode.ReduceByUnits, " ON ": internode.ReduceByUnits,
		"1": internode.ReduceByUnits, "true": internode.ReduceByUnits,
		"off": internode.ReduceAfter, "0": internode.ReduceAfter, "false": internode.ReduceAfter} {
		got, err := internode.ParseReduceUnits(in, internode.ReduceByUnits+1)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		if in == strings.TrimSpace(in) && want.String() == in {
			require.Equal(t, in, got.String())
		}
	}
	for _, def := range []internode.ReduceUnits{internode.ReduceAfter, internode.ReduceByUnits} {
		got, err := internode.ParseReduceUnits("", def)
		require.NoError(t, err)
		require.Equal(t, def, got)
	}
	for _, bad := range []string{"yes", "2", "auto", "puts", "blocks"} {
		_, err := internode.ParseReduceUnits(bad, internode.ReduceAfter)
		require.ErrorContains(t, err, bad)
	}
}

// Ranks passing different ReduceUnits are refused at setup, naming the
// other config, instead of one side waiting for words the other never
// stores; a value out of range is refused on every rank.
func TestReduceUnitsDisagree(t *testing.T) {
	b := hostBackend
	topo := internode.Topology{Nodes: 2, RanksPerNode: 1}
	s := internode.Shape{Topology: topo, Hidden: 64, TopK: 2, Experts: 4}
	errs := runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		u := internode.ReduceAfter
		if c.Rank() == 1 {
			u = internode.ReduceByUnits
		}
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 77, MaxTokens: 4, ReduceUnits: u})
		if err == nil {
			return nt, errors.New("NewNotify accepted ranks with different ReduceUnits")
		}
		if !strings.Contains(err.Error(), "another shape or config") {
			return nil, fmt.Errorf("want a refusal naming the other config, got: %w", err)
		}
		return nil, nil
	})
	ranktest.NoErrors(t, errs)
	errs = runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		_, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 79, MaxTokens: 4, ReduceUnits: internode.ReduceByUnits + 1})
		if err == nil || !strings.Contains(err.Error(), "ReduceUnits(2)") {
			return nil, fmt.Errorf("want a refusal of ReduceUnits(2), got %v", err)
		}
		return nil, nil
	})
	ranktest.NoErrors(t, errs)
}

// withCombUnitsPerBlock sets the kernel's per-block units (its fallback)
// for the Notifys the test makes.
func withCombUnitsPerBlock(t *testing.T, on bool) {
	t.Helper()
	prev := internode.SetCombUnitsPerBlock(on)
	t.Cleanup(func() { internode.SetCombUnitsPerBlock(prev) })
}
