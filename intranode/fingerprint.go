package intranode

import (
	"errors"
	"fmt"
	"strings"
)

// Call fingerprints (kernels/intranode.cuh): every launch of notify,
// dispatch and combine has a 64-bit fingerprint. The low 16 bits are the
// launch's sequence number, epoch[notify] + epoch[dispatch] +
// epoch[combine] + 1 at its start: the kernels advance the epochs
// themselves, so a graph replay advances the sequence number like a direct
// launch and no host counter is baked into a graph. The rest is the call's
// shape, packed here by the launcher. A full dispatch is notify then
// dispatch (two sequence numbers), a cached one only dispatch, so "cached on
// one rank, full on another" shows as notify against dispatch at the same
// sequence number.
//
// On the device the fingerprint travels inside the signals the kernels send
// anyway: its 24-bit tag (an XOR fold in which every field lands on its own
// bits, so a difference within one field always shows) is the top 24 bits
// (SignalShift) of every entry flag and, by steps that telescope, of every
// arrival counter once a launch arrived in full. A wait polls only its
// signal word and compares the tag once the progress part reached its
// target, so a matching call costs no load, store or fence beyond those of
// the protocol without fingerprints. The full word is published only off
// the fast path, into the peer's pub[rank] (CtrlPublished, an LL16 packet
// flagged with the 32-bit launch number, so an old word is never taken for
// a later launch's): by a wait still behind, which then looks at the
// peer's word to see a peer that made another kind of call at the same
// sequence number (whose signals go to words this wait does not watch),
// and by a wait that saw a tag differ, to name the fields. A matching call
// that never waits long never writes or reads it. The host backend's twins
// (twins.go) keep the simpler protocol: the fp word (CtrlFingerprint)
// written before each signal and compared at every wait, with the same
// errors.
//
// Measurement only: with internal/kernelflags' switch
// ($GOEP_BENCH_NO_FINGERPRINT=1, read by this package's benchmark harness
// alone) the kernels are compiled with GOEP_NO_FINGERPRINT and run the
// protocol of before fingerprints; mismatched calls are then not detected.
//
// What notify's word carries is the layout only (ranks may run the fused
// NotifyDispatch beside separate Notify + Dispatch calls), so a dtype or
// weights difference in a full dispatch is seen at the dispatch's arrival
// wait, after its rows were written but before it completes: the call fails
// on every rank, its receive region is not a result.
const (
	CtrlFingerprint = 64 // u64[src]: the latest fingerprint of src's launches (host twins)
	// SignalShift: entry flags and arrival counters hold their progress in
	// bits 0..SignalShift-1 and the call's tag above.
	SignalShift = 40
	// CtrlFailed (this rank only) is nonzero once a wait of any launch gave
	// up: later launches then leave at once without signalling, so a peer
	// never matches the stale sequence number of a rank that failed.
	CtrlFailed = 32

	fpSeqBits     = 16
	fpKindShift   = 16 // 2 bits: kernel kind + 1
	fpFP8Shift    = 18
	fpWeightShift = 19
	fpTopKShift   = 20 // 6 bits
	fpExpShift    = 26 // 13 bits
	fpHiddenShift = 39 // 24 bits (hidden mod 2^24)
)

// FingerprintOffset is the byte offset of fp[src] in the control block.
func FingerprintOffset(src int) int { return CtrlFingerprint + 8*src }

// PublishedOffset is the byte offset of pub[src] (16 bytes) in the control
// block.
func PublishedOffset(src int) int { return CtrlPublished + 16*src }

// ErrMismatch: ranks made different calls (another kind, dtype, weights or
// layout, or the same calls in another order). Every rank of the call gets
// a *MismatchError; its Buffer refuses calls until Close.
var ErrMismatch = errors.New("ranks made mismatched calls")

// Fingerprint is a decoded call fingerprint.
type Fingerprint struct {
	Seq     uint16
	Kind    int // KindNotify, KindDispatch, KindCombine; -1 if none was written
	FP8     bool
	Weights bool
	TopK    int
	Experts int
	Hidden  int // modulo 2^24
}

// shapeWord packs a launch's shape (sequence bits zero; the kernel adds
// them).
func shapeWord(kind int, fp8, weights bool, l Layout) uint64 {
	b := func(v bool) uint64 {
		if v {
			return 1
		}
		return 0
	}
	return uint64(kind+1)&3<<fpKindShift | b(fp8)<<fpFP8Shift | b(weights)<<fpWeightShift |
		uint64(l.TopK)&63<<fpTopKShift | uint64(l.Experts())&(1<<13-1)<<fpExpShift |
		uint64(l.Hidden)&(1<<24-1)<<fpHiddenShift
}

// DecodeFingerprint unpacks a fingerprint word.
func DecodeFingerprint(w uint64) Fingerprint {
	return Fingerprint{
		Seq: uint16(w), Kind: int(w>>fpKindShift&3) - 1, FP8: w>>fpFP8Shift&1 != 0,
		Weights: w>>fpWeightShift&1 != 0, TopK: int(w >> fpTopKShift & 63),
		Experts: int(w >> fpExpShift & (1<<13 - 1)), Hidden: int(w >> fpHiddenShift & (1<<24 - 1)),
	}
}

func kindName(k int) string {
	switch k {
	case KindNotify:
		return "notify (full dispatch)"
	case KindDispatch:
		return "dispatch"
	case KindCombine:
		return "combine"
	}
	return "nothing yet"
}

// Diff names the fields in which f and o differ, as "field: f vs o".
func (f Fingerprint) Diff(o Fingerprint) []string {
	var d []string
	add := func(name string, a, b any) { d = append(d, fmt.Sprintf("%s: %v vs %v", name, a, b)) }
	if f.Seq != o.Seq {
		add("call sequence number (mod 2^16)", f.Seq, o.Seq)
	}
	if f.Kind != o.Kind {
		add("call", kindName(f.Kind), kindName(o.Kind))
	}
	if f.FP8 != o.FP8 {
		add("dtype FP8", f.FP8, o.FP8)
	}
	if f.Weights != o.Weights {
		add("weights", f.Weights, o.Weights)
	}
	if f.TopK != o.TopK {
		add("top-k", f.TopK, o.TopK)
	}
	if f.Experts != o.Experts {
		add("experts", f.Experts, o.Experts)
	}
	if f.Hidden != o.Hidden {
		add("hidden", f.Hidden, o.Hidden)
	}
	return d
}

// MismatchError: rank Rank's launch found rank Peer at a different call.
// Own and Theirs are the two fingerprints; Fields names what differs
// (a differing sequence number alone means the peer's signal came from
// another call: calls in a different order, or a different number of
// calls).
type MismatchError struct {
	Rank, Peer  int
	Stage       string // the wait that saw it
	Own, Theirs Fingerprint
	Fields      []string
}

// NewMismatchError decodes a watchdog record of stage StageMismatch.
func NewMismatchError(rank, peer int, stage string, own, theirs uint64) *MismatchError {
	o, t := DecodeFingerprint(own), DecodeFingerprint(theirs)
	return &MismatchError{Rank: rank, Peer: peer, Stage: stage, Own: o, Theirs: t, Fields: o.Diff(t)}
}

func (e *MismatchError) Error() string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("intranode: rank %d: %s: rank %d made a different call (this rank vs rank %d: %s)",
		e.Rank, kindName(e.Own.Kind), e.Peer, e.Peer, strings.Join(e.Fields, "; "))
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return e != nil && target == ErrMismatch }
