package channels

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
)

// Topology is how the ranks of a job fall into nodes. Ranks of one node
// reach each other's memory directly (CUDA IPC, NVLink; or host memory);
// ranks of different nodes only over the network transport. A node is a
// host (for the host backend: a process) unless NetworkConfig.VirtualNodes
// splits the ranks into that many nodes of consecutive ranks, each on one
// host, whose traffic to each other is then forced over the network.
type Topology struct {
	// NodeOf is each rank's node; nodes are numbered in the order of their
	// lowest rank.
	NodeOf []int
	// Nodes is the number of nodes.
	Nodes int
	// VirtualNodes is the configured split (0: nodes are hosts).
	VirtualNodes int
	// Network is the transport between nodes.
	Network Transport
}

// Node is rank's node (-1 outside the job).
func (t Topology) Node(rank int) int {
	if rank < 0 || rank >= len(t.NodeOf) {
		return -1
	}
	return t.NodeOf[rank]
}

// SameNode reports whether ranks a and b share a node.
func (t Topology) SameNode(a, b int) bool { return t.Node(a) >= 0 && t.Node(a) == t.Node(b) }

// Ranks lists the ranks of node, ascending.
func (t Topology) Ranks(node int) []int {
	var out []int
	for r, n := range t.NodeOf {
		if n == node {
			out = append(out, r)
		}
	}
	return out
}

// RanksPerNode is the number of ranks of every node, or 0 when nodes
// differ in size.
func (t Topology) RanksPerNode() int {
	if t.Nodes == 0 {
		return 0
	}
	per := len(t.Ranks(0))
	for n := 1; n < t.Nodes; n++ {
		if len(t.Ranks(n)) != per {
			return 0
		}
	}
	return per
}

// topoInfo is what each rank tells the others in Topology.
type topoInfo struct {
	locality [16]byte
	vnodes   uint32
	network  uint8
	sockets  uint32
}

const topoMsgSize = 25

func (p topoInfo) marshal() []byte {
	b := append([]byte(nil), p.locality[:]...)
	b = binary.LittleEndian.AppendUint32(b, p.vnodes)
	b = append(b, p.network)
	return binary.LittleEndian.AppendUint32(b, p.sockets)
}

// Topology learns every rank's node (collective on the first call of
// every rank; later calls return the same result). It fails when the ranks
// disagree on the network configuration (naming the field and the ranks on
// each side) or when a virtual node spans hosts.
func (c *Communicator) Topology(ctx context.Context) (Topology, error) {
	if c == nil {
		return Topology{}, ErrNil
	}
	c.net.topoMu.Lock()
	defer c.net.topoMu.Unlock()
	if c.net.topo != nil {
		return *c.net.topo, nil
	}
	if err := c.usable(); err != nil {
		return Topology{}, err
	}
	cfg := c.net.cfg
	mine := topoInfo{locality: c.net.locality, vnodes: uint32(cfg.VirtualNodes), network: uint8(cfg.Transport), sockets: uint32(cfg.Sockets)}
	all := make([]topoInfo, c.size)
	all[c.rank] = mine
	var peers []int
	for p := 0; p < c.size; p++ {
		if p != c.rank {
			peers = append(peers, p)
		}
	}
	msg := mine.marshal()
	theirs, err := c.exchange(ctx, kindTopology, 0, peers, func(int) []byte { return msg })
	if err != nil {
		return Topology{}, err
	}
	for i, m := range theirs {
		if len(m) != topoMsgSize {
			return Topology{}, c.errorf("topology: rank %d sent %d bytes", peers[i], len(m))
		}
		var p topoInfo
		copy(p.locality[:], m[:16])
		p.vnodes = binary.LittleEndian.Uint32(m[16:])
		p.network = m[20]
		p.sockets = binary.LittleEndian.Uint32(m[21:])
		all[peers[i]] = p
	}
	for _, f := range []struct {
		name  string
		value func(topoInfo) string
	}{
		{"VirtualNodes", func(p topoInfo) string { return fmt.Sprint(p.vnodes) }},
		{"Transport", func(p topoInfo) string { return Transport(p.network).String() }},
		{"Sockets", func(p topoInfo) string { return fmt.Sprint(p.sockets) }},
	} {
		if err := agree(all, f.name, f.value); err != nil {
			return Topology{}, c.errorf("topology: %w", err)
		}
	}
	t := Topology{NodeOf: make([]int, c.size), VirtualNodes: cfg.VirtualNodes, Network: cfg.Transport}
	if k := cfg.VirtualNodes; k > 0 {
		t.Nodes = k
		for r := range t.NodeOf {
			t.NodeOf[r] = virtualNode(r, c.size, k)
		}
		for n := 0; n < k; n++ {
			ranks := t.Ranks(n)
			for _, r := range ranks[1:] {
				if all[r].locality != all[ranks[0]].locality {
					return Topology{}, c.errorf("topology: virtual node %d (ranks %d-%d) spans hosts (or, on the host backend, processes): rank %d and rank %d are on different ones; every virtual node must be on one host",
						n, ranks[0], ranks[len(ranks)-1], ranks[0], r)
				}
			}
		}
	} else {
		ids := map[[16]byte]int{}
		for r, p := range all {
			id, ok := ids[p.locality]
			if !ok {
				id = len(ids)
				ids[p.locality] = id
			}
			t.NodeOf[r] = id
		}
		t.Nodes = len(ids)
	}
	c.net.topo = &t
	return t, nil
}

// agree checks that every rank has the same value of a field, naming the
// ranks of each value otherwise.
func agree(all []topoInfo, field string, value func(topoInfo) string) error {
	by := map[string][]int{}
	for r, p := range all {
		v := value(p)
		by[v] = append(by[v], r)
	}
	if len(by) == 1 {
		return nil
	}
	var parts []string
	for v, ranks := range by {
		parts = append(parts, fmt.Sprintf("%s on ranks %v", v, ranks))
	}
	sort.Strings(parts)
	return fmt.Errorf("Network.%s differs between ranks: %s", field, strings.Join(parts, ", "))
}
