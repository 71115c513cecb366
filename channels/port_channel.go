package channels

import (
	"context"
	"fmt"

	"github.com/goep-dev/goep/channels/devapi"
)

// PortChannel joins this rank to one peer through a Proxy: kernels push
// put, signal, flush and atomic-add triggers through its device handle
// (kernels/port_device.cuh) and the proxy carries them out on the
// connection of its host-to-device semaphore, whose token the peer's proxy
// signals and this rank's kernels wait on. It is plain data; the proxy and
// the communicator own its resources.
type PortChannel struct {
	proxy    *Proxy
	sem      *HostSemaphore
	index    uint32 // the channel field of its triggers
	id       uint32 // communicator-wide id (timeout records)
	dst, src MemoryID
}

// NewPortChannel adds a channel over sem (whose connection carries the
// channel's work) to the proxy. dst is the default destination of puts and
// atomic adds (memory of sem's peer, or this rank's for a loopback), src
// the default source of puts (this rank's memory); kernels may name other
// ids of the proxy explicitly. A proxy serves up to 1024 channels.
func (p *Proxy) NewPortChannel(sem *HostSemaphore, dst, src MemoryID) (*PortChannel, error) {
	if p == nil {
		var r0 *PortChannel
		return r0, ErrNil
	}
	if sem == nil {
		return nil, p.errorf("port channel: no semaphore")
	}
	if sem.c != p.c {
		return nil, p.errorf("port channel: the semaphore belongs to another communicator")
	}
	peer := sem.Peer()
	dm, ok := p.Memory(dst)
	if !ok {
		return nil, p.errorf("port channel to rank %d: no memory id %d", peer, dst)
	}
	sm, ok := p.Memory(src)
	if !ok {
		return nil, p.errorf("port channel to rank %d: no memory id %d", peer, src)
	}
	if dm.Rank() != peer && !dm.IsLocal() {
		return nil, p.errorf("port channel to rank %d: destination %v is not the peer's memory", peer, dm)
	}
	if !sm.IsLocal() {
		return nil, p.errorf("port channel to rank %d: source %v is not this rank's memory", peer, sm)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, p.errorf("%w", ErrClosed)
	}
	old := p.table.Load()
	if len(old.chans) >= devapi.TriggerMaxChannels {
		return nil, p.errorf("port channel to rank %d: the proxy already serves %d channels", peer, len(old.chans))
	}
	ch := &PortChannel{proxy: p, sem: sem, index: uint32(len(old.chans)), dst: dst, src: src}
	c := p.c
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	ch.id = c.newIDLocked("")
	c.names[ch.id] = fmt.Sprintf("port channel %d to rank %d (tag %d)", ch.id, peer, sem.conn.Tag())
	c.mu.Unlock()
	p.table.Store(&proxyTable{mems: old.mems, chans: append(old.chans[:len(old.chans):len(old.chans)], ch)})
	return ch, nil
}

func (ch *PortChannel) String() string {
	if ch == nil {
		var r0 string
		return r0
	}
	return fmt.Sprintf("port channel %d to rank %d", ch.id, ch.Peer())
}

// Peer is the rank at the other end.
func (ch *PortChannel) Peer() int {
	if ch == nil {
		var r0 int
		return r0
	}
	return ch.sem.Peer()
}

// ID is the channel's communicator-wide id: timeout records of its waits
// (FIFO pushes, flushes, semaphore waits) carry it.
func (ch *PortChannel) ID() uint32 {
	if ch == nil {
		var r0 uint32
		return r0
	}
	return ch.id
}

// Semaphore is the channel's host-to-device semaphore.
func (ch *PortChannel) Semaphore() *HostSemaphore {
	if ch == nil {
		var r0 *HostSemaphore
		return r0
	}
	return ch.sem
}

// Proxy is the proxy that serves the channel.
func (ch *PortChannel) Proxy() *Proxy {
	if ch == nil {
		var r0 *Proxy
		return r0
	}
	return ch.proxy
}

// Dst and Src are the channel's default memory ids.
func (ch *PortChannel) Dst() MemoryID {
	if ch == nil {
		var r0 MemoryID
		return r0
	}
	return ch.dst
}

// Src is the default source of puts.
func (ch *PortChannel) Src() MemoryID {
	if ch == nil {
		var r0 MemoryID
		return r0
	}
	return ch.src
}

// DeviceHandle is the goep_port_channel kernels receive
// (UploadPortChannels). Its semaphore carries the channel's id.
func (ch *PortChannel) DeviceHandle() devapi.PortChannel {
	if ch == nil {
		var r0 devapi.PortChannel
		return r0
	}
	h := devapi.PortChannel{
		Fifo:    ch.proxy.fifo.handle(ch.proxy.c.wd.buf.Ptr),
		Sem:     ch.sem.DeviceHandle(),
		Channel: ch.index,
		Dst:     uint32(ch.dst),
		Src:     uint32(ch.src),
	}
	h.Sem.ID = ch.id
	return h
}

// UploadPortChannels copies the channels' handles to device memory, in
// order; a nil entry becomes a zero handle (kernels can test fifo.triggers).
func (c *Communicator) UploadPortChannels(chs []*PortChannel) (*DeviceArray, error) {
	if c == nil {
		var r0 *DeviceArray
		return r0, ErrNil
	}
	return c.upload(len(chs), devapi.PortChannelSize, func(i int, b []byte) {
		if chs[i] != nil {
			chs[i].DeviceHandle().Encode(b)
		}
	})
}

// PortMeshConfig describes port channels from this rank to a set of peers.
type PortMeshConfig struct {
	// Tag pairs the mesh with the peers' meshes (theirs must use the same).
	Tag int
	// Peers are the ranks to connect to; nil means every other rank.
	Peers []int
	// Local is this rank's registered memory: every channel's default
	// source, and every peer's default destination on its channel to this
	// rank.
	Local RegisteredMemory
}

// PortMesh is the result of NewPortChannelMesh; slices are indexed like
// Peers.
type PortMesh struct {
	Peers       []int
	Connections []Connection
	Semaphores  []*HostSemaphore
	Channels    []*PortChannel
	Remote      []RegisteredMemory // each peer's Local
	LocalID     MemoryID
	RemoteIDs   []MemoryID
}

// ByRank returns the channels in a slice indexed by rank, nil where there
// is none.
func (m *PortMesh) ByRank(size int) []*PortChannel {
	if m == nil {
		var r0 []*PortChannel
		return r0
	}
	// A size too small for the mesh's peers leaves them out rather than
	// indexing past the slice.
	out := make([]*PortChannel, max(size, 0))
	for i, p := range m.Peers {
		if p >= 0 && p < len(out) && i < len(m.Channels) {
			out[p] = m.Channels[i]
		}
	}
	return out
}

// NewPortChannelMesh exchanges cfg.Local with every peer, connects,
// builds one host-to-device semaphore and one port channel per peer on this
// proxy, with the peer's memory as destination and cfg.Local as source.
// Every rank in cfg.Peers calls it with the same tag; exchanges go to all
// peers before waiting on any.
func (p *Proxy) NewPortChannelMesh(ctx context.Context, cfg PortMeshConfig) (*PortMesh, error) {
	if p == nil {
		var r0 *PortMesh
		return r0, ErrNil
	}
	c := p.c
	peers := cfg.Peers
	if peers == nil {
		for r := 0; r < c.size; r++ {
			if r != c.rank {
				peers = append(peers, r)
			}
		}
	}
	if len(peers) == 0 {
		return nil, p.errorf("port channel mesh: no peers")
	}
	if !cfg.Local.Valid() || !cfg.Local.IsLocal() {
		return nil, p.errorf("port channel mesh: Local must be this rank's registered memory, not %v", cfg.Local)
	}
	m := &PortMesh{Peers: peers, RemoteIDs: make([]MemoryID, len(peers)), Channels: make([]*PortChannel, len(peers))}
	var err error
	if m.Remote, err = c.ExchangeMemory(ctx, cfg.Local, peers, cfg.Tag); err != nil {
		return nil, err
	}
	if m.Connections, err = c.ConnectAll(ctx, peers, cfg.Tag); err != nil {
		return nil, err
	}
	if m.Semaphores, err = c.NewHostSemaphores(ctx, m.Connections); err != nil {
		return nil, err
	}
	if m.LocalID, err = p.AddMemory(cfg.Local); err != nil {
		return nil, err
	}
	for i := range peers {
		if m.RemoteIDs[i], err = p.AddMemory(m.Remote[i]); err != nil {
			return nil, err
		}
		if m.Channels[i], err = p.NewPortChannel(m.Semaphores[i], m.RemoteIDs[i], m.LocalID); err != nil {
			return nil, err
		}
	}
	return m, nil
}
