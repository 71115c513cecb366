package channels

import (
	"encoding/binary"
	"errors"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// PacketBuffer is a registered scratch buffer that peers send LL packets
// into, with its flag counter (goep_ll_flag) in device memory. Kernels
// advance the counter once per launch (goep_ll_flag_begin/end), so the
// buffer never needs clearing, also inside CUDA graphs replayed any number
// of times. It starts zeroed; flags start at 1.
type PacketBuffer struct {
	c     *Communicator
	buf   device.Buffer
	mem   RegisteredMemory
	flag  slot
	freed bool
}

// NewPacketBuffer allocates, zeroes and registers a packet buffer of size
// bytes (a multiple of 16, the LL16 packet size). A kernel that runs one
// round ahead of its peer needs twice the bytes of one round (goep_ll_half).
func (c *Communicator) NewPacketBuffer(size int) (*PacketBuffer, error) {
	if c == nil {
		var r0 *PacketBuffer
		return r0, ErrNil
	}
	if size <= 0 || size%devapi.LL16Size != 0 {
		return nil, c.errorf("packet buffer of %d bytes: want a positive multiple of %d", size, devapi.LL16Size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return nil, err
	}
	buf, err := c.dev.Alloc(size)
	if err != nil {
		return nil, c.errorf("packet buffer: %w", err)
	}
	p := &PacketBuffer{c: c, buf: buf}
	if err = zero(c.dev, buf.Ptr, size); err == nil {
		if p.mem, err = c.registerLocked(buf); err == nil {
			p.flag, err = c.locals.alloc()
		}
	}
	if err != nil {
		return nil, errors.Join(c.errorf("packet buffer: %w", err), c.dev.Free(buf))
	}
	c.packets = append(c.packets, p)
	return p, nil
}

// Memory is the buffer's registered memory, to send to the peers that put
// packets into it (their MemoryChannelConfig.RemotePackets).
func (p *PacketBuffer) Memory() RegisteredMemory {
	if p == nil {
		var r0 RegisteredMemory
		return r0
	}
	return p.mem
}

// Size is the buffer's length in bytes.
func (p *PacketBuffer) Size() int {
	if p == nil {
		var r0 int
		return r0
	}
	return p.buf.Size
}

// FlagPtr is the device address of the buffer's goep_ll_flag.
func (p *PacketBuffer) FlagPtr() uintptr {
	if p == nil {
		var r0 uintptr
		return r0
	}
	return p.flag.ptr
}

// Flag reads the flag counter: the flag of the last launch that finished
// with this buffer (0 before the first).
func (p *PacketBuffer) Flag() (uint32, error) {
	if p == nil {
		var r0 uint32
		return r0, ErrNil
	}
	if err := p.c.usable(); err != nil {
		return 0, err
	}
	if p.c.kind == device.Host {
		return devapi.U32(p.flag.ptr + devapi.LLFlagValue).Load(), nil
	}
	var b [4]byte
	if err := p.c.dev.CopyOut(b[:], p.flag.ptr+devapi.LLFlagValue); err != nil {
		return 0, p.c.errorf("read packet flag: %w", err)
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// Close frees the buffer now (the communicator's Close does otherwise).
// Peers must no longer write into it.
func (p *PacketBuffer) Close() error {
	if p == nil {
		return ErrNil
	}
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.freeLocked()
}

func (p *PacketBuffer) freeLocked() error {
	if p.freed {
		return nil
	}
	p.freed = true
	return p.c.dev.Free(p.buf)
}
