package routing

import "fmt"

// Layout is the dispatch layout of a routing: what DeepEP's
// get_dispatch_layout returns, minus the internode per-node counts.
type Layout struct {
	Shape
	// TokensPerRank[r] is the number of tokens with at least one expert on
	// rank r: the tokens this rank sends to r.
	TokensPerRank []int32
	// TokensPerExpert[e] is the number of topk_idx entries equal to e (a
	// token that names e twice counts twice; see Routing.CheckDistinct).
	TokensPerExpert []int32
	// IsTokenInRank[t*R+r] is 1 when token t has an expert on rank r, else 0
	// (torch.bool storage).
	IsTokenInRank []uint8
}

// NewLayout allocates an empty layout of shape s.
func NewLayout(s Shape) *Layout {
	return &Layout{
		Shape:           s,
		TokensPerRank:   make([]int32, s.Ranks),
		TokensPerExpert: make([]int32, s.Experts),
		IsTokenInRank:   make([]uint8, s.Tokens*s.Ranks),
	}
}

// InRank reports whether token t goes to rank r (false for a nil layout
// or a token or rank outside it).
func (l *Layout) InRank(t, r int) bool {
	if l == nil || t < 0 || r < 0 || r >= l.Ranks || t*l.Ranks+r >= len(l.IsTokenInRank) {
		return false
	}
	return l.IsTokenInRank[t*l.Ranks+r] != 0
}

// ReferenceLayout validates idx (shape and values) and computes its layout.
func ReferenceLayout[I Index](idx []I, s Shape) (*Layout, error) {
	if err := ValidateIndices(idx, s); err != nil {
		return nil, err
	}
	l := NewLayout(s)
	CountLayout(idx, s, l.TokensPerRank, l.TokensPerExpert, l.IsTokenInRank)
	return l, nil
}

// Layout computes the routing's reference layout.
func (r *Routing) Layout() (*Layout, error) {
	if r == nil {
		return nil, errNilRouting
	}
	return ReferenceLayout(r.Idx, r.Shape)
}

// CountLayout is the reference computation, exactly what the layout kernel
// does: it overwrites perRank[R], perExpert[E] and inRank[T*R], ignores
// entries outside [-1, E) and returns how many it ignored. The slices must
// have the sizes s gives and s must be valid; the host backend's kernel twin
// calls it on device memory.
func CountLayout[I Index](idx []I, s Shape, perRank, perExpert []int32, inRank []uint8) (invalid int) {
	clear(perRank)
	clear(perExpert)
	per := int64(s.ExpertsPerRank())
	var mask uint64 // ranks of the current token; R <= 64
	for t := 0; t < s.Tokens; t++ {
		mask = 0
		for _, v := range idx[t*s.K : (t+1)*s.K] {
			e := int64(v)
			switch {
			case e >= 0 && e < int64(s.Experts):
				perExpert[e]++
				mask |= 1 << uint(e/per)
			case e != -1:
				invalid++
			}
		}
		row := inRank[t*s.Ranks : (t+1)*s.Ranks]
		for r := range row {
			row[r] = uint8(mask >> uint(r) & 1)
			perRank[r] += int32(row[r])
		}
	}
	return invalid
}

// Diff returns nil when got equals l, else an error naming the first
// difference (shape, a rank count, an expert count, then a token's row).
func (l *Layout) Diff(got *Layout) error {
	if l == nil || got == nil {
		return fmt.Errorf("layout diff: nil layout (want %v, got %v)", l != nil, got != nil)
	}
	if got.Shape != l.Shape {
		return fmt.Errorf("layout shape %v, want %v", got.Shape, l.Shape)
	}
	if len(got.TokensPerRank) != l.Ranks || len(got.TokensPerExpert) != l.Experts || len(got.IsTokenInRank) != l.Tokens*l.Ranks {
		return fmt.Errorf("layout %v: output lengths %d/%d/%d do not match the shape",
			l.Shape, len(got.TokensPerRank), len(got.TokensPerExpert), len(got.IsTokenInRank))
	}
	for r, want := range l.TokensPerRank {
		if got.TokensPerRank[r] != want {
			return fmt.Errorf("layout %v: tokens for rank %d = %d, want %d", l.Shape, r, got.TokensPerRank[r], want)
		}
	}
	for e, want := range l.TokensPerExpert {
		if got.TokensPerExpert[e] != want {
			return fmt.Errorf("layout %v: tokens for expert %d = %d, want %d", l.Shape, e, got.TokensPerExpert[e], want)
		}
	}
	for i, want := range l.IsTokenInRank {
		if got.IsTokenInRank[i] != want {
			return fmt.Errorf("layout %v: is_token_in_rank[%d][%d] = %d, want %d",
				l.Shape, i/l.Ranks, i%l.Ranks, got.IsTokenInRank[i], want)
		}
	}
	return nil
}
