package bench

import (
	"fmt"
	"github.com/goep-dev/goep/routing"
	"strconv"
	"strings"
)

// Placement says which rank holds each token of a routing, for traffic
// analysis of a recorded topk_idx.
//
//   - "block" (the default): the file is a global routing, the
//     concatenation of every rank's tokens in rank order, as when each
//     rank's topk_idx is gathered along dim 0. Rank r holds tokens
//     [r*ceil(T/R), (r+1)*ceil(T/R)); with T divisible by R that is DeepEP's
//     test setup of T/R tokens per rank.
//   - "cyclic": token t is on rank t % R (round-robin sharding).
//   - "rank:N": every token is on rank N: the file is one rank's own
//     topk_idx, and the matrix has a single non-zero row.
type Placement struct {
	Kind string `json:"kind"` // block, cyclic or rank
	Rank int    `json:"rank,omitempty"`
}

// ParsePlacement accepts "block", "cyclic" and "rank:N".
func ParsePlacement(s string) (Placement, error) {
	switch {
	case s == "" || s == "block":
		return Placement{Kind: "block"}, nil
	case s == "cyclic":
		return Placement{Kind: "cyclic"}, nil
	case strings.HasPrefix(s, "rank:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "rank:"))
		if err != nil || n < 0 {
			return Placement{}, fmt.Errorf("placement %q: want rank:N with N >= 0", s)
		}
		return Placement{Kind: "rank", Rank: n}, nil
	}
	return Placement{}, fmt.Errorf("placement %q: want block, cyclic or rank:N", s)
}

func (p Placement) String() string {
	if p.Kind == "rank" {
		return "rank:" + strconv.Itoa(p.Rank)
	}
	return p.Kind
}

// sourceOf returns the function from token to source rank for shape s.
func (p Placement) sourceOf(s routing.Shape) (func(t int) int, error) {
	switch p.Kind {
	case "", "block":
		per := max((s.Tokens+s.Ranks-1)/s.Ranks, 1)
		return func(t int) int { return t / per }, nil
	case "cyclic":
		return func(t int) int { return t % s.Ranks }, nil
	case "rank":
		if p.Rank >= s.Ranks {
			return nil, fmt.Errorf("placement rank:%d: only %d ranks", p.Rank, s.Ranks)
		}
		return func(int) int { return p.Rank }, nil
	}
	return nil, fmt.Errorf("placement kind %q: want block, cyclic or rank", p.Kind)
}

// Traffic is the load and rank-to-rank traffic of a routing. A token goes
// to a rank once however many of that rank's experts it picked (DeepEP's
// dispatch), so traffic counts tokens per (source, destination) pair,
// including a rank's tokens to itself.
type Traffic struct {
	routing.Shape
	Placement Placement `json:"placement"`
	// SourceTokens[r]: tokens rank r holds.
	SourceTokens []int64 `json:"source_tokens"`
	// RecvTokens[r]: tokens rank r receives (all sources, itself included);
	// the layout's TokensPerRank.
	RecvTokens []int64 `json:"recv_tokens"`
	// RankEntries[r]: (token, expert) pairs for rank r's experts, the rows
	// its expert GEMMs see.
	RankEntries []int64 `json:"rank_entries"`
	// ExpertTokens[e]: entries naming expert e.
	ExpertTokens []int64 `json:"expert_tokens"`
	// Matrix[src][dst]: tokens src sends to dst.
	Matrix [][]int64 `json:"matrix_tokens"`
	// Imbalances are max/mean (1 is perfect; 0 when nothing is routed).
	RankImbalance      float64 `json:"rank_imbalance"`
	RankEntryImbalance float64 `json:"rank_entry_imbalance"`
	ExpertImbalance    float64 `json:"expert_imbalance"`
	// Masked counts entries equal to -1.
	Masked int64 `json:"masked_entries"`
}

// Analyze computes r's load and traffic with tokens placed by p. r must be
// valid (routing.Routing.Validate).
func Analyze(r *routing.Routing, p Placement) (*Traffic, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	src, err := p.sourceOf(r.Shape)
	if err != nil {
		return nil, err
	}
	tr := &Traffic{
		Shape:        r.Shape,
		Placement:    p,
		SourceTokens: make([]int64, r.Ranks),
		RecvTokens:   make([]int64, r.Ranks),
		RankEntries:  make([]int64, r.Ranks),
		ExpertTokens: make([]int64, r.Experts),
		Matrix:       make([][]int64, r.Ranks),
	}
	for i := range tr.Matrix {
		tr.Matrix[i] = make([]int64, r.Ranks)
	}
	for t := 0; t < r.Tokens; t++ {
		s := src(t)
		tr.SourceTokens[s]++
		var mask uint64
		for _, e := range r.Row(t) {
			if e < 0 {
				tr.Masked++
				continue
			}
			tr.ExpertTokens[e]++
			d := r.RankOf(int(e))
			tr.RankEntries[d]++
			mask |= 1 << uint(d)
		}
		for d := 0; d < r.Ranks; d++ {
			if mask>>uint(d)&1 != 0 {
				tr.Matrix[s][d]++
				tr.RecvTokens[d]++
			}
		}
	}
	tr.RankImbalance = imbalance(tr.RecvTokens)
	tr.RankEntryImbalance = imbalance(tr.RankEntries)
	tr.ExpertImbalance = imbalance(tr.ExpertTokens)
	return tr, nil
}

// imbalance is max/mean of v, 0 when v sums to 0.
func imbalance(v []int64) float64 {
	var sum, top int64
	for _, x := range v {
		sum += x
		top = max(top, x)
	}
	if sum == 0 {
		return 0
	}
	return float64(top) * float64(len(v)) / float64(sum)
}
