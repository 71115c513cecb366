package internode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// The phase trace of the dispatch and combine kernels, for measurement
// only. Kernels compiled with -DGOEP_INN_TRACE=1 (internal/kernelflags:
// $GOEP_INN_TRACE, `ep-bench internode --trace-kernels`) have thread 0 of
// every block stamp %globaltimer at its phase points (the put events: the
// thread that pushed the put) into a region after the row scratch. The
// default build writes nothing there: the region stays zero. One record
// per (kernel, block), overwritten by the kernel's next launch; its tag
// carries the launch's round. Stamps are per GPU: comparable across the
// blocks of one rank, not across GPUs.
const (
	// TraceBlocks bounds the blocks that record (internode.cu's
	// GOEP_INN_TRACE_BLOCKS).
	TraceBlocks = 256
	// TraceSlots are the u64 of one block's record: the tag, then one
	// stamp per event.
	TraceSlots = 16
	// TraceBytes is the trace region's size: both kernels.
	TraceBytes = 2 * TraceBlocks * TraceSlots * 8
)

// traceOffset is the trace region's offset from the row scratch (i32
// [maxTokens][nodes]), 16-aligned (internode.cu's goep_inn_trace_region).
func traceOffset(maxTokens, nodes int) int {
	return int(align16(int64(4 * maxTokens * nodes)))
}

// Trace events (GOEP_INN_EV_* in kernels/internode.cu): the index of a name
// is its event number.
var (
	// DispatchTraceEvents: send_gate (a cached dispatch's wait for the
	// peers' earlier steps done), prefix (the rows of the tokens before
	// the block's chunk counted), packed (the chunk's rows and slots
	// planned), first_put and last_put (pushed), sent (the block's puts
	// and, in the last sender, the counters out), fwd_ready (the local
	// ranks' bases published), fwd_own (this node's rows forwarded),
	// net_landed (the other nodes' counters seen), fwd_done, recv_gate
	// (every forwarder's second half placed), exit (before the finish).
	DispatchTraceEvents = []string{"entry", "send_gate", "prefix", "packed", "first_put", "last_put", "sent",
		"fwd_ready", "fwd_own", "net_landed", "fwd_done", "recv_gate", "exit"}
	// CombineTraceEvents: copied (expert outputs copied in), ready (every
	// local rank's outputs in place), first_put and last_put, reduced (the
	// block's partials out), net_landed (every node's partials counted
	// here), exit.
	CombineTraceEvents = []string{"entry", "copied", "ready", "first_put", "last_put", "reduced", "net_landed", "exit"}
)

// BlockTrace is one block's record.
type BlockTrace struct {
	Block  int
	Round  uint64
	Stamps []uint64 // %globaltimer nanoseconds per event (0: not reached)
}

// KernelTrace is one kernel's records on one rank.
type KernelTrace struct {
	Kernel string   // "dispatch" or "combine"
	Events []string // DispatchTraceEvents or CombineTraceEvents
	Blocks []BlockTrace
}

// ParseKernelTrace decodes a trace region (TraceBytes, little-endian u64):
// the dispatch's and the combine's records of their last launches.
func ParseKernelTrace(raw []byte) (dispatch, combine KernelTrace, err error) {
	if len(raw) != TraceBytes {
		return dispatch, combine, fmt.Errorf("internode: trace of %d bytes, want %d", len(raw), TraceBytes)
	}
	out := [2]*KernelTrace{&dispatch, &combine}
	dispatch.Kernel, dispatch.Events = "dispatch", DispatchTraceEvents
	combine.Kernel, combine.Events = "combine", CombineTraceEvents
	for k, kt := range out {
		for b := 0; b < TraceBlocks; b++ {
			rec := raw[(k*TraceBlocks+b)*TraceSlots*8:]
			u := func(i int) uint64 { return binary.LittleEndian.Uint64(rec[8*i:]) }
			tag := u(0)
			if tag == 0 {
				continue
			}
			if tag>>63 == 0 || int(tag>>56&15) != k+1 {
				return dispatch, combine, fmt.Errorf("internode: trace of %s, block %d: malformed tag %#x", kt.Kernel, b, tag)
			}
			bt := BlockTrace{Block: b, Round: tag & (1<<48 - 1), Stamps: make([]uint64, len(kt.Events))}
			for e := range bt.Stamps {
				bt.Stamps[e] = u(1 + e)
			}
			kt.Blocks = append(kt.Blocks, bt)
		}
	}
	return dispatch, combine, nil
}

// Summary prints, per event, when the blocks reached it relative to the
// earliest entry of the kernel's last round (microseconds: first, median
// and last block, and how many reached it), one line per event.
func (kt KernelTrace) Summary() string {
	last, t0 := kt.lastEntry()
	if t0 == 0 {
		return kt.Kernel + ": no trace records"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s round %d (us from the first block's entry: first / median / last block, blocks):", kt.Kernel, last)
	for e, name := range kt.Events {
		var at []float64
		for _, b := range kt.Blocks {
			if b.Round == last && e < len(b.Stamps) && b.Stamps[e] != 0 {
				at = append(at, float64(int64(b.Stamps[e]-t0))/1e3)
			}
		}
		if len(at) == 0 {
			continue
		}
		sort.Float64s(at)
		fmt.Fprintf(&sb, "\n  %-11s %9.1f %9.1f %9.1f  (%d)", name, at[0], at[len(at)/2], at[len(at)-1], len(at))
	}
	return sb.String()
}

// lastEntry is the last round recorded and its earliest entry stamp.
func (kt KernelTrace) lastEntry() (round, t0 uint64) {
	for _, b := range kt.Blocks {
		round = max(round, b.Round)
	}
	for _, b := range kt.Blocks {
		if b.Round == round && len(b.Stamps) > 0 && b.Stamps[0] != 0 && (t0 == 0 || b.Stamps[0] < t0) {
			t0 = b.Stamps[0]
		}
	}
	return round, t0
}

// KernelTrace reads this rank's trace region (TraceBytes; ParseKernelTrace
// decodes it): the stamps of the last dispatch and combine launches when
// the kernels were compiled with the trace, zeros otherwise. Call it with
// no launch of this rank in flight (after its stream synchronised).
func (nt *Notify) KernelTrace() ([]byte, error) {
	if nt == nil {
		return nil, errors.New("internode: nil Notify")
	}
	if nt.err != nil {
		return nil, fmt.Errorf("internode: rank %d: kernel trace: %w", nt.rank, nt.err)
	}
	if nt.kern == nil {
		return nil, fmt.Errorf("internode: rank %d: kernel trace: kernels do not run on this device (the host backend runs the Go twins)", nt.rank)
	}
	raw := make([]byte, TraceBytes)
	if err := nt.dev.CopyOut(raw, nt.kern.scratch+uintptr(traceOffset(nt.cfg.MaxTokens, nt.shape.Nodes))); err != nil {
		return nil, fmt.Errorf("internode: rank %d: kernel trace: %w", nt.rank, err)
	}
	return raw, nil
}
