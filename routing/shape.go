package routing

import "fmt"

// Limits shared by the reference layout and the layout kernel. They are
// generous for MoE inference (DeepSeek-V3: K=8, E=256) and keep the kernel
// simple: a token's destination ranks fit one 64-bit mask, and the per-block
// expert counters fit shared memory at the default 48 KiB limit.
const (
	// MaxTopK is the largest K. Dispatch kernels may accept less.
	MaxTopK = 32
	// MaxExperts is the largest number of experts.
	MaxExperts = 4096
	// MaxRanks is the largest number of ranks (one bit per rank in a
	// 64-bit mask).
	MaxRanks = 64
	// MaxTokens is the largest T, so that T*K and T*R stay far from 2^31.
	MaxTokens = 1 << 24
)

// Shape is the size of a routing problem.
type Shape struct {
	Tokens  int `json:"tokens"`  // T: rows of topk_idx
	K       int `json:"topk"`    // top-k: columns of topk_idx
	Experts int `json:"experts"` // E
	Ranks   int `json:"ranks"`   // R; E % R == 0
}

func (s Shape) String() string {
	return fmt.Sprintf("T=%d K=%d E=%d R=%d", s.Tokens, s.K, s.Experts, s.Ranks)
}

// Validate checks the shape against the rules and the package limits.
func (s Shape) Validate() error {
	switch {
	case s.Tokens < 0:
		return fmt.Errorf("routing %v: negative token count", s)
	case s.Tokens > MaxTokens:
		return fmt.Errorf("routing %v: more than %d tokens", s, MaxTokens)
	case s.K < 1 || s.K > MaxTopK:
		return fmt.Errorf("routing %v: top-k must be 1..%d", s, MaxTopK)
	case s.Experts < 1 || s.Experts > MaxExperts:
		return fmt.Errorf("routing %v: experts must be 1..%d", s, MaxExperts)
	case s.Ranks < 1 || s.Ranks > MaxRanks:
		return fmt.Errorf("routing %v: ranks must be 1..%d", s, MaxRanks)
	case s.Experts%s.Ranks != 0:
		return fmt.Errorf("routing %v: %d experts do not divide evenly over %d ranks", s, s.Experts, s.Ranks)
	}
	return nil
}

// ExpertsPerRank is E/R (0 for a shape without ranks).
func (s Shape) ExpertsPerRank() int {
	if s.Ranks <= 0 {
		return 0
	}
	return s.Experts / s.Ranks
}

// RankOf is the rank that owns expert e (0 <= e < E; -1 for a shape with
// no experts per rank).
func (s Shape) RankOf(e int) int {
	per := s.ExpertsPerRank()
	if per <= 0 {
		return -1
	}
	return e / per
}

// Entries is T*K, the length of topk_idx.
func (s Shape) Entries() int { return s.Tokens * s.K }
