package channels

import (
	"context"
	"encoding/binary"
)

// MeshConfig describes memory channels from this rank to a set of peers,
// all over the same kind of memory.
type MeshConfig struct {
	// Tag pairs the mesh with the peers' meshes (theirs must use the same).
	Tag int
	// Peers are the ranks to connect to; nil means every other rank.
	Peers []int
	// Local is this rank's registered memory: every channel's Local, and
	// every peer's Remote on its channel to this rank. Optional.
	Local RegisteredMemory
	// Packets is this rank's packet buffer: every channel's LocalPackets,
	// and every peer's RemotePackets on its channel to this rank. Optional.
	Packets *PacketBuffer
}

// Mesh is the result of NewMemoryChannelMesh; slices are indexed like
// Peers.
type Mesh struct {
	Peers         []int
	Connections   []Connection
	Semaphores    []*MemorySemaphore
	Channels      []*MemoryChannel
	Remote        []RegisteredMemory // each peer's Local
	RemotePackets []RegisteredMemory // each peer's packet buffer
}

// ByRank returns the channels in a slice indexed by rank, nil where there
// is none (this rank's own slot), the layout kernels usually index.
func (m *Mesh) ByRank(size int) []*MemoryChannel {
	if m == nil {
		var r0 []*MemoryChannel
		return r0
	}
	// A size too small for the mesh's peers leaves them out rather than
	// indexing past the slice.
	out := make([]*MemoryChannel, max(size, 0))
	for i, p := range m.Peers {
		if p >= 0 && p < len(out) && i < len(m.Channels) {
			out[p] = m.Channels[i]
		}
	}
	return out
}

// NewMemoryChannelMesh connects to every peer, exchanges the memory of cfg
// and builds one semaphore and one memory channel per peer. Every rank in
// cfg.Peers must call it with this rank among its peers and the same tag;
// the exchanges go to all peers before waiting on any, so any set of ranks
// can build meshes in any order.
func (c *Communicator) NewMemoryChannelMesh(ctx context.Context, cfg MeshConfig) (*Mesh, error) {
	if c == nil {
		var r0 *Mesh
		return r0, ErrNil
	}
	peers := cfg.Peers
	if peers == nil {
		for r := 0; r < c.size; r++ {
			if r != c.rank {
				peers = append(peers, r)
			}
		}
	}
	if len(peers) == 0 {
		return nil, c.errorf("memory channel mesh: no peers")
	}
	if err := c.usable(); err != nil {
		return nil, err
	}
	msg, err := meshMessage(cfg)
	if err != nil {
		return nil, c.errorf("memory channel mesh: %w", err)
	}
	theirs, err := c.exchange(ctx, kindMemory, cfg.Tag, peers, func(int) []byte { return msg })
	if err != nil {
		return nil, err
	}
	m := &Mesh{Peers: peers, Remote: make([]RegisteredMemory, len(peers)), RemotePackets: make([]RegisteredMemory, len(peers))}
	for i, p := range peers {
		if m.Remote[i], m.RemotePackets[i], err = c.openMeshMessage(p, cfg.Tag, theirs[i]); err != nil {
			return nil, err
		}
	}
	if m.Connections, err = c.ConnectAll(ctx, peers, cfg.Tag); err != nil {
		return nil, err
	}
	if m.Semaphores, err = c.NewMemorySemaphores(ctx, m.Connections); err != nil {
		return nil, err
	}
	m.Channels = make([]*MemoryChannel, len(peers))
	for i := range peers {
		m.Channels[i], err = NewMemoryChannel(m.Semaphores[i], MemoryChannelConfig{
			Remote: m.Remote[i], Local: cfg.Local, RemotePackets: m.RemotePackets[i], LocalPackets: cfg.Packets})
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Mesh message: two length-prefixed serialised memories (length 0: none).
func meshMessage(cfg MeshConfig) ([]byte, error) {
	var out []byte
	for _, m := range []RegisteredMemory{cfg.Local, packetMemory(cfg.Packets)} {
		var b []byte
		if m.Valid() {
			var err error
			if b, err = m.MarshalBinary(); err != nil {
				return nil, err
			}
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out, nil
}

func packetMemory(p *PacketBuffer) RegisteredMemory {
	if p == nil {
		return RegisteredMemory{}
	}
	return p.mem
}

func (c *Communicator) openMeshMessage(peer, tag int, msg []byte) (local, packets RegisteredMemory, err error) {
	var out [2]RegisteredMemory
	for i := range out {
		if len(msg) < 4 || int(binary.LittleEndian.Uint32(msg)) > len(msg)-4 {
			return out[0], out[1], c.errorf("memory channel mesh with rank %d (tag %d): malformed message", peer, tag)
		}
		n := int(binary.LittleEndian.Uint32(msg))
		if n > 0 {
			if out[i], err = c.OpenMemory(msg[4 : 4+n]); err != nil {
				return out[0], out[1], err
			}
			if out[i].Rank() != peer {
				return out[0], out[1], c.errorf("memory channel mesh with rank %d (tag %d): it sent memory of rank %d", peer, tag, out[i].Rank())
			}
		}
		msg = msg[4+n:]
	}
	return out[0], out[1], nil
}
