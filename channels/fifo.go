package channels

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// fifo is the proxy's end of a port channel FIFO (protocol in
// kernels/channel_abi.cuh, pushers in kernels/fifo_device.cuh): the ring,
// the tail and the done word live in one pinned host allocation mapped into
// the device, so the proxy polls them in its own memory while GPU threads
// write them across PCIe; head and the tail cache are device memory, where
// pushers' atomics stay on the GPU.
//
// Host layout: [0, 16*size) ring, then tail at ringEnd, done at ringEnd+64
// (separate cache lines: the proxy writes both, GPUs poll them).
type fifo struct {
	dev  device.Device
	size uint32
	host device.HostMapped // ring | tail | done
	ctr  device.Buffer     // head | tail cache
	// ring, tail and done are the host addresses of the words; next is the
	// position the proxy consumes next (owned by the proxy goroutine).
	ring, tail, done uintptr
	next             uint64
}

const fifoCtlBytes = 128

func newFifo(dev device.Device, size int) (_ *fifo, err error) {
	if size < 2 || size&(size-1) != 0 || size > 1<<20 {
		return nil, fmt.Errorf("FIFO size %d: want a power of two in [2, 2^20]", size)
	}
	f := &fifo{dev: dev, size: uint32(size)}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.free())
		}
	}()
	ringBytes := size * devapi.TriggerSize
	if f.host, err = dev.AllocHostMapped(ringBytes + fifoCtlBytes); err != nil {
		return nil, fmt.Errorf("FIFO ring: %w", err)
	}
	// Pinned memory comes uninitialised; a zero ring is one whose slots all
	// wait for lap 0's commit bit.
	clear(f.host.Host)
	f.ring = uintptr(unsafe.Pointer(&f.host.Host[0]))
	f.tail = f.ring + uintptr(ringBytes)
	f.done = f.tail + 64
	if f.ctr, err = dev.Alloc(16); err != nil {
		return nil, fmt.Errorf("FIFO head: %w", err)
	}
	if err = dev.CopyIn(f.ctr.Ptr, make([]byte, 16)); err != nil {
		return nil, fmt.Errorf("FIFO head: %w", err)
	}
	return f, nil
}

// handle is the goep_fifo kernels push into.
func (f *fifo) handle(watchdog uintptr) devapi.Fifo {
	ringBytes := uintptr(f.size) * devapi.TriggerSize
	return devapi.Fifo{
		Triggers:  f.host.Dev,
		Head:      f.ctr.Ptr,
		Tail:      f.host.Dev + ringBytes,
		TailCache: f.ctr.Ptr + 8,
		Done:      f.host.Dev + ringBytes + 64,
		Watchdog:  watchdog,
		Size:      f.size,
	}
}

// peek returns the trigger at position pos once both of its words carry
// pos's commit bit (the pusher's 16-byte store may arrive as two halves).
func (f *fifo) peek(pos uint64) (devapi.Trigger, bool) {
	slot := f.ring + uintptr(pos&uint64(f.size-1))*devapi.TriggerSize
	want := devapi.Commit(pos, f.size)
	w1 := devapi.U64(slot + 8).Load()
	if w1&devapi.TriggerCommit != want {
		return devapi.Trigger{}, false
	}
	w0 := devapi.U64(slot).Load()
	if w0&devapi.TriggerCommit != want {
		return devapi.Trigger{}, false
	}
	return devapi.DecodeTrigger(w0, w1), true
}

// consume publishes that every position below next has been read, which
// frees their slots for pushers.
func (f *fifo) consume(next uint64) {
	f.next = next
	devapi.U64(f.tail).Store(next)
}

// complete publishes that the flush at pos has been carried out.
func (f *fifo) complete(pos uint64) { devapi.U64(f.done).Store(pos + 1) }

func (f *fifo) free() error {
	var errs []error
	if f.ctr.Ptr != 0 {
		errs = append(errs, f.dev.Free(f.ctr))
		f.ctr = device.Buffer{}
	}
	if f.host.Host != nil {
		errs = append(errs, f.dev.FreeHostMapped(f.host))
		f.host = device.HostMapped{}
	}
	return errors.Join(errs...)
}
