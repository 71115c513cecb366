package channels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// watchdog owns the communicator's goep_watchdog (device memory: spins read
// the timeout and abort flag there, next to them, not across PCIe) and its
// goep_timeout_record (host-mapped: the host reads it without a copy or a
// synchronisation while kernels run).
type watchdog struct {
	dev device.Device
	buf device.Buffer
	rec device.HostMapped
}

func newWatchdog(dev device.Device, timeout time.Duration) (*watchdog, error) {
	rec, err := dev.AllocHostMapped(devapi.TimeoutRecordSize)
	if err != nil {
		return nil, fmt.Errorf("timeout record: %w", err)
	}
	clear(rec.Host) // pinned memory comes uninitialised
	buf, err := dev.Alloc(devapi.WatchdogSize)
	if err != nil {
		_ = dev.FreeHostMapped(rec)
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	w := &watchdog{dev: dev, buf: buf, rec: rec}
	b := make([]byte, devapi.WatchdogSize)
	devapi.Watchdog{TimeoutNS: uint64(timeout), Record: rec.Dev}.Encode(b)
	if err := dev.CopyIn(buf.Ptr, b); err != nil {
		return nil, errors.Join(fmt.Errorf("watchdog: %w", err), w.free())
	}
	return w, nil
}

// record returns the timeout record once a device thread has published it.
func (w *watchdog) record() (devapi.TimeoutRecord, bool) {
	// The device writes state last with release at system scope; an atomic
	// load here keeps the reads of the other fields after it.
	state := (*atomic.Uint32)(unsafe.Pointer(&w.rec.Host[devapi.RecordState])).Load()
	if state == devapi.TimeoutNone {
		return devapi.TimeoutRecord{}, false
	}
	var snap [devapi.TimeoutRecordSize]byte
	for i := 0; i < devapi.TimeoutRecordSize; i += 4 {
		binary.LittleEndian.PutUint32(snap[i:], (*atomic.Uint32)(unsafe.Pointer(&w.rec.Host[i])).Load())
	}
	return devapi.DecodeTimeoutRecord(snap[:]), true
}

func (w *watchdog) setTimeout(d time.Duration) error {
	return w.store64(w.buf.Ptr+devapi.WatchdogTimeoutNS, uint64(d))
}

func (w *watchdog) abort() error {
	return w.store32(w.buf.Ptr+devapi.WatchdogAbort, devapi.AbortHost)
}

// Host-backend kernels run in other goroutines and read these words with
// atomics, so the host backend stores them atomically; on a GPU a
// synchronous copy is the store.
func (w *watchdog) store64(p uintptr, v uint64) error {
	if w.dev.Info().Kind == device.Host {
		devapi.U64(p).Store(v)
		return nil
	}
	return w.dev.CopyIn(p, binary.LittleEndian.AppendUint64(nil, v))
}

func (w *watchdog) store32(p uintptr, v uint32) error {
	if w.dev.Info().Kind == device.Host {
		devapi.U32(p).Store(v)
		return nil
	}
	return w.dev.CopyIn(p, binary.LittleEndian.AppendUint32(nil, v))
}

func (w *watchdog) free() error {
	return errors.Join(w.dev.Free(w.buf), w.dev.FreeHostMapped(w.rec))
}

func opName(op uint32) string { return devapi.OpName(op) }
