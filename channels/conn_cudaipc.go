package channels

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// cudaIPCConnection moves bytes with the copy engines: Write is an
// asynchronous device-to-device copy on the connection's own stream into
// the peer's mapped memory, so a CPU proxy never needs an SM (kernels may
// occupy them all, spinning on the very tokens it updates). AtomicAdd is
// the exception: a one-thread kernel on the same stream.
type cudaIPCConnection struct {
	*connBase
	stream device.Stream
	// memops is the stream as internal/cuda sees it, for stream memory
	// operations (nil when the Device does not expose its context).
	memops *cuda.Stream
	// noMemops is set once a stream write failed (memory operations not
	// supported by this driver or on this mapping): updates then take the
	// synchronous path for good.
	noMemops atomic.Bool
}

func newCudaIPCConnection(base *connBase, dev device.Device, s device.Stream) *cudaIPCConnection {
	k := &cudaIPCConnection{connBase: base, stream: s}
	if cd, ok := dev.(interface{ Context() *cuda.Context }); ok {
		k.memops = cuda.WrapStream(cd.Context(), s.Handle())
	}
	return k
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

// UpdateAndSync queues a 64-bit stream write of the value behind the
// connection's earlier copies (cuStreamWriteValue64: the driver puts a
// memory barrier before it, so a device that acquires the new token value
// sees the data, and the 8 bytes land in one piece). It does not block,
// which is what keeps a port channel's signal at a few microseconds.
//
// Where stream memory operations are unavailable it waits for the earlier
// copies, then stores the value with a synchronous host-to-device copy
// (the copy engine writes the aligned 8 bytes in one piece, after the data).
func (k *cudaIPCConnection) UpdateAndSync(dst RegisteredMemory, dstOff int, value uint64) error {
	if err := k.checkUpdate(dst, dstOff); err != nil {
		return err
	}
	p := dst.Ptr() + uintptr(dstOff)
	if k.memops != nil && !k.noMemops.Load() {
		if err := k.memops.WriteValue64(cuda.DevicePtr(p), value, cuda.WriteValueDefault); err == nil {
			return nil
		}
		k.noMemops.Store(true)
	}
	if err := k.stream.Synchronize(); err != nil {
		return k.errorf("update: waiting for earlier writes: %w", err)
	}
	if err := k.c.dev.CopyIn(p, binary.LittleEndian.AppendUint64(nil, value)); err != nil {
		return k.errorf("update: %w", err)
	}
	return nil
}

// AtomicAdd launches goep_proxy_atomic_add (kernels/proxy_kernels.cu) on
// the connection's stream: stream order puts it after the earlier copies.
func (k *cudaIPCConnection) AtomicAdd(dst RegisteredMemory, dstOff int, value uint64) error {
	if err := k.checkWord("atomic add", dst, dstOff); err != nil {
		return err
	}
	args := device.NewArgs(2).Ptr(dst.Ptr() + uintptr(dstOff)).U64(value)
	if err := k.c.dev.Launch("goep_proxy_atomic_add", device.D1(1), device.D1(1), 0, k.stream, args); err != nil {
		return k.errorf("atomic add: %w", err)
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

// drain waits for the stream whether or not the communicator still accepts
// calls (a stopping proxy must not leave copies running).
func (k *cudaIPCConnection) drain() error {
	if err := k.stream.Synchronize(); err != nil {
		return k.errorf("drain: %w", err)
	}
	return nil
}
