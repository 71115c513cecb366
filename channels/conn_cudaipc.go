package channels

import (
	"encoding/binary"

	"github.com/goep-dev/goep/internal/device"
)

// cudaIPCConnection moves bytes with the copy engines: Write is an
// asynchronous device-to-device copy on the connection's own stream into
// the peer's mapped memory, so a CPU proxy never needs an SM (kernels may
// occupy them all, spinning on the very tokens it updates).
type cudaIPCConnection struct {
	*connBase
	stream device.Stream
}

func (k *cudaIPCConnection) Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if err := k.checkWrite(dst, dstOff, src, srcOff, size); err != nil {
		return err
	}
	if err := k.c.dev.CopyAsync(dst.Ptr()+uintptr(dstOff), src.Ptr()+uintptr(srcOff), size, k.stream); err != nil {
		return k.errorf("write %d bytes: %w", size, err)
	}
	return nil
}

// UpdateAndSync waits for the connection's earlier copies, then stores the
// value with a synchronous host-to-device copy: the copy engine writes the
// aligned 8 bytes in one piece, after the data (the stream has drained), so
// a device that acquires the new token value sees the data. The Device
// interface has no asynchronous copy from host memory yet; with one this
// would be stream-ordered instead of blocking.
func (k *cudaIPCConnection) UpdateAndSync(dst RegisteredMemory, dstOff int, value uint64) error {
	if err := k.checkUpdate(dst, dstOff); err != nil {
		return err
	}
	if err := k.stream.Synchronize(); err != nil {
		return k.errorf("update: waiting for earlier writes: %w", err)
	}
	if err := k.c.dev.CopyIn(dst.Ptr()+uintptr(dstOff), binary.LittleEndian.AppendUint64(nil, value)); err != nil {
		return k.errorf("update: %w", err)
	}
	return nil
}

func (k *cudaIPCConnection) Flush() error {
	if err := k.usable(); err != nil {
		return err
	}
	if err := k.stream.Synchronize(); err != nil {
		return k.errorf("flush: %w", err)
	}
	return nil
}
