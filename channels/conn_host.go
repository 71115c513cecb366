package channels

import "github.com/goep-dev/goep/channels/devapi"

// hostConnection serves goroutine ranks of the host backend: peer memory is
// process memory, copies are immediate, and a token update is an atomic
// store that the peer's kernel twin, spinning with atomic loads, observes
// after the data (Go's memory model orders the copy before the store).
type hostConnection struct {
	*connBase
}

func (h *hostConnection) Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if h == nil {
		return ErrNil
	}
	if err := h.checkWrite(dst, dstOff, src, srcOff, size); err != nil {
		return err
	}
	devapi.Copy(dst.Ptr()+uintptr(dstOff), src.Ptr()+uintptr(srcOff), uint64(size))
	return nil
}

func (h *hostConnection) UpdateAndSync(dst RegisteredMemory, dstOff int, value uint64) error {
	if h == nil {
		return ErrNil
	}
	if err := h.checkUpdate(dst, dstOff); err != nil {
		return err
	}
	devapi.U64(dst.Ptr() + uintptr(dstOff)).Store(value)
	return nil
}

func (h *hostConnection) AtomicAdd(dst RegisteredMemory, dstOff int, value uint64) error {
	if h == nil {
		return ErrNil
	}
	if err := h.checkWord("atomic add", dst, dstOff); err != nil {
		return err
	}
	devapi.U64(dst.Ptr() + uintptr(dstOff)).Add(value)
	return nil
}

func (h *hostConnection) Flush() error {
	if h == nil {
		return ErrNil
	}
	return h.usable()
}

// drain: host writes are done when they return.
func (h *hostConnection) drain() error { return nil }
