package channels

import (
	"errors"

	"github.com/goep-dev/goep/internal/device"
)

// slotArena hands out small zeroed slots of device memory (semaphore
// tokens, expected counters, LL flag counters) from chunks allocated as
// needed, so that a semaphore does not cost an allocation (nor, for tokens,
// an IPC export and a peer import). Slots live until the communicator
// closes: a slot reused while a peer could still signal into it would
// receive a stale signal.
type slotArena struct {
	c         *Communicator
	slot      int
	chunkSize int
	exported  bool // chunks are registered so that peers can map them
	chunks    []arenaChunk
}

type arenaChunk struct {
	buf  device.Buffer
	mem  RegisteredMemory // valid when exported
	used int
}

// slot is one slot: its address here and, for exported arenas, the
// registered memory a peer opens to reach it.
type slot struct {
	ptr uintptr
	mem RegisteredMemory
}

func newSlotArena(c *Communicator, slotSize, chunkSize int, exported bool) *slotArena {
	return &slotArena{c: c, slot: slotSize, chunkSize: chunkSize, exported: exported}
}

// alloc returns a zeroed slot. The caller holds c.mu.
func (a *slotArena) alloc() (slot, error) {
	if n := len(a.chunks); n == 0 || a.chunks[n-1].used+a.slot > a.chunkSize {
		if err := a.grow(); err != nil {
			return slot{}, err
		}
	}
	ch := &a.chunks[len(a.chunks)-1]
	off := ch.used
	ch.used += a.slot
	s := slot{ptr: ch.buf.Ptr + uintptr(off)}
	if a.exported {
		var err error
		if s.mem, err = ch.mem.Slice(off, a.slot); err != nil {
			return slot{}, err
		}
	}
	return s, nil
}

func (a *slotArena) grow() error {
	dev := a.c.dev
	buf, err := dev.Alloc(a.chunkSize)
	if err != nil {
		return err
	}
	if err := zero(dev, buf.Ptr, buf.Size); err != nil {
		return errors.Join(err, dev.Free(buf))
	}
	ch := arenaChunk{buf: buf}
	if a.exported {
		if ch.mem, err = a.c.registerLocked(buf); err != nil {
			return errors.Join(err, dev.Free(buf))
		}
	}
	a.chunks = append(a.chunks, ch)
	return nil
}

func (a *slotArena) free() error {
	var errs []error
	for _, ch := range a.chunks {
		if err := a.c.dev.Free(ch.buf); err != nil {
			errs = append(errs, err)
		}
	}
	a.chunks = nil
	return errors.Join(errs...)
}

// zero clears n bytes of a fresh allocation at p and waits for it, so
// memory handed out is zero before any kernel or peer can see it.
func zero(dev device.Device, p uintptr, n int) error {
	if dev.Info().Kind == device.Host {
		return nil // fresh anonymous mmap pages are zero
	}
	if err := dev.MemsetAsync(p, 0, n, nil); err != nil {
		return err
	}
	return dev.DefaultStream().Synchronize()
}
