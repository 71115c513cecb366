package channels

import (
	"sync/atomic"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
)

// hostConnection serves goroutine ranks of the host backend: peer memory is
// process memory, copies are immediate, and a token update is an atomic
// store that the peer's kernel twin, spinning with atomic loads, observes
// after the data (Go's memory model orders the copy before the store).
type hostConnection struct {
	*connBase
	lastBatch atomic.Int64 // when writeBatch last wrote, ns (hostHoldBatches)
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

// writeBatch writes ws one after another (host copies are done when they
// return; the proxy's batching runs the same on the host backend).
func (h *hostConnection) writeBatch(ws []batchedWrite) error {
	for _, w := range ws {
		if err := h.Write(w.dst, w.dstOff, w.src, w.srcOff, w.n); err != nil {
			return err
		}
	}
	h.lastBatch.Store(time.Now().UnixNano())
	return nil
}

// batchesInFlight: none, host writes land before they return; except that
// tests may make it claim batches in flight for hostHoldFor after each
// batch (hostHoldBatches), as a busy copy engine would, so that the
// proxy's puts gather into batches on the host backend too and a
// trigger carried out ahead of its batch shows.
func (h *hostConnection) batchesInFlight() (int, error) {
	if hostHoldBatches.Load() && time.Now().UnixNano()-h.lastBatch.Load() < int64(hostHoldFor) {
		return batchesAhead, nil
	}
	return 0, nil
}

// hostHoldFor is how long hostHoldBatches holds a connection's batches.
const hostHoldFor = 200 * time.Microsecond

// hostHoldBatches is the tests' switch for hostConnection.batchesInFlight.
var hostHoldBatches atomic.Bool

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
