package channels

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/goep-dev/goep/channels/devapi"
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
	dev device.Device
	// The stream is made at the first operation: a job of goroutine ranks
	// sharing a GPU has a connection per pair of ranks, mostly unused, and
	// every stream beyond the GPU's hardware queues shares one with others
	// (in order: a spinning kernel ahead would hold a copy queued behind).
	streamMu     sync.Mutex
	stream       device.Stream
	sharedStream bool // the communicator's (connStream): not ours to close
	// memops is the stream as internal/cuda sees it, for stream memory
	// operations (nil when the Device does not expose its context).
	memops *cuda.Stream
	// noMemops is set once a stream write failed (memory operations not
	// supported by this driver or on this mapping): updates then take the
	// synchronous path for good.
	noMemops atomic.Bool
	// enqueued counts work put on the stream; idleAt is the count at the
	// last time the stream was seen idle. Equal, nothing is in flight and a
	// signal skips asking the driver (setHostToken).
	enqueued, idleAt atomic.Uint64
	// markEv is the proxy's flow-control mark in the stream (windowed),
	// made at the first mark; guarded by streamMu.
	markEv device.Event
}

func newCudaIPCConnection(base *connBase, dev device.Device) *cudaIPCConnection {
	k := &cudaIPCConnection{connBase: base, dev: dev}
	base.release = k.closeStream
	return k
}

// streams returns the connection's stream (made now if it was not) and its
// memory-operations view.
func (k *cudaIPCConnection) streams() (device.Stream, *cuda.Stream, error) {
	k.streamMu.Lock()
	defer k.streamMu.Unlock()
	if k.stream == nil {
		s, shared, err := k.c.connStream()
		if err != nil {
			return nil, nil, k.errorf("stream: %w", err)
		}
		k.stream, k.sharedStream = s, shared
		// A wrapper of a device (the Buffer's accounting one) may have the
		// method and no context: then no memory operations (callers fall
		// back to a copy or a kernel, as where memops is nil).
		if cd, ok := k.dev.(interface{ Context() *cuda.Context }); ok && cd.Context() != nil {
			k.memops = cuda.WrapStream(cd.Context(), s.Handle())
		}
	}
	return k.stream, k.memops, nil
}

// syncStream waits for the stream, if there is one yet.
func (k *cudaIPCConnection) syncStream() error {
	k.streamMu.Lock()
	s := k.stream
	k.streamMu.Unlock()
	if s == nil {
		return nil
	}
	return s.Synchronize()
}

func (k *cudaIPCConnection) closeStream() error {
	k.streamMu.Lock()
	defer k.streamMu.Unlock()
	if k.stream == nil {
		return nil
	}
	var errs []error
	if k.markEv != nil {
		errs = append(errs, k.markEv.Close())
		k.markEv = nil
	}
	if !k.sharedStream {
		errs = append(errs, k.stream.Close())
	}
	k.stream, k.memops = nil, nil
	return errors.Join(errs...)
}

// mark records the proxy's flow-control mark after the work queued so far
// (windowed). Work queued later may run on while the proxy waits for it.
func (k *cudaIPCConnection) mark() error {
	stream, _, err := k.streams()
	if err != nil {
		return err
	}
	k.streamMu.Lock()
	defer k.streamMu.Unlock()
	if k.markEv == nil {
		if k.markEv, err = k.c.dev.NewEvent(); err != nil {
			k.markEv = nil
			return k.errorf("flow-control mark: %w", err)
		}
	}
	if err := k.markEv.Record(stream); err != nil {
		return k.errorf("flow-control mark: %w", err)
	}
	return nil
}

// waitMark waits until the work queued before the last mark has landed
// (the whole queue when no mark was recorded).
func (k *cudaIPCConnection) waitMark() error {
	k.streamMu.Lock()
	ev := k.markEv
	k.streamMu.Unlock()
	if ev == nil {
		return k.syncStream()
	}
	if err := ev.Synchronize(); err != nil {
		return k.errorf("flow-control wait: %w", err)
	}
	return nil
}

func (k *cudaIPCConnection) Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if k == nil {
		return ErrNil
	}
	if err := k.checkWrite(dst, dstOff, src, srcOff, size); err != nil {
		return err
	}
	stream, _, err := k.streams()
	if err != nil {
		return err
	}
	k.enqueued.Add(1)
	if err := k.c.dev.CopyAsync(dst.Ptr()+uintptr(dstOff), src.Ptr()+uintptr(srcOff), size, stream); err != nil {
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
	if k == nil {
		return ErrNil
	}
	if err := k.checkUpdate(dst, dstOff); err != nil {
		return err
	}
	p := dst.Ptr() + uintptr(dstOff)
	_, memops, err := k.streams()
	if err != nil {
		return err
	}
	if memops != nil && !k.noMemops.Load() {
		k.enqueued.Add(1)
		if err := memops.WriteValue64(cuda.DevicePtr(p), value, cuda.WriteValueDefault); err == nil {
			return nil
		}
		k.noMemops.Store(true)
	}
	if err := k.syncStream(); err != nil {
		return k.errorf("update: waiting for earlier writes: %w", err)
	}
	if err := k.c.dev.CopyIn(p, binary.LittleEndian.AppendUint64(nil, value)); err != nil {
		return k.errorf("update: %w", err)
	}
	return nil
}

// settled reports, without waiting, whether every operation queued on the
// connection's stream has finished (the proxy's flow control: settler).
func (k *cudaIPCConnection) settled() bool {
	n := k.enqueued.Load()
	if n == k.idleAt.Load() {
		return true
	}
	_, memops, err := k.streams()
	if err != nil || memops == nil {
		return false
	}
	if idle, err := memops.Query(); err == nil && idle {
		k.idleAt.Store(n)
		return true
	}
	return false
}

// setHostToken raises a token in shared host memory (host_tokens.go) to v,
// after every earlier Write of the connection. With nothing in flight on
// the connection's stream it is one CPU store, visible to the polling GPU
// at once; otherwise a stream write of the same word queued behind the
// copies (never a store racing a queued write: a store happens only once
// the stream, and so every earlier write to the token, has finished).
func (k *cudaIPCConnection) setHostToken(t hostToken, v uint64) error {
	if err := k.usable(); err != nil {
		return err
	}
	n := k.enqueued.Load()
	if n == k.idleAt.Load() {
		t.store(v)
		return nil
	}
	_, memops, err := k.streams()
	if err != nil {
		return err
	}
	if memops != nil {
		// Work enqueued after n was read is not covered by this query.
		if idle, err := memops.Query(); err == nil && idle {
			k.idleAt.Store(n)
			t.store(v)
			return nil
		}
		if !k.noMemops.Load() {
			k.enqueued.Add(1)
			if err := memops.WriteValue64(cuda.DevicePtr(t.dev), v, cuda.WriteValueDefault); err == nil {
				return nil
			}
			k.noMemops.Store(true)
		}
	}
	if err := k.syncStream(); err != nil {
		return k.errorf("update: waiting for earlier writes: %w", err)
	}
	k.idleAt.Store(n)
	t.store(v)
	return nil
}

// AtomicAdd launches goep_proxy_atomic_add (kernels/proxy_kernels.cu) on
// the connection's stream: stream order puts it after the earlier copies.
func (k *cudaIPCConnection) AtomicAdd(dst RegisteredMemory, dstOff int, value uint64) error {
	if k == nil {
		return ErrNil
	}
	if err := k.checkWord("atomic add", dst, dstOff); err != nil {
		return err
	}
	stream, _, err := k.streams()
	if err != nil {
		return err
	}
	args := device.NewArgs(2).Ptr(dst.Ptr() + uintptr(dstOff)).U64(value)
	k.enqueued.Add(1)
	if err := k.c.dev.Launch(devapi.KernelProxyAtomicAdd, device.D1(1), device.D1(1), 0, stream, args); err != nil {
		return k.errorf("atomic add: %w", err)
	}
	return nil
}

func (k *cudaIPCConnection) Flush() error {
	if k == nil {
		return ErrNil
	}
	if err := k.usable(); err != nil {
		return err
	}
	if err := k.syncStream(); err != nil {
		return k.errorf("flush: %w", err)
	}
	return nil
}

// drain waits for the stream whether or not the communicator still accepts
// calls (a stopping proxy must not leave copies running).
func (k *cudaIPCConnection) drain() error {
	if err := k.syncStream(); err != nil {
		return k.errorf("drain: %w", err)
	}
	return nil
}

// connStream is a new stream for a connection, or, when several ranks share
// this rank's GPU (Placement), the communicator's one stream for all of its
// connections: every stream beyond the GPU's hardware queues shares an
// in-order queue with others, and a proxy's copy or atomic add queued there
// behind another rank's spinning kernel would wait for the very kernel that
// waits for it. One stream per rank keeps 8 ranks on one GPU well within
// the queues, at the cost of ordering this rank's copies to different peers
// (which share one GPU's copy engines anyway).
func (c *Communicator) connStream() (s device.Stream, shared bool, err error) {
	c.placeMu.Lock()
	sharedGPU := c.placement != nil && len(c.placement.SharedGPU) > 1
	c.placeMu.Unlock()
	if !sharedGPU {
		s, err = c.dev.NewStream()
		return s, false, err
	}
	c.sharedConnMu.Lock()
	defer c.sharedConnMu.Unlock()
	if c.sharedConnStream == nil {
		if c.sharedConnStream, err = c.dev.NewStream(); err != nil {
			return nil, false, err
		}
	}
	return c.sharedConnStream, true, nil
}
