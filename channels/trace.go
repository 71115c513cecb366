package channels

import (
	"fmt"
	"math/bits"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy trace: an opt-in timeline of the port channels' CPU proxy and the
// TCP connection, for measuring where the network leg's time goes (is the
// proxy starved, busy per request, stalled on flow control, or is the time
// a tail after the last byte landed). Measurement only: it changes nothing
// the transport does.
//
// Off (the default) a recording site costs one atomic load and a
// predictable branch. On, each event is a clock read and a store into a
// preallocated ring under an uncontended mutex: every ring has one writing
// goroutine in practice (the proxy, one socket's sender, one socket's
// receiver, the proxy again for a connection's enqueues and flushes); the
// mutex only makes a snapshot taken while traffic runs safe. A full ring
// overwrites its oldest event and counts it as dropped.
//
// Times are nanoseconds on the process's monotonic clock since a
// process-wide epoch (TraceNow); a snapshot carries the epoch's wall time
// so timelines of processes of one host can be lined up.

// ProxyTraceEnv turns tracing on at start-up (any value but "" and "0");
// SetProxyTrace turns it on and off at run time.
const ProxyTraceEnv = "GOEP_PROXY_TRACE"

// traceRingSize is each ring's capacity in events (a power of two): 2^15
// 48-byte events, 1.5 MiB a ring, allocated when tracing is switched on
// (or when the track is made while it is on), so that the first traced
// call does not pay for the allocations: measured in session 10, a traced
// 128-token dispatch took 1.7 ms against 0.8 ms untraced when each ring
// was allocated at its first event.
const traceRingSize = 1 << 15

var (
	traceOn    atomic.Bool
	traceEpoch = time.Now()
	traceReg   = struct {
		mu     sync.Mutex
		tracks map[*traceTrack]struct{}
	}{tracks: map[*traceTrack]struct{}{}}
)

func init() {
	if v := os.Getenv(ProxyTraceEnv); v != "" && v != "0" {
		traceOn.Store(true)
	}
}

// SetProxyTrace turns the proxy trace on or off for the whole process and
// returns the previous setting. Events are recorded only while on.
// Switching it on allocates the rings of every track that has none yet;
// rings stay allocated until their track is dropped.
func SetProxyTrace(on bool) bool {
	if on {
		traceReg.mu.Lock()
		for tr := range traceReg.tracks {
			tr.allocRing()
		}
		traceReg.mu.Unlock()
	}
	return traceOn.Swap(on)
}

// ProxyTraceOn reports whether the proxy trace records.
func ProxyTraceOn() bool { return traceOn.Load() }

// TraceNow is the trace clock: nanoseconds since the process's trace epoch
// (monotonic, always positive).
func TraceNow() int64 { return int64(time.Since(traceEpoch)) + 1 }

// TraceStage is what an event times.
type TraceStage uint8

const (
	// StageTrigger: the proxy carrying out one trigger, from popping it
	// off the FIFO to handing its work to the connection (Op, Bytes).
	StageTrigger TraceStage = iota + 1
	// StageEnqueue: the connection numbering one message and queueing it
	// on its socket, waiting while that queue is full (flow control).
	StageEnqueue
	// StageFlush: a flush (explicit or the proxy's MaxPending bound) from
	// its request to the peer's acknowledgement.
	StageFlush
	// StageCopyOut: a staged chunk's device-to-pinned copy, from queueing
	// it to the sender seeing it done (an upper bound of its end).
	StageCopyOut
	// StageCopyOutWait: the sender blocked waiting for a copy-out.
	StageCopyOutWait
	// StageSend: one message written to its socket (header and payload).
	StageSend
	// StageRecv: from a message's header arriving to its payload read
	// (into the socket's pinned buffer when staged; the header alone
	// otherwise, the payload then being StageCopyIn).
	StageRecv
	// StageTurn: the receiver waiting for the message's turn (messages
	// apply in sequence order).
	StageTurn
	// StageCopyIn: the payload into its destination: queueing the
	// pinned-to-device copy (staged; GPU completion comes later, bounded by
	// the next flush's acknowledgement) or reading it from the socket
	// (unstaged).
	StageCopyIn
	// StageApply: the message applied (an instant): a write's copy-in
	// issued, a word stored or added, a flush acknowledged.
	StageApply
	// StageAck: the receiver answering a flush (settling its stream, then
	// writing the acknowledgement).
	StageAck
	numStages
)

var stageNames = [numStages]string{"", "trigger", "enqueue", "flush", "copy-out", "copy-out-wait", "send", "recv", "turn", "copy-in", "apply", "ack"}

func (s TraceStage) String() string {
	if s < numStages && s > 0 {
		return stageNames[s]
	}
	return fmt.Sprintf("stage(%d)", uint8(s))
}

// TraceOp is the kind of work an event belongs to.
type TraceOp uint8

const (
	OpPut TraceOp = iota + 1
	OpPutSignal
	OpSignal
	OpFlush
	OpAtomicAdd
	OpUpdate
	OpWrite // a TCP write message (one chunk of a put)
	numOps
)

var opNames = [numOps]string{"", "put", "put+signal", "signal", "flush", "atomic", "update", "write"}

func (o TraceOp) String() string {
	if o < numOps && o > 0 {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// TraceRole says which goroutine's ring an event came from.
type TraceRole uint8

const (
	RoleProxy    TraceRole = iota + 1 // the proxy's loop
	RoleConn                          // a connection's callers (enqueue, flush)
	RoleSender                        // one socket's sender
	RoleReceiver                      // one socket's receiver
)

// TraceEvent is one timed interval (Start == End for an instant).
type TraceEvent struct {
	Start, End int64 // TraceNow times
	Seq        uint64
	Bytes      int64
	Stage      TraceStage
	Op         TraceOp
	Role       TraceRole
	Socket     int16 // -1 where no socket
	Rank, Peer int32 // Peer -1 for the proxy
}

type traceRec struct {
	start, end int64
	seq        uint64
	bytes      int64
	stage      TraceStage
	op         TraceOp
}

// traceTrack is one goroutine's ring.
type traceTrack struct {
	rank, peer int
	role       TraceRole
	sock       int
	mu         sync.Mutex
	ring       []traceRec // nil until tracing is on (allocRing)
	n          uint64     // events recorded since the last reset
}

func newTraceTrack(rank, peer int, role TraceRole, sock int) *traceTrack {
	tr := &traceTrack{rank: rank, peer: peer, role: role, sock: sock}
	if traceOn.Load() {
		tr.allocRing()
	}
	traceReg.mu.Lock()
	traceReg.tracks[tr] = struct{}{}
	traceReg.mu.Unlock()
	return tr
}

func dropTraceTracks(trs ...*traceTrack) {
	traceReg.mu.Lock()
	for _, tr := range trs {
		delete(traceReg.tracks, tr)
	}
	traceReg.mu.Unlock()
}

// allocRing gives tr its ring if it has none.
func (tr *traceTrack) allocRing() {
	tr.mu.Lock()
	if tr.ring == nil {
		tr.ring = make([]traceRec, traceRingSize)
	}
	tr.mu.Unlock()
}

// rec records an event that began at start (a TraceNow taken while tracing
// was on: 0 means it was off then, and nothing is recorded).
func (tr *traceTrack) rec(stage TraceStage, op TraceOp, seq uint64, bytes int64, start int64) {
	if tr == nil || start == 0 {
		return
	}
	end := TraceNow()
	tr.mu.Lock()
	if tr.ring == nil {
		tr.ring = make([]traceRec, traceRingSize)
	}
	tr.ring[tr.n&(traceRingSize-1)] = traceRec{start: start, end: end, seq: seq, bytes: bytes, stage: stage, op: op}
	tr.n++
	tr.mu.Unlock()
}

// traceStart is the start time of an event when tracing is on, else 0.
func traceStart() int64 {
	if traceOn.Load() {
		return TraceNow()
	}
	return 0
}

// ProxyTrace is a snapshot of the trace of one rank's proxies and TCP
// connections in this process.
type ProxyTrace struct {
	Rank int
	// EpochUnixNano is the wall time of the trace clock's zero.
	EpochUnixNano int64
	Events        []TraceEvent // sorted by Start
	// Dropped counts events overwritten in full rings.
	Dropped uint64
}

func tracksOf(rank int) []*traceTrack {
	traceReg.mu.Lock()
	defer traceReg.mu.Unlock()
	var out []*traceTrack
	for tr := range traceReg.tracks {
		if tr.rank == rank {
			out = append(out, tr)
		}
	}
	return out
}

// ResetProxyTrace forgets the events recorded so far on rank's proxies and
// connections in this process.
func ResetProxyTrace(rank int) {
	for _, tr := range tracksOf(rank) {
		tr.mu.Lock()
		tr.n = 0
		tr.mu.Unlock()
	}
}

// SnapshotProxyTrace copies the events recorded since the last reset on
// rank's proxies and connections in this process (the sending side of its
// connections and the receiving side of its peers' connections to it).
func SnapshotProxyTrace(rank int) *ProxyTrace {
	pt := &ProxyTrace{Rank: rank, EpochUnixNano: traceEpoch.UnixNano()}
	for _, tr := range tracksOf(rank) {
		tr.mu.Lock()
		first := uint64(0)
		if tr.n > traceRingSize {
			first = tr.n - traceRingSize
			pt.Dropped += first
		}
		for i := first; i < tr.n; i++ {
			r := tr.ring[i&(traceRingSize-1)]
			pt.Events = append(pt.Events, TraceEvent{Start: r.start, End: r.end, Seq: r.seq, Bytes: r.bytes, Stage: r.stage,
				Op: r.op, Role: tr.role, Socket: int16(tr.sock), Rank: int32(tr.rank), Peer: int32(tr.peer)})
		}
		tr.mu.Unlock()
	}
	sort.SliceStable(pt.Events, func(i, j int) bool { return pt.Events[i].Start < pt.Events[j].Start })
	return pt
}

// TraceSizeBuckets is the number of power-of-two size buckets: bucket b
// holds sizes in [2^(b-1), 2^b) (bucket 0: zero bytes), the last one
// everything above.
const TraceSizeBuckets = 40

// TraceStageSummary is one stage's figures over a window.
type TraceStageSummary struct {
	Stage  TraceStage
	Events int
	Bytes  int64
	// Busy is the time at least one event of the stage was in progress
	// (their union, clipped to the window); Sum adds the events' own
	// durations (Sum/Busy: how many ran at once on average, e.g. sockets).
	Busy, Sum time.Duration
	// BusyFrac is Busy over the window.
	BusyFrac float64
	// BytesPerSec is Bytes over the window; BusyBytesPerSec over Busy.
	BytesPerSec, BusyBytesPerSec float64
	// Longest is the longest single event.
	Longest time.Duration
}

// TraceSummary summarises a ProxyTrace over a window.
type TraceSummary struct {
	From, To int64 // the window (TraceNow times)
	// Requests and bytes by trigger kind (the proxy's triggers).
	Requests map[TraceOp]int
	Bytes    map[TraceOp]int64
	// Sizes is the histogram of puts' sizes (TraceSizeBuckets buckets).
	Sizes  [TraceSizeBuckets]int
	Stages []TraceStageSummary // the stages seen, in stage order
	// FirstTrigger: the first trigger popped, relative to From (-1: none).
	FirstTrigger time.Duration
	// LastApply: the last message applied on this rank's receiving side,
	// relative to From (-1: none).
	LastApply time.Duration
	// LastSend: the end of the last socket write, relative to From (-1:
	// none).
	LastSend time.Duration
	// IdleGap is the longest time the proxy spent between two triggers
	// (end of one to the pop of the next) inside the window; IdleBefore
	// the time from From to the first trigger is not counted in it.
	IdleGap time.Duration
	Dropped uint64
}

// Summary summarises the events that overlap [from, to] (TraceNow times;
// zeros: the span of all events).
func (pt *ProxyTrace) Summary(from, to int64) TraceSummary {
	s := TraceSummary{Requests: map[TraceOp]int{}, Bytes: map[TraceOp]int64{}, FirstTrigger: -1, LastApply: -1, LastSend: -1}
	if pt == nil {
		return s
	}
	s.Dropped = pt.Dropped
	if from == 0 && to == 0 && len(pt.Events) > 0 {
		from, to = pt.Events[0].Start, pt.Events[0].End
		for _, e := range pt.Events {
			to = max(to, e.End)
		}
	}
	s.From, s.To = from, to
	window := to - from
	type iv struct{ a, b int64 }
	per := make([][]iv, numStages)
	sums := make([]TraceStageSummary, numStages)
	lastTrigEnd := int64(-1)
	for _, e := range pt.Events {
		if e.End < from || e.Start > to {
			continue
		}
		a, b := max(e.Start, from), min(e.End, to)
		st := &sums[e.Stage%numStages]
		st.Stage = e.Stage
		st.Events++
		st.Bytes += e.Bytes
		st.Sum += time.Duration(b - a)
		st.Longest = max(st.Longest, time.Duration(e.End-e.Start))
		per[e.Stage%numStages] = append(per[e.Stage%numStages], iv{a, b})
		switch e.Stage {
		case StageTrigger:
			s.Requests[e.Op]++
			s.Bytes[e.Op] += e.Bytes
			if e.Op == OpPut || e.Op == OpPutSignal {
				s.Sizes[sizeBucket(e.Bytes)]++
			}
			if s.FirstTrigger < 0 {
				s.FirstTrigger = time.Duration(e.Start - from)
			}
			// Trigger events come from the proxy's one goroutine in
			// order (sorted by Start), so gaps are between neighbours.
			if lastTrigEnd >= 0 && e.Start > lastTrigEnd {
				s.IdleGap = max(s.IdleGap, time.Duration(e.Start-lastTrigEnd))
			}
			lastTrigEnd = max(lastTrigEnd, e.End)
		case StageApply:
			if e.Role == RoleReceiver {
				s.LastApply = max(s.LastApply, time.Duration(e.End-from))
			}
		case StageSend:
			s.LastSend = max(s.LastSend, time.Duration(e.End-from))
		}
	}
	for k := range numStages {
		if sums[k].Events == 0 {
			continue
		}
		st := sums[k]
		ivs := per[k]
		slices.SortFunc(ivs, func(x, y iv) int { return int(min(max(x.a-y.a, -1), 1)) })
		var busy, curA, curB int64
		curA, curB = -1, -1
		for _, v := range ivs {
			if curB < 0 || v.a > curB {
				busy += curB - curA
				curA, curB = v.a, v.b
				continue
			}
			curB = max(curB, v.b)
		}
		busy += curB - curA
		st.Busy = time.Duration(busy)
		if window > 0 {
			st.BusyFrac = float64(busy) / float64(window)
			st.BytesPerSec = float64(st.Bytes) / (float64(window) / 1e9)
		}
		if busy > 0 {
			st.BusyBytesPerSec = float64(st.Bytes) / (float64(busy) / 1e9)
		}
		s.Stages = append(s.Stages, st)
	}
	return s
}

func sizeBucket(n int64) int {
	if n <= 0 {
		return 0
	}
	return min(bits.Len64(uint64(n)), TraceSizeBuckets-1)
}

// String is a compact table of the summary.
func (s TraceSummary) String() string {
	var b strings.Builder
	w := time.Duration(s.To - s.From)
	us := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fus", float64(d)/1e3)
	}
	fmt.Fprintf(&b, "window %s: first trigger +%s, last send end +%s, last apply +%s, longest proxy idle gap %s",
		us(w), us(s.FirstTrigger), us(s.LastSend), us(s.LastApply), us(s.IdleGap))
	if s.Dropped > 0 {
		fmt.Fprintf(&b, ", %d events DROPPED (ring full)", s.Dropped)
	}
	b.WriteString("\n  requests:")
	for op := OpPut; op < numOps; op++ {
		if n := s.Requests[op]; n > 0 {
			fmt.Fprintf(&b, " %s %d (%s)", op, n, fmtBytes(s.Bytes[op]))
		}
	}
	b.WriteString("\n  put sizes:")
	for k, n := range s.Sizes {
		if n > 0 {
			lo := int64(0)
			if k > 0 {
				lo = int64(1) << (k - 1)
			}
			fmt.Fprintf(&b, " >=%s:%d", fmtBytes(lo), n)
		}
	}
	fmt.Fprintf(&b, "\n  %-13s %7s %10s %10s %6s %5s %9s %9s %10s", "stage", "events", "bytes", "busy", "busy%", "par", "GB/s", "GB/s-busy", "longest")
	for _, st := range s.Stages {
		par := 0.0
		if st.Busy > 0 {
			par = float64(st.Sum) / float64(st.Busy)
		}
		fmt.Fprintf(&b, "\n  %-13s %7d %10s %10s %5.1f%% %5.2f %9.2f %9.2f %10s", st.Stage, st.Events, fmtBytes(st.Bytes), us(st.Busy),
			100*st.BusyFrac, par, st.BytesPerSec/1e9, st.BusyBytesPerSec/1e9, us(st.Longest))
	}
	return b.String()
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
