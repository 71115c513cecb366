package collectives

import (
	"errors"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/collectives/abi"
)

// Call fingerprints (kernels/coll_common.cuh, always on): every native
// kernel launch has a 64-bit word whose low 12 bits are the launch's
// sequence number, which the kernels advance themselves (so CUDA-graph
// replays and direct calls stay in step); the rest is the call's shape as
// the launcher packs it (abi.Shape): collective, dtype, reduction,
// algorithm, the grid of a bulk kernel and the element count (folded to 31
// bits). The messages a launch sends anyway carry its 32-bit tag: LL
// kernels fold it into the flags of every data packet (a packet of another
// call is never accepted, and every LL launch reads at least one packet
// from every peer), bulk kernels add it to their entry semaphore signals,
// so a matching call runs exactly the loads, stores and compares it ran
// before fingerprints. The whole word is published into each peer's
// control block only off the fast path (bulk kernels after their entry
// signal, LL kernels once a wait is behind), read by waits that are behind
// and to name the fields. A call of count 0 launches goep_coll_fp_sync, one
// LL round of one packet per peer. A peer whose packet or tag differs, or
// whose published word is at the same launch with another shape, ends the
// launch on every rank with a *MismatchError (errors.Is(err, ErrMismatch))
// that names the peer and the fields; the communicator then refuses calls
// until Close. (The host kernel twins keep the earlier protocol: a word per
// launch and a check against it.)
//
// Calls that launch no native kernel are not in the sequence: the NCCL
// fallback and registered plans (their ranks must agree by other means: a
// native kernel on one rank against NCCL on another ends in the watchdog's
// timeout on the native side). Config.Debug compares every call over the
// bootstrap before any launch and remains the stronger check.
//
// Measurement only: with internal/kernelflags' switch
// ($GOEP_BENCH_NO_FINGERPRINT=1, read by this package's test and benchmark
// harness alone) the kernels are compiled with GOEP_NO_FINGERPRINT and run
// the protocol of before fingerprints; mismatched calls are then not
// detected (Config.Debug still compares calls over the bootstrap).

// ErrMismatch: ranks made mismatched calls (another collective, dtype,
// reduction, count, algorithm or grid, or the same calls in another order).
var ErrMismatch = errors.New("ranks made mismatched calls")

// MismatchError: rank Rank's launch found rank Peer at a different call.
// Own and Theirs are the two fingerprints; Fields names what differs, as
// "field: this rank's vs the peer's" (a differing sequence number alone
// means the peer's signal came from another call: calls in another order or
// a different number of calls).
type MismatchError struct {
	Rank, Peer  int
	Own, Theirs abi.Fingerprint
	Fields      []string
}

func newMismatchError(rank, peer int, own, theirs uint64) *MismatchError {
	o, t := abi.DecodeFingerprint(own), abi.DecodeFingerprint(theirs)
	return &MismatchError{Rank: rank, Peer: peer, Own: o, Theirs: t, Fields: diffFingerprints(o, t)}
}

func fpKindName(k int) string {
	switch k {
	case abi.KindAllReduce:
		return AllReduce.String()
	case abi.KindAllGather:
		return AllGather.String()
	case abi.KindReduceScatter:
		return ReduceScatter.String()
	}
	return "no call yet"
}

func fpAlgoName(a uint32) string {
	switch a {
	case abi.FPAlgoLL:
		return AlgoLL
	case abi.FPAlgoLL2:
		return AlgoLL2
	case abi.FPAlgoScratch:
		return AlgoScratch
	case abi.FPAlgoZC:
		return AlgoZC
	case abi.FPAlgoNone:
		return "none (count 0)"
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// diffFingerprints names the fields in which o and t differ.
func diffFingerprints(o, t abi.Fingerprint) []string {
	var d []string
	add := func(name string, a, b any) { d = append(d, fmt.Sprintf("%s: %v vs %v", name, a, b)) }
	if o.Seq != t.Seq {
		add("call sequence number (mod 2^12)", o.Seq, t.Seq)
	}
	if o.Kind != t.Kind {
		add("collective", fpKindName(o.Kind), fpKindName(t.Kind))
	}
	if o.DType != t.DType {
		add("dtype", DataType(o.DType), DataType(t.DType))
	}
	if o.Op != t.Op {
		add("op", Op(o.Op), Op(t.Op))
	}
	if o.Count != t.Count {
		add("count", o.Count, t.Count) // exact below 2^31 elements, folded above (abi.FoldCount)
	}
	if o.Algo != t.Algo {
		add("algorithm", fpAlgoName(o.Algo), fpAlgoName(t.Algo))
	}
	if o.Grid != t.Grid {
		add("grid", o.Grid, t.Grid) // blocks of a bulk kernel, mod 1024
	}
	return d
}

func (e *MismatchError) Error() string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("collectives: rank %d: %s: rank %d made a different call (this rank vs rank %d: %s)",
		e.Rank, fpKindName(e.Own.Kind), e.Peer, e.Peer, strings.Join(e.Fields, "; "))
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return e != nil && target == ErrMismatch }
