package routing

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// GenOptions shape a generated routing. The zero value is DeepEP's test
// routing with seed 0.
type GenOptions struct {
	// Seed makes the routing reproducible.
	Seed uint64
	// Masked sets this many randomly drawn (token, slot) entries to -1.
	// Draws may repeat, as in DeepEP's low-latency test, so fewer entries
	// may end up masked.
	Masked int
	// Always lists experts that every token picks, in its first slots
	// (at most K, distinct). Always: []int{e} with K=1 sends every token to
	// expert e.
	Always []int
	// EmptyRanks lists ranks none of whose experts any token picks: those
	// ranks receive nothing.
	EmptyRanks []int
}

// Generate draws a routing the way DeepEP's tests do: a score |randn| + 1
// per (token, expert) and each token's top-k experts by score, so the K
// experts of a token are distinct. Rows come sorted by descending score
// (torch.topk with sorted=True). Options then force or forbid experts and
// mask entries.
func Generate(s Shape, o GenOptions) (*Routing, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if o.Masked < 0 {
		return nil, fmt.Errorf("generate %v: negative mask count %d", s, o.Masked)
	}
	forced := make([]float64, s.Experts) // 0: normal, +inf: always, -inf: never
	for _, r := range o.EmptyRanks {
		if r < 0 || r >= s.Ranks {
			return nil, fmt.Errorf("generate %v: empty rank %d out of range", s, r)
		}
		for e := r * s.ExpertsPerRank(); e < (r+1)*s.ExpertsPerRank(); e++ {
			forced[e] = math.Inf(-1)
		}
	}
	if len(o.Always) > s.K {
		return nil, fmt.Errorf("generate %v: %d always-picked experts do not fit top-%d", s, len(o.Always), s.K)
	}
	for _, e := range o.Always {
		switch {
		case e < 0 || e >= s.Experts:
			return nil, fmt.Errorf("generate %v: always-picked expert %d out of range", s, e)
		case math.IsInf(forced[e], 1):
			return nil, fmt.Errorf("generate %v: expert %d is always-picked twice", s, e)
		case math.IsInf(forced[e], -1):
			return nil, fmt.Errorf("generate %v: expert %d is always-picked but its rank %d is empty", s, e, s.RankOf(e))
		}
		forced[e] = math.Inf(1)
	}
	usable := 0
	for _, f := range forced {
		if !math.IsInf(f, -1) {
			usable++
		}
	}
	if usable < s.K {
		return nil, fmt.Errorf("generate %v: only %d experts are allowed, fewer than top-%d", s, usable, s.K)
	}

	rng := rand.New(rand.NewPCG(o.Seed, 0x676f6570)) // "goep"
	r := &Routing{Shape: s, Idx: make([]int64, s.Entries())}
	top := make([]scored, 0, s.K)
	for t := 0; t < s.Tokens; t++ {
		top = top[:0]
		for e := 0; e < s.Experts; e++ {
			v := math.Abs(rng.NormFloat64()) + 1 // drawn for every expert, forced or not
			switch {
			case math.IsInf(forced[e], -1):
				continue
			case math.IsInf(forced[e], 1):
				v = alwaysScore(o.Always, e)
			}
			top = insertTop(top, scored{v, e}, s.K)
		}
		row := r.Row(t)
		for j, c := range top {
			row[j] = int64(c.expert)
		}
	}
	for i := 0; i < o.Masked && s.Tokens > 0; i++ {
		t, j := rng.IntN(s.Tokens), rng.IntN(s.K)
		r.Idx[t*s.K+j] = -1
	}
	return r, nil
}

type scored struct {
	score  float64
	expert int
}

// alwaysScore ranks forced experts above every drawn score (which are below
// 1e6 in practice), in the order the caller listed them.
func alwaysScore(always []int, e int) float64 {
	for i, a := range always {
		if a == e {
			return 1e9 - float64(i)
		}
	}
	return 1e9
}

// insertTop keeps top sorted by descending score with at most k entries;
// ties keep the lower expert first, like a stable sort.
func insertTop(top []scored, c scored, k int) []scored {
	if len(top) == k && c.score <= top[k-1].score {
		return top
	}
	if len(top) < k {
		top = append(top, c)
	} else {
		top[k-1] = c
	}
	for i := len(top) - 1; i > 0 && top[i].score > top[i-1].score; i-- {
		top[i], top[i-1] = top[i-1], top[i]
	}
	return top
}
