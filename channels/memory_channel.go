package channels

import (
	"fmt"

	"github.com/goep-dev/goep/channels/devapi"
)

// MemoryChannelConfig is what a memory channel moves data between. Each
// field is optional; a kernel must not use what the channel lacks.
type MemoryChannelConfig struct {
	// Remote is the peer's memory: put writes it, get reads it.
	Remote RegisteredMemory
	// Local is this rank's memory: put reads it, get and unpack write it.
	Local RegisteredMemory
	// RemotePackets is the peer's packet buffer (its PacketBuffer.Memory),
	// which LL packets are put into.
	RemotePackets RegisteredMemory
	// LocalPackets is this rank's packet buffer, which the peer puts LL
	// packets into and this rank unpacks; its flag counter becomes the
	// channel's flag.
	LocalPackets *PacketBuffer
}

// MemoryChannel joins this rank to one peer over mapped memory (NVLink):
// kernels put, get, send LL packets and signal/wait through its device
// handle (kernels/channel_device.cuh). It is plain data: nothing to flush,
// nothing to close beyond the communicator.
type MemoryChannel struct {
	sem *MemorySemaphore
	cfg MemoryChannelConfig
	id  uint32
}

// NewMemoryChannel builds a memory channel on sem with the memory of cfg.
func NewMemoryChannel(sem *MemorySemaphore, cfg MemoryChannelConfig) (*MemoryChannel, error) {
	if sem == nil {
		return nil, fmt.Errorf("channels: NewMemoryChannel needs a semaphore")
	}
	c, peer := sem.c, sem.Peer()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return nil, err
	}
	fromPeer := func(m RegisteredMemory) bool { return !m.Valid() || m.Rank() == peer }
	switch {
	case !fromPeer(cfg.Remote):
		return nil, c.errorf("memory channel to rank %d: Remote is %v, not the peer's memory", peer, cfg.Remote)
	case cfg.Local.Valid() && !cfg.Local.IsLocal():
		return nil, c.errorf("memory channel to rank %d: Local is %v, not this rank's memory", peer, cfg.Local)
	case !fromPeer(cfg.RemotePackets):
		return nil, c.errorf("memory channel to rank %d: RemotePackets is %v, not the peer's memory", peer, cfg.RemotePackets)
	case cfg.RemotePackets.Valid() && (cfg.RemotePackets.Ptr()%devapi.LL16Size != 0 || cfg.RemotePackets.Size()%devapi.LL16Size != 0):
		return nil, c.errorf("memory channel to rank %d: RemotePackets %v is not 16-byte aligned and sized", peer, cfg.RemotePackets)
	case cfg.LocalPackets != nil && (cfg.LocalPackets.c != c || cfg.LocalPackets.freed):
		return nil, c.errorf("memory channel to rank %d: LocalPackets belongs to another communicator or was closed", peer)
	}
	ch := &MemoryChannel{sem: sem, cfg: cfg}
	ch.id = c.newIDLocked("")
	c.names[ch.id] = fmt.Sprintf("memory channel %d to rank %d (tag %d)", ch.id, peer, sem.conn.Tag())
	return ch, nil
}

// Peer is the rank at the other end.
func (m *MemoryChannel) Peer() int {
	if m == nil {
		var r0 int
		return r0
	}
	return m.sem.Peer()
}

// ID is the channel's communicator-wide id: timeout records of waits on
// the channel carry it.
func (m *MemoryChannel) ID() uint32 {
	if m == nil {
		var r0 uint32
		return r0
	}
	return m.id
}

// Semaphore is the channel's semaphore.
func (m *MemoryChannel) Semaphore() *MemorySemaphore {
	if m == nil {
		var r0 *MemorySemaphore
		return r0
	}
	return m.sem
}

// Config is the memory the channel was built with.
func (m *MemoryChannel) Config() MemoryChannelConfig {
	if m == nil {
		var r0 MemoryChannelConfig
		return r0
	}
	return m.cfg
}

// DeviceHandle is the goep_memory_channel kernels receive
// (UploadMemoryChannels). Its semaphore carries the channel's id.
func (m *MemoryChannel) DeviceHandle() devapi.MemoryChannel {
	if m == nil {
		var r0 devapi.MemoryChannel
		return r0
	}
	h := devapi.MemoryChannel{
		Sem:               m.sem.DeviceHandle(),
		Remote:            m.cfg.Remote.Ptr(),
		Local:             m.cfg.Local.Ptr(),
		RemotePackets:     m.cfg.RemotePackets.Ptr(),
		RemoteSize:        uint64(m.cfg.Remote.Size()),
		LocalSize:         uint64(m.cfg.Local.Size()),
		RemotePacketsSize: uint64(m.cfg.RemotePackets.Size()),
	}
	h.Sem.ID = m.id
	if p := m.cfg.LocalPackets; p != nil {
		h.LocalPackets = p.mem.Ptr()
		h.LocalPacketsSize = uint64(p.Size())
		h.Flag = p.flag.ptr
	}
	return h
}
