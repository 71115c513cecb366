package channels

import (
	"github.com/goep-dev/goep/channels/devapi"
)

// Device handles as bytes. A user's own kernel (package userkernel) takes
// goep's channels the way goep's kernels do, as the structs of
// kernels/channel_abi.cuh; these are those structs' bytes, encoded by the
// one Go definition of the layout (channels/devapi, held to the header by
// its ABI tests), to put in arrays or structs of the user's own. Sizes:
// MemoryChannelHandleSize, PortChannelHandleSize, SemaphoreHandleSize.
const (
	// MemoryChannelHandleSize is sizeof(goep_memory_channel).
	MemoryChannelHandleSize = devapi.MemoryChannelSize
	// PortChannelHandleSize is sizeof(goep_port_channel).
	PortChannelHandleSize = devapi.PortChannelSize
	// SemaphoreHandleSize is sizeof(goep_semaphore).
	SemaphoreHandleSize = devapi.SemaphoreSize
)

// DeviceHandleBytes is the channel's goep_memory_channel
// (MemoryChannelHandleSize bytes); nil for a nil channel.
func (m *MemoryChannel) DeviceHandleBytes() []byte {
	if m == nil || m.sem == nil {
		return nil
	}
	return m.DeviceHandle().Bytes()
}

// DeviceHandleBytes is the channel's goep_port_channel
// (PortChannelHandleSize bytes); nil for a nil channel.
func (ch *PortChannel) DeviceHandleBytes() []byte {
	if ch == nil || ch.proxy == nil || ch.sem == nil {
		return nil
	}
	return ch.DeviceHandle().Bytes()
}

// DeviceHandleBytes is the semaphore's goep_semaphore
// (SemaphoreHandleSize bytes); nil for a nil semaphore.
func (s *MemorySemaphore) DeviceHandleBytes() []byte {
	if s == nil || s.c == nil {
		return nil
	}
	return s.DeviceHandle().Bytes()
}

// DeviceHandleBytes is the semaphore's goep_semaphore
// (SemaphoreHandleSize bytes; it can wait and poll, not signal); nil for a
// nil semaphore.
func (s *HostSemaphore) DeviceHandleBytes() []byte {
	if s == nil || s.c == nil {
		return nil
	}
	return s.DeviceHandle().Bytes()
}

// UploadHandleBytes copies handles of stride bytes each (DeviceHandleBytes
// of any kind, or structs of the caller's own) to device memory, in order,
// for kernels that index them; an empty entry becomes zeros.
func (c *Communicator) UploadHandleBytes(stride int, handles [][]byte) (*DeviceArray, error) {
	if c == nil {
		return nil, ErrClosed
	}
	if stride <= 0 || stride%8 != 0 {
		return nil, c.errorf("upload handles: stride %d is not a positive multiple of 8 bytes", stride)
	}
	if len(handles) > (1<<31-1)/stride {
		return nil, c.errorf("upload handles: %d handles of %d bytes overflow", len(handles), stride)
	}
	for i, h := range handles {
		if len(h) != 0 && len(h) != stride {
			return nil, c.errorf("upload handles: handle %d has %d bytes, not %d", i, len(h), stride)
		}
	}
	return c.upload(len(handles), stride, func(i int, b []byte) { copy(b, handles[i]) })
}
