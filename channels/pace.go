package channels

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// An emulated line rate (NetworkConfig.EmulatedGBps) makes the port over
// CUDA IPC between virtual nodes behave like a NIC of that speed: the
// copy engine moves 350 GB/s or so between two H200s, several times a
// 400 Gb/s NIC, so without a cap the "network" leg of an internode call is
// as fast as the NVLink and HBM copies around it and nothing measures
// whether the kernels keep a NIC-speed link busy (issue 14's goal on a real
// NIC). The cap is a rank's, over all its network connections together, as
// one NIC per GPU carries all of them.
//
// The proxy paces when it issues: a put is cut into pieces of paceBytes
// for the rate, and each piece is issued no earlier than the pacer's slot
// for it. A piece then lands a few microseconds after its slot (the copy
// engine is much faster than the cap), so bytes arrive at the rate, in
// issue order; signals and atomic adds, a few bytes each, are not paced.

// Bounds of NetworkConfig.EmulatedGBps.
const (
	minEmulatedGBps = 0.1
	maxEmulatedGBps = 10000
)

// paceSlice is the time a paced piece takes at the rate: long enough that
// the copy engine's own cost a copy (about 3 us) stays well inside it,
// short enough that a put's first bytes land soon after it is issued.
const paceSlice = 25 * time.Microsecond

// Bounds of a paced piece.
const (
	minPaceBytes = 64 << 10
	maxPaceBytes = 16 << 20
)

// pacer hands out issue slots at a byte rate. It is safe for concurrent
// use: several proxies of a rank share one.
type pacer struct {
	nsPerByte float64
	piece     int
	base      time.Time
	// next is when the link is free again, in ns since base: a piece
	// reserved now starts at max(next, now).
	next atomic.Int64
	// now and sleep stand for the clock (tests replace them).
	now   func() int64
	sleep func(d time.Duration)
}

// newPacer returns a pacer for gbps (10^9 bytes a second), or nil for 0.
func newPacer(gbps float64) (*pacer, error) {
	if gbps == 0 {
		return nil, nil
	}
	if err := checkEmulatedGBps(gbps); err != nil {
		return nil, err
	}
	p := &pacer{nsPerByte: 1 / gbps, piece: paceBytes(gbps), base: time.Now()}
	p.now = func() int64 { return int64(time.Since(p.base)) }
	p.sleep = time.Sleep
	return p, nil
}

// checkEmulatedGBps validates a rate: 0 (off) or minEmulatedGBps to
// maxEmulatedGBps.
func checkEmulatedGBps(gbps float64) error {
	if gbps == 0 {
		return nil
	}
	if math.IsNaN(gbps) || gbps < minEmulatedGBps || gbps > maxEmulatedGBps {
		return fmt.Errorf("EmulatedGBps %v: want 0 (off) or %v to %v GB/s", gbps, minEmulatedGBps, maxEmulatedGBps)
	}
	return nil
}

// paceBytes is the piece a put is cut into at gbps: paceSlice's worth,
// within [minPaceBytes, maxPaceBytes] and a multiple of 4 KiB.
func paceBytes(gbps float64) int {
	b := gbps * float64(paceSlice.Nanoseconds())
	b = min(max(b, minPaceBytes), maxPaceBytes)
	return int(b) &^ (4<<10 - 1)
}

// reserve books n bytes on the link and returns when they may be issued
// (ns since base).
func (p *pacer) reserve(n int) int64 {
	d := int64(math.Ceil(float64(n) * p.nsPerByte))
	for {
		now, old := p.now(), p.next.Load()
		start := max(old, now)
		if p.next.CompareAndSwap(old, start+d) {
			return start
		}
	}
}

// wait returns at or after t (ns since base): sleeping while more than a
// sleep's granularity remains, then spinning, as the proxy's thread is its
// own (a sleep can overshoot by tens of microseconds).
func (p *pacer) wait(t int64) {
	const spinBelow = 200 * time.Microsecond
	for {
		left := time.Duration(t - p.now())
		switch {
		case left <= 0:
			return
		case left > spinBelow:
			p.sleep(left - spinBelow)
		}
	}
}

// write issues size bytes of a put as paced pieces through write, each
// after the pacer's slot for it; the pieces cover [0, size) in order.
func (p *pacer) write(size int, write func(off, n int) error) error {
	if size == 0 {
		return write(0, 0)
	}
	for off := 0; off < size; {
		n := min(p.piece, size-off)
		p.wait(p.reserve(n))
		if err := write(off, n); err != nil {
			return err
		}
		off += n
	}
	return nil
}
