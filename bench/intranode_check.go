package bench

import (
	"bytes"
	"fmt"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
)

// compare downloads len(want) bytes at p and compares them with want.
func (r *inRank) compare(what string, want []byte, p uintptr) error {
	if len(want) == 0 {
		return nil
	}
	got := make([]byte, len(want))
	if err := r.dev.CopyOut(got, p); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if bytes.Equal(got, want) {
		return nil
	}
	i, n := -1, 0
	for j := range want {
		if want[j] != got[j] {
			if i < 0 {
				i = j
			}
			n++
		}
	}
	return fmt.Errorf("rank %d: %s: %d of %d bytes differ from the reference, the first at byte %d (want %#02x, got %#02x)",
		r.rank, what, n, len(want), i, want[i], got[i])
}

// checkDispatch compares a dispatch's outputs with the reference, byte for
// byte.
func (r *inRank) checkDispatch(what string, res ep.DispatchResult, want intranode.RankOutput, fp8, nonCached bool) error {
	if err := r.st.Synchronize(); err != nil {
		return err
	}
	n := want.Received()
	if res.NumRecv != n {
		return fmt.Errorf("rank %d: %s: received %d rows, the reference %d", r.rank, what, res.NumRecv, n)
	}
	if nonCached && !equalInts(res.TokensPerExpert, want.TokensPerLocalExpert) {
		return fmt.Errorf("rank %d: %s: tokens per local expert %v, the reference %v", r.rank, what, res.TokensPerExpert, want.TokensPerLocalExpert)
	}
	type part struct {
		name string
		want []byte
		p    uintptr
	}
	checks := []part{
		{"rank prefix", asBytes(want.RankPrefix), res.RankPrefix.Ptr},
		{"top-k ids", asBytes(want.RecvTopK), res.RecvTopK.Ptr},
		{"source tokens", asBytes(want.RecvSrcToken), res.RecvSrcToken.Ptr},
	}
	if fp8 {
		checks = append(checks, part{"fp8 rows", asBytes(want.RecvXFP8), res.RecvX.Ptr},
			part{"scales", asBytes(want.RecvScales), res.RecvScales.Ptr})
	} else {
		checks = append(checks, part{"rows", asBytes(want.RecvX), res.RecvX.Ptr})
	}
	if res.RecvWeights.Present() {
		checks = append(checks, part{"weights", asBytes(want.RecvWeights), res.RecvWeights.Ptr})
	}
	for _, c := range checks {
		if err := r.compare(what+": "+c.name, c.want, c.p); err != nil {
			return err
		}
	}
	return nil
}

func (r *inRank) checkCombine(what string, res ep.CombineResult, want intranode.CombineOutput) error {
	if err := r.st.Synchronize(); err != nil {
		return err
	}
	if err := r.compare(what+": combined rows", asBytes(want.X), res.X.Ptr); err != nil {
		return err
	}
	return r.compare(what+": combined weights", asBytes(want.Weights), res.Weights.Ptr)
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
