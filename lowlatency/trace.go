package lowlatency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/goep-dev/goep/internal/device"
)

// The phase trace, for measurement only. Kernels compiled with
// -DGOEP_LL_TRACE=1 (internal/kernelflags: $GOEP_LL_TRACE, `ep-bench
// lowlatency --trace`) have thread 0 of every block stamp %globaltimer at
// its phase points, each after the barrier that ends the phase where there
// is one (the whole block finished it), into the control block's trace
// region (CtrlTrace). The default build writes nothing there: the region
// stays zero. One record per (kernel, block), overwritten by the next
// launch of that kernel; its tag names the call (set, epoch), so a reader
// tells a stale record (a block the last launch did not run) from a fresh
// one. Stamps are per GPU: comparable across the blocks of one rank, not
// across GPUs (their clocks are not calibrated against each other).
const (
	// TraceBlocks bounds the blocks that record (blocks at or above it
	// record nothing): every GPU grid is capped by the GPU's SMs.
	TraceBlocks = 1024
	// TraceSlots are the u64 of one block's record: the tag, the work
	// counts, then one stamp per event.
	TraceSlots = 16
	traceHead  = 2
	// TraceBytes is the trace region's size: both kernels.
	TraceBytes = 2 * TraceBlocks * TraceSlots * 8
)

// Trace events (GOEP_LL_EV_* in kernels/lowlatency.cu): the index of a
// name is its slot. Events 0-3 belong to the send step, 4.. to the receive
// step; entry is the kernel's start in a launch with the send step,
// recv_entry its start in a receive-only launch (split calls; a Both
// launch has no recv_entry). exit is the end of the launch's last step.
var (
	// DispatchEvents: send_gate (freed waits done), send_issued (every
	// send unit's stores issued, before the fence), send_signalled (fence
	// done and arrival shares issued), recv_gate (arrivals seen), tables
	// (weights and positions of the tables: expert-major after the barrier
	// that follows them; rank-major thread 0's share only), scan (the
	// block's last expert's position scan and tab_row), copy (the
	// expansion copy, the barrier before the final fence), recv_fenced
	// (system fence and done count), exit (freed shares issued).
	DispatchEvents = []string{"entry", "send_gate", "send_issued", "send_signalled", "recv_entry", "recv_gate",
		"tables", "scan", "copy", "recv_fenced", "exit"}
	// CombineEvents: as dispatch's, with reduced (the owner's sums, the
	// barrier before the final fence).
	CombineEvents = []string{"entry", "send_gate", "send_issued", "send_signalled", "recv_entry", "recv_gate",
		"reduced", "recv_fenced", "exit"}
)

// recvEntry is the first receive event of both kernels.
const recvEntry = 4

// BlockTrace is one block's record.
type BlockTrace struct {
	Block int
	// Tag is the raw tag; Epoch, Set, Phases decode it (Epoch: the call's
	// epoch on its set, 1 for the first call on a set).
	Tag    uint64
	Epoch  uint64
	Set    int
	Phases Phase
	// SendWork: send units with rows to move (dispatch: (token, slice)
	// units of tokens sent anywhere; combine: (token, slice) units with a
	// local expert). RecvWork: rows copied into the expert-major layout
	// (dispatch) or (token, slice) units summed (combine).
	SendWork, RecvWork int
	// Stamps are %globaltimer nanoseconds per event (0: not reached).
	Stamps []uint64
}

// KernelTrace is one kernel's records on one rank.
type KernelTrace struct {
	Kernel string   // KernelDispatch or KernelCombine
	Events []string // DispatchEvents or CombineEvents
	// Blocks are the blocks with a record (any tag), ascending.
	Blocks []BlockTrace
}

// Trace is a rank's trace: both kernels' last launches.
type Trace struct {
	Dispatch, Combine KernelTrace
}

// ParseTrace decodes a trace region (TraceBytes, little-endian u64).
func ParseTrace(raw []byte) (Trace, error) {
	if len(raw) != TraceBytes {
		return Trace{}, fmt.Errorf("lowlatency: trace of %d bytes, want %d", len(raw), TraceBytes)
	}
	var t Trace
	for k, kt := range []*KernelTrace{&t.Dispatch, &t.Combine} {
		kt.Kernel, kt.Events = KernelDispatch, DispatchEvents
		if k == 1 {
			kt.Kernel, kt.Events = KernelCombine, CombineEvents
		}
		for b := 0; b < TraceBlocks; b++ {
			rec := raw[(k*TraceBlocks+b)*TraceSlots*8:]
			u := func(i int) uint64 { return binary.LittleEndian.Uint64(rec[8*i:]) }
			tag := u(0)
			if tag == 0 {
				continue
			}
			if tag>>63 == 0 || int(tag>>56&15) != k+1 {
				return Trace{}, fmt.Errorf("lowlatency: trace of %s, block %d: malformed tag %#x", kt.Kernel, b, tag)
			}
			bt := BlockTrace{Block: b, Tag: tag, Epoch: tag & (1<<48 - 1), Set: int(tag >> 48 & 15), Phases: Phase(tag >> 52 & 15),
				SendWork: int(uint32(u(1))), RecvWork: int(u(1) >> 32), Stamps: make([]uint64, len(kt.Events))}
			for e := range bt.Stamps {
				bt.Stamps[e] = u(traceHead + e)
			}
			kt.Blocks = append(kt.Blocks, bt)
		}
	}
	return t, nil
}

// ReadTrace copies this rank's trace region to the host and decodes it.
// Synchronous; synchronise the stream of the calls to read first.
func (w *Workspace) ReadTrace(dev device.Device) (Trace, error) {
	if w == nil || dev == nil {
		return Trace{}, errors.New("lowlatency: trace: nil workspace or device")
	}
	raw := make([]byte, TraceBytes)
	if err := dev.CopyOut(raw, w.TracePtr()); err != nil {
		return Trace{}, fmt.Errorf("lowlatency: rank %d: read the trace: %w", w.Rank, err)
	}
	t, err := ParseTrace(raw)
	if err != nil {
		return Trace{}, fmt.Errorf("lowlatency: rank %d: %w", w.Rank, err)
	}
	return t, nil
}

// TracePtr is the device address of this rank's trace region (TraceBytes).
func (w *Workspace) TracePtr() uintptr {
	if w == nil {
		return 0
	}
	return w.Base + uintptr(w.Layout.Ctrl.Offset+CtrlTrace)
}

// Latest is the blocks whose record is of the kernel's last launch: block
// 0's tag (every launch runs block 0). Records of other blocks with
// another tag are stale (a later launch ran a smaller grid).
func (k KernelTrace) Latest() []BlockTrace {
	if len(k.Blocks) == 0 || k.Blocks[0].Block != 0 {
		return nil
	}
	var out []BlockTrace
	for _, b := range k.Blocks {
		if b.Tag == k.Blocks[0].Tag {
			out = append(out, b)
		}
	}
	return out
}

// Base is the earliest start stamp (entry, else recv_entry) of the last
// launch's blocks, 0 when none: the origin of Summary.
func (k KernelTrace) Base() uint64 {
	var base uint64
	for _, b := range k.Latest() {
		for _, e := range []int{0, recvEntry} {
			if e < len(b.Stamps) && b.Stamps[e] != 0 && (base == 0 || b.Stamps[e] < base) {
				base = b.Stamps[e]
			}
		}
	}
	return base
}

// EventSummary is one event over the last launch's blocks: microseconds
// after Base.
type EventSummary struct {
	Event            string
	Blocks           int // blocks that stamped it
	Min, Median, Max float64
}

// Summary is, for every event some block of the last launch stamped, the
// minimum, median and maximum over those blocks of (stamp - Base) in
// microseconds, in event order.
func (k KernelTrace) Summary() []EventSummary {
	base := k.Base()
	if base == 0 {
		return nil
	}
	latest := k.Latest()
	var out []EventSummary
	for e, name := range k.Events {
		var v []float64
		for _, b := range latest {
			if e < len(b.Stamps) && b.Stamps[e] != 0 {
				v = append(v, float64(int64(b.Stamps[e]-base))/1e3)
			}
		}
		if len(v) == 0 {
			continue
		}
		sort.Float64s(v)
		n := len(v)
		out = append(out, EventSummary{Event: name, Blocks: n, Min: v[0], Median: (v[(n-1)/2] + v[n/2]) / 2, Max: v[n-1]})
	}
	return out
}

// Span is the last launch's time from Base to its latest stamp of any
// event, in microseconds (0 without records).
func (k KernelTrace) Span() float64 {
	base := k.Base()
	if base == 0 {
		return 0
	}
	var last uint64
	for _, b := range k.Latest() {
		for _, s := range b.Stamps {
			last = max(last, s)
		}
	}
	return float64(int64(last-base)) / 1e3
}
