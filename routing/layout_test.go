package routing

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReferenceLayoutHandCases(t *testing.T) {
	cases := []struct {
		name      string
		s         Shape
		idx       []int64
		perRank   []int32
		perExpert []int32
		inRank    []uint8
	}{
		{
			// E/R = 2: experts 0,1 on rank 0; 2,3 on rank 1.
			name: "two ranks", s: Shape{Tokens: 3, K: 2, Experts: 4, Ranks: 2},
			idx:     []int64{0, 3, 1, -1, -1, -1},
			perRank: []int32{2, 1}, perExpert: []int32{1, 1, 0, 1},
			inRank: []uint8{1, 1, 1, 0, 0, 0},
		},
		{
			// A token with two experts on one rank counts once for it.
			name: "two experts one rank", s: Shape{Tokens: 2, K: 3, Experts: 6, Ranks: 3},
			idx:     []int64{5, 4, -1, 2, 3, 0},
			perRank: []int32{1, 1, 1}, perExpert: []int32{1, 0, 1, 1, 1, 1},
			inRank: []uint8{0, 0, 1, 1, 1, 0},
		},
		{
			// Repeated expert: counted per entry, the rank once.
			name: "repeat", s: Shape{Tokens: 1, K: 2, Experts: 2, Ranks: 2},
			idx:     []int64{1, 1},
			perRank: []int32{0, 1}, perExpert: []int32{0, 2},
			inRank: []uint8{0, 1},
		},
		{
			name: "one rank", s: Shape{Tokens: 2, K: 1, Experts: 3, Ranks: 1},
			idx:     []int64{2, -1},
			perRank: []int32{1}, perExpert: []int32{0, 0, 1},
			inRank: []uint8{1, 0},
		},
		{
			name: "no tokens", s: Shape{Tokens: 0, K: 4, Experts: 8, Ranks: 4},
			perRank: []int32{0, 0, 0, 0}, perExpert: make([]int32, 8),
			inRank: []uint8{},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, as32 := range []bool{false, true} {
				var l *Layout
				var err error
				if as32 {
					r := &Routing{Shape: c.s, Idx: c.idx}
					l, err = ReferenceLayout(r.Int32(), c.s)
				} else {
					l, err = ReferenceLayout(c.idx, c.s)
				}
				require.NoError(t, err)
				assert.Equal(t, c.perRank, l.TokensPerRank)
				assert.Equal(t, c.perExpert, l.TokensPerExpert)
				assert.Equal(t, c.inRank, l.IsTokenInRank)
			}
		})
	}
}

func TestReferenceLayoutRejectsBadInput(t *testing.T) {
	_, err := ReferenceLayout([]int64{0, 9}, Shape{Tokens: 1, K: 2, Experts: 8, Ranks: 2})
	assert.ErrorContains(t, err, "topk_idx[0][1] = 9")
	_, err = ReferenceLayout([]int32{0, 1}, Shape{Tokens: 1, K: 2, Experts: 9, Ranks: 2})
	assert.ErrorContains(t, err, "do not divide evenly")
}

// CountLayout is lenient (it is what a kernel does with bad device data):
// it skips and counts bad entries and overwrites stale outputs.
func TestCountLayoutIgnoresAndCountsInvalid(t *testing.T) {
	s := Shape{Tokens: 2, K: 3, Experts: 4, Ranks: 2}
	perRank, perExpert, inRank := []int32{9, 9}, []int32{9, 9, 9, 9}, []uint8{7, 7, 7, 7}
	n := CountLayout([]int64{0, 4, -3, -1, 3, 1 << 33}, s, perRank, perExpert, inRank)
	assert.Equal(t, 3, n)
	assert.Equal(t, []int32{1, 1}, perRank)
	assert.Equal(t, []int32{1, 0, 0, 1}, perExpert)
	assert.Equal(t, []uint8{1, 0, 0, 1}, inRank)
}

// bruteLayout recomputes a layout the slow, obvious way, independently of
// CountLayout.
func bruteLayout(r *Routing) *Layout {
	l := NewLayout(r.Shape)
	for e := 0; e < r.Experts; e++ {
		for _, v := range r.Idx {
			if v == int64(e) {
				l.TokensPerExpert[e]++
			}
		}
	}
	for t := 0; t < r.Tokens; t++ {
		for rank := 0; rank < r.Ranks; rank++ {
			for _, v := range r.Row(t) {
				if v >= 0 && int(v)/(r.Experts/r.Ranks) == rank {
					l.IsTokenInRank[t*r.Ranks+rank] = 1
					l.TokensPerRank[rank]++
					break
				}
			}
		}
	}
	return l
}

func TestReferenceLayoutProperties(t *testing.T) {
	type gen struct {
		s Shape
		o GenOptions
	}
	var cases []gen
	seed := uint64(1)
	for _, k := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9} {
		for _, e := range []int{8, 16, 64, 256, 512} {
			for _, r := range []int{1, 2, 4, 8} {
				if k > e {
					continue
				}
				seed++
				cases = append(cases, gen{Shape{Tokens: 37 + int(seed%50), K: k, Experts: e, Ranks: r}, GenOptions{Seed: seed, Masked: int(seed % 20)}})
			}
		}
	}
	cases = append(cases,
		gen{Shape{0, 8, 256, 8}, GenOptions{}},
		gen{Shape{1, 8, 256, 8}, GenOptions{Seed: 3}},
		gen{Shape{64, 1, 64, 8}, GenOptions{Always: []int{5}}},                // all tokens to expert 5
		gen{Shape{64, 4, 64, 8}, GenOptions{Always: []int{63, 0}}},            // two hot experts, 2 ranks hit by all
		gen{Shape{100, 8, 256, 8}, GenOptions{EmptyRanks: []int{3}}},          // rank 3 receives nothing
		gen{Shape{100, 8, 256, 8}, GenOptions{EmptyRanks: []int{0, 1, 2, 7}}}, // half the ranks idle
		gen{Shape{50, 8, 256, 64}, GenOptions{Seed: 9}},
		gen{Shape{50, 16, 4096, 64}, GenOptions{Seed: 10, Masked: 100}},
		gen{Shape{50, 32, 64, 64}, GenOptions{Seed: 11}}, // one expert per rank, K = 32
	)
	for _, c := range cases {
		t.Run(fmt.Sprintf("%v/%+v", c.s, c.o), func(t *testing.T) {
			r, err := Generate(c.s, c.o)
			require.NoError(t, err)
			l, err := r.Layout()
			require.NoError(t, err)
			require.NoError(t, bruteLayout(r).Diff(l))

			l32, err := ReferenceLayout(r.Int32(), r.Shape)
			require.NoError(t, err)
			require.NoError(t, l.Diff(l32), "int32 and int64 agree")

			var entries, sumExpert int64
			for _, v := range r.Idx {
				if v >= 0 {
					entries++
				}
			}
			for _, n := range l.TokensPerExpert {
				sumExpert += int64(n)
			}
			assert.Equal(t, entries, sumExpert, "tokens per expert sum to the non -1 entries")
			for rank := 0; rank < r.Ranks; rank++ {
				var rows int32
				for tok := 0; tok < r.Tokens; tok++ {
					rows += int32(l.IsTokenInRank[tok*r.Ranks+rank])
				}
				assert.Equal(t, rows, l.TokensPerRank[rank], "rank %d: count equals is_token_in_rank's column", rank)
				assert.LessOrEqual(t, l.TokensPerRank[rank], int32(r.Tokens))
			}
			for _, rank := range c.o.EmptyRanks {
				assert.Zero(t, l.TokensPerRank[rank], "empty rank %d", rank)
			}
			for _, e := range c.o.Always {
				assert.Equal(t, int32(r.Tokens), l.TokensPerExpert[e], "hot expert %d", e)
			}
		})
	}
}

func TestAllMaskedRouting(t *testing.T) {
	s := Shape{Tokens: 5, K: 3, Experts: 16, Ranks: 4}
	idx := make([]int32, s.Entries())
	for i := range idx {
		idx[i] = -1
	}
	l, err := ReferenceLayout(idx, s)
	require.NoError(t, err)
	assert.Equal(t, make([]int32, 4), l.TokensPerRank)
	assert.Equal(t, make([]int32, 16), l.TokensPerExpert)
	assert.Equal(t, make([]uint8, 20), l.IsTokenInRank)
	assert.False(t, l.InRank(4, 3))
}

func TestLayoutDiffNamesTheFirstDifference(t *testing.T) {
	s := Shape{Tokens: 2, K: 1, Experts: 4, Ranks: 2}
	want, err := ReferenceLayout([]int64{0, 3}, s)
	require.NoError(t, err)
	mutate := func(f func(l *Layout)) *Layout {
		l, _ := ReferenceLayout([]int64{0, 3}, s)
		f(l)
		return l
	}
	assert.NoError(t, want.Diff(mutate(func(*Layout) {})))
	assert.ErrorContains(t, want.Diff(mutate(func(l *Layout) { l.TokensPerRank[1] = 5 })), "tokens for rank 1 = 5, want 1")
	assert.ErrorContains(t, want.Diff(mutate(func(l *Layout) { l.TokensPerExpert[2] = -1 })), "tokens for expert 2 = -1, want 0")
	assert.ErrorContains(t, want.Diff(mutate(func(l *Layout) { l.IsTokenInRank[3] = 0xA5 })), "is_token_in_rank[1][1] = 165, want 1")
	assert.ErrorContains(t, want.Diff(mutate(func(l *Layout) { l.Tokens = 3 })), "layout shape")
}
