package internode

import (
	"fmt"

	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// Shape is what every rank of an internode group agrees on. Rank r owns
// experts [r*E/R, (r+1)*E/R) of the whole world (DeepEP's convention), so
// node n owns the experts of its ranks, a contiguous range.
type Shape struct {
	Topology
	Hidden  int
	TopK    int
	Experts int
}

// Limits shared with the intranode kernels, whose row and metadata formats
// the NVLink leg reuses.
const (
	MaxTopK   = intranode.MaxTopK
	MaxHidden = intranode.MaxHidden
	FP8Block  = intranode.FP8Block
	// MaxExperts bounds the experts of a whole world.
	MaxExperts = 1 << 16
	// MaxTokens bounds one rank's tokens (routing's limit), so that sizes
	// from callers cannot ask for absurd allocations.
	MaxTokens = routing.MaxTokens
)

// Validate checks the topology, experts dividing evenly over the world,
// top-k and hidden.
func (s Shape) Validate() error {
	if err := s.Topology.Validate(); err != nil {
		return err
	}
	w := s.World()
	switch {
	case s.Experts < 1 || s.Experts > MaxExperts || s.Experts%w != 0:
		return fmt.Errorf("internode: %d experts over %d ranks (%v): want a multiple of the ranks, at most %d", s.Experts, w, s.Topology, MaxExperts)
	case s.TopK < 1 || s.TopK > MaxTopK:
		return fmt.Errorf("internode: top-k %d: want 1..%d", s.TopK, MaxTopK)
	case s.Hidden < 1 || s.Hidden > MaxHidden:
		return fmt.Errorf("internode: hidden %d: want 1..%d", s.Hidden, MaxHidden)
	}
	return nil
}

// LocalExperts is E/R, the experts of one rank.
func (s Shape) LocalExperts() int {
	if w := s.World(); w > 0 {
		return s.Experts / w
	}
	return 0
}

// rankOf is the owner of expert id e, or -1 for -1 and for ids outside
// [0, E), which every internode step ignores (the kernels count them).
func (s Shape) rankOf(e int64) int {
	if e < 0 || e >= int64(s.Experts) {
		return -1
	}
	return int(e) / s.LocalExperts()
}

// tokens is the number of top-k rows in ids.
func (s Shape) tokens(ids []int64) (int, error) {
	if len(ids)%s.TopK != 0 {
		return 0, fmt.Errorf("%d top-k ids, not a multiple of top-k %d", len(ids), s.TopK)
	}
	t := len(ids) / s.TopK
	if err := s.checkTokens(t); err != nil {
		return 0, err
	}
	return t, nil
}

// checkTokens bounds a token count and the byte counts it implies.
func (s Shape) checkTokens(t int) error {
	if _, ok := checked.Mul(t, 4*s.Hidden); !ok || t > MaxTokens {
		return fmt.Errorf("%d tokens of hidden %d: negative or more than %d", t, s.Hidden, MaxTokens)
	}
	return nil
}

// Layout is one source rank's dispatch layout: DeepEP's get_dispatch_layout
// with the per-node counts, from int64 top-k ids [T][K].
type Layout struct {
	Tokens int
	// TokensPerRank[r]: tokens with at least one expert on rank r.
	TokensPerRank []int32
	// TokensPerNode[n]: tokens with at least one expert on node n; a token
	// crosses to node n once however many of n's ranks it reaches
	// (DeepEP's num_tokens_per_rdma_rank).
	TokensPerNode []int32
	// TokensPerExpert[e]: top-k entries equal to e.
	TokensPerExpert []int32
	// IsTokenInRank[t*R+r], IsTokenInNode[t*N+n]: 1 or 0.
	IsTokenInRank []uint8
	IsTokenInNode []uint8
	// Invalid counts ids outside [-1, E), ignored like -1.
	Invalid int
}

// ReferenceLayout computes a source rank's layout from its top-k ids.
func ReferenceLayout(s Shape, ids []int64) (*Layout, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	t, err := s.tokens(ids)
	if err != nil {
		return nil, fmt.Errorf("internode: layout: %w", err)
	}
	w, n := s.World(), s.Nodes
	l := &Layout{Tokens: t, TokensPerRank: make([]int32, w), TokensPerNode: make([]int32, n),
		TokensPerExpert: make([]int32, s.Experts), IsTokenInRank: make([]uint8, t*w), IsTokenInNode: make([]uint8, t*n)}
	for tok := 0; tok < t; tok++ {
		inRank, inNode := l.IsTokenInRank[tok*w:(tok+1)*w], l.IsTokenInNode[tok*n:(tok+1)*n]
		for _, e := range ids[tok*s.TopK : (tok+1)*s.TopK] {
			r := s.rankOf(e)
			if r < 0 {
				if e != -1 {
					l.Invalid++
				}
				continue
			}
			l.TokensPerExpert[e]++
			inRank[r] = 1
			inNode[s.Node(r)] = 1
		}
		for r, v := range inRank {
			l.TokensPerRank[r] += int32(v)
		}
		for nd, v := range inNode {
			l.TokensPerNode[nd] += int32(v)
		}
	}
	return l, nil
}
