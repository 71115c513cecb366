package channels

import (
	"fmt"
	"os"
	"strings"

	"github.com/goep-dev/goep/internal/device"
)

// Puts in batches. A copy engine pauses after every copy of a stream
// before it starts the next one: about 2.6 us a copy between two H200s, so
// 58.7 MB cut into 256 copies took 827 us against 156 us in one, while
// the same 256 pieces issued as one cuMemcpyBatchAsync took 156 us
// (internal/cuda's TestCopyBatchLab, session 23). So the proxy gathers
// consecutive puts on a connection that can write a batch (batchWriter)
// and issues them as one: a batch's writes land in no particular order
// among themselves, which is safe because the proxy batches only writes
// whose destinations overlap no other write of the batch, nor any of its
// sources, and issues the batch before any other operation on that
// connection (a signal, an atomic add, a flush, a put with a signal), so
// whatever follows a put in the FIFO still lands after it.
//
// When to issue: at once while the connection has fewer than
// batchesAhead batches in flight (its copy engine would otherwise run dry),
// else when one of them lands (the proxy checks while it polls). Puts that
// arrive while the engine is busy so join one batch instead of queueing
// behind it one by one.

// batchWriter is a connection that can issue several writes as one
// operation after every earlier one (cudaIPCConnection,
// hostConnection).
type batchWriter interface {
	Connection
	// writeBatch queues ws as one batch; their destinations must not
	// overlap each other nor their sources.
	writeBatch(ws []batchedWrite) error
	// batchesInFlight is how many of the last batchesAhead batches have
	// not landed.
	batchesInFlight() (int, error)
}

// batchedWrite is one put of a batch.
type batchedWrite struct {
	dst, src          RegisteredMemory
	dstOff, srcOff, n int
}

// Bounds of a batch.
const (
	batchesAhead    = 2
	maxBatchWrites  = 64
	proxyBatchEnv   = "GOEP_PROXY_BATCH"
	proxyBatchOffOK = "off"
)

// proxyBatchFromEnv reads $GOEP_PROXY_BATCH: unset or "on" batches puts,
// "off" issues every put alone (for measurements).
func proxyBatchFromEnv() (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(proxyBatchEnv))); v {
	case "", "on", "1":
		return true, nil
	case proxyBatchOffOK, "0":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want on or off", proxyBatchEnv, v)
	}
}

// openBatch is the puts gathered for one connection and not yet issued.
type openBatch struct {
	conn   batchWriter
	writes []batchedWrite
}

// span is a byte range of memory [lo, hi).
type span struct{ lo, hi uintptr }

func (s span) overlaps(t span) bool { return s.lo < t.hi && t.lo < s.hi }

func (w batchedWrite) dstSpan() span {
	p := w.dst.Ptr() + uintptr(w.dstOff)
	return span{p, p + uintptr(w.n)}
}

func (w batchedWrite) srcSpan() span {
	p := w.src.Ptr() + uintptr(w.srcOff)
	return span{p, p + uintptr(w.n)}
}

// fits reports whether w may join b: room left, and w's destination
// overlaps no write's destination or source in b, nor w's source any
// destination (the writes of a batch land in no particular order).
func (b *openBatch) fits(w batchedWrite) bool {
	if len(b.writes) >= maxBatchWrites {
		return false
	}
	d, s := w.dstSpan(), w.srcSpan()
	for _, x := range b.writes {
		xd := x.dstSpan()
		if d.overlaps(xd) || d.overlaps(x.srcSpan()) || s.overlaps(xd) {
			return false
		}
	}
	return true
}

// copies is the batch as device copies.
func copiesOf(ws []batchedWrite) []device.Copy {
	out := make([]device.Copy, len(ws))
	for i, w := range ws {
		out[i] = device.Copy{Dst: w.dst.Ptr() + uintptr(w.dstOff), Src: w.src.Ptr() + uintptr(w.srcOff), N: w.n}
	}
	return out
}
