package internode

import (
	"fmt"
	"strconv"
	"strings"
)

// Limits of the internode protocol as designed (DESIGN.md).
const (
	// MaxRanksPerNode bounds a node to one NVLink domain: a forwarder's
	// target local ranks travel as an 8-bit mask with each token.
	MaxRanksPerNode = 8
	// MaxNodes bounds the nodes: a token's destination nodes fit one 64-bit
	// mask on the GPU.
	MaxNodes = 64
)

// VirtualNodesEnv is the environment variable that splits one host into
// virtual nodes; the same name as channels.VirtualNodesEnv, which makes the
// network transport carry the cross-node traffic.
const VirtualNodesEnv = "GOEP_VIRTUAL_NODES"

// Topology is how the ranks of an internode group fall into nodes: rank r
// is local rank r % RanksPerNode of node r / RanksPerNode (nodes of
// consecutive ranks, all the same size, as DeepEP requires). Ranks of one
// node reach each other over NVLink; ranks of different nodes only over
// the network, and only between ranks of the same local index.
type Topology struct {
	Nodes        int
	RanksPerNode int
}

func (t Topology) String() string {
	return fmt.Sprintf("%d nodes x %d ranks", t.Nodes, t.RanksPerNode)
}

// Validate checks 1..MaxNodes nodes of 1..MaxRanksPerNode ranks.
func (t Topology) Validate() error {
	switch {
	case t.Nodes < 1 || t.Nodes > MaxNodes:
		return fmt.Errorf("internode: topology %v: nodes must be 1..%d", t, MaxNodes)
	case t.RanksPerNode < 1 || t.RanksPerNode > MaxRanksPerNode:
		return fmt.Errorf("internode: topology %v: ranks per node must be 1..%d (one NVLink domain)", t, MaxRanksPerNode)
	}
	return nil
}

// World is the number of ranks, Nodes*RanksPerNode (0 for an invalid
// topology, whose product could overflow).
func (t Topology) World() int {
	if t.Validate() != nil {
		return 0
	}
	return t.Nodes * t.RanksPerNode
}

// Node is rank's node (-1 on a topology that does not validate).
func (t Topology) Node(rank int) int {
	if t.Validate() != nil {
		return -1
	}
	return rank / t.RanksPerNode
}

// Local is rank's index inside its node (-1 on a topology that does not
// validate).
func (t Topology) Local(rank int) int {
	if t.Validate() != nil {
		return -1
	}
	return rank % t.RanksPerNode
}

// Rank is the rank of local index local on node (-1 on a topology that
// does not validate).
func (t Topology) Rank(node, local int) int {
	if t.Validate() != nil {
		return -1
	}
	return node*t.RanksPerNode + local
}

// Forwarder is the rank of node that receives src's tokens over the
// network and forwards them over NVLink: the one with src's local index
// (src itself when node is src's node).
func (t Topology) Forwarder(src, node int) int { return t.Rank(node, t.Local(src)) }

// NewTopology checks that world ranks split into nodes of ranksPerNode.
func NewTopology(world, ranksPerNode int) (Topology, error) {
	if ranksPerNode < 1 || world < 1 || world%ranksPerNode != 0 {
		return Topology{}, fmt.Errorf("internode: %d ranks do not split into nodes of %d", world, ranksPerNode)
	}
	t := Topology{Nodes: world / ranksPerNode, RanksPerNode: ranksPerNode}
	return t, t.Validate()
}

// VirtualNodes splits the world ranks of one host into k virtual nodes of
// consecutive ranks; k must divide world.
func VirtualNodes(world, k int) (Topology, error) {
	switch {
	case world < 1:
		return Topology{}, fmt.Errorf("internode: %d virtual nodes of %d ranks: no ranks", k, world)
	case k < 1 || world%k != 0:
		return Topology{}, fmt.Errorf("internode: %d virtual nodes do not divide %d ranks", k, world)
	}
	t := Topology{Nodes: k, RanksPerNode: world / k}
	if err := t.Validate(); err != nil {
		return Topology{}, fmt.Errorf("internode: %d virtual nodes of %d ranks: %w", k, world, err)
	}
	return t, nil
}

// ParseVirtualNodes reads a virtual-node count (the value of
// $GOEP_VIRTUAL_NODES) for world ranks of one host. Empty or "0" means no
// split: one node holding every rank.
func ParseVirtualNodes(s string, world int) (Topology, error) {
	s = strings.TrimSpace(s)
	k := 0
	if s != "" {
		var err error
		if k, err = strconv.Atoi(s); err != nil || k < 0 {
			return Topology{}, fmt.Errorf("internode: virtual nodes %q (%s): want a count that divides %d ranks", s, VirtualNodesEnv, world)
		}
	}
	if k == 0 {
		k = 1
	}
	t, err := VirtualNodes(world, k)
	if err != nil {
		return Topology{}, fmt.Errorf("%w (%s=%q)", err, VirtualNodesEnv, s)
	}
	return t, nil
}

// FromNodeOf turns a rank-to-node map (channels.Topology.NodeOf) into a
// Topology: nodes must be consecutive ranks, numbered in order, all the
// same size.
func FromNodeOf(nodeOf []int) (Topology, error) {
	if len(nodeOf) == 0 {
		return Topology{}, fmt.Errorf("internode: empty rank-to-node map")
	}
	per := 0
	for per < len(nodeOf) && nodeOf[per] == nodeOf[0] {
		per++
	}
	t, err := NewTopology(len(nodeOf), per)
	if err != nil {
		return Topology{}, fmt.Errorf("internode: nodes of %d ranks (node 0's size) over %d ranks: %w", per, len(nodeOf), err)
	}
	for r, n := range nodeOf {
		if n != t.Node(r) {
			return Topology{}, fmt.Errorf("internode: rank %d is on node %d, want %d: nodes must be consecutive ranks of %d, numbered in order", r, n, t.Node(r), per)
		}
	}
	return t, nil
}
