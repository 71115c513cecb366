package internode_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internode"
)

func TestTopologyValidate(t *testing.T) {
	for _, tc := range []struct {
		top internode.Topology
		ok  bool
	}{
		{internode.Topology{Nodes: 1, RanksPerNode: 1}, true},
		{internode.Topology{Nodes: 2, RanksPerNode: 8}, true},
		{internode.Topology{Nodes: 64, RanksPerNode: 8}, true},
		{internode.Topology{Nodes: 0, RanksPerNode: 4}, false},
		{internode.Topology{Nodes: 2, RanksPerNode: 0}, false},
		{internode.Topology{Nodes: 2, RanksPerNode: 9}, false},
		{internode.Topology{Nodes: 65, RanksPerNode: 1}, false},
		{internode.Topology{Nodes: -1, RanksPerNode: -1}, false},
	} {
		err := tc.top.Validate()
		if tc.ok {
			require.NoError(t, err, "%v", tc.top)
			require.Equal(t, tc.top.Nodes*tc.top.RanksPerNode, tc.top.World())
		} else {
			require.Error(t, err, "%v", tc.top)
			require.Zero(t, tc.top.World(), "%v", tc.top)
		}
	}
}

func TestTopologyRanks(t *testing.T) {
	top := internode.Topology{Nodes: 3, RanksPerNode: 4}
	for r := 0; r < top.World(); r++ {
		n, l := top.Node(r), top.Local(r)
		require.Equal(t, r/4, n)
		require.Equal(t, r%4, l)
		require.Equal(t, r, top.Rank(n, l))
		for node := 0; node < 3; node++ {
			f := top.Forwarder(r, node)
			require.Equal(t, node, top.Node(f), "forwarder of rank %d on node %d", r, node)
			require.Equal(t, l, top.Local(f), "forwarder keeps the local index")
		}
		require.Equal(t, r, top.Forwarder(r, n), "own node: the source forwards itself")
	}
}

func TestVirtualNodes(t *testing.T) {
	top, err := internode.VirtualNodes(8, 2)
	require.NoError(t, err)
	require.Equal(t, internode.Topology{Nodes: 2, RanksPerNode: 4}, top)
	top, err = internode.VirtualNodes(8, 4)
	require.NoError(t, err)
	require.Equal(t, internode.Topology{Nodes: 4, RanksPerNode: 2}, top)

	_, err = internode.VirtualNodes(8, 3)
	require.ErrorContains(t, err, "3 virtual nodes do not divide 8 ranks")
	_, err = internode.VirtualNodes(6, 0)
	require.ErrorContains(t, err, "0 virtual nodes do not divide 6 ranks")
	_, err = internode.VirtualNodes(0, 1)
	require.Error(t, err)
	_, err = internode.VirtualNodes(18, 2)
	require.ErrorContains(t, err, "ranks per node must be 1..8", "9 ranks per node exceed one NVLink domain")

	for _, tc := range []struct {
		s     string
		world int
		want  internode.Topology
		err   string
	}{
		{"", 4, internode.Topology{Nodes: 1, RanksPerNode: 4}, ""},
		{"0", 4, internode.Topology{Nodes: 1, RanksPerNode: 4}, ""},
		{" 2 ", 4, internode.Topology{Nodes: 2, RanksPerNode: 2}, ""},
		{"4", 8, internode.Topology{Nodes: 4, RanksPerNode: 2}, ""},
		{"3", 8, internode.Topology{}, `3 virtual nodes do not divide 8 ranks (GOEP_VIRTUAL_NODES="3")`},
		{"16", 8, internode.Topology{}, "16 virtual nodes do not divide 8 ranks"},
		{"x", 8, internode.Topology{}, `virtual nodes "x" (GOEP_VIRTUAL_NODES): want a count that divides 8 ranks`},
		{"-2", 8, internode.Topology{}, `virtual nodes "-2"`},
	} {
		got, err := internode.ParseVirtualNodes(tc.s, tc.world)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%q", tc.s)
			continue
		}
		require.NoError(t, err, "%q", tc.s)
		require.Equal(t, tc.want, got, "%q", tc.s)
	}
}

func TestFromNodeOf(t *testing.T) {
	top, err := internode.FromNodeOf([]int{0, 0, 0, 1, 1, 1})
	require.NoError(t, err)
	assert.Equal(t, internode.Topology{Nodes: 2, RanksPerNode: 3}, top)
	top, err = internode.FromNodeOf([]int{0})
	require.NoError(t, err)
	assert.Equal(t, internode.Topology{Nodes: 1, RanksPerNode: 1}, top)
	for _, bad := range [][]int{nil, {0, 0, 1}, {0, 1, 0, 1}, {1, 1, 0, 0}, {0, 0, 2, 2}} {
		_, err := internode.FromNodeOf(bad)
		assert.Error(t, err, "%v", bad)
	}
	_, err = internode.FromNodeOf([]int{0, 1, 0, 1})
	assert.ErrorContains(t, err, "rank 2 is on node 0, want 2")
}
