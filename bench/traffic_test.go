package bench

import (
	"github.com/goep-dev/goep/routing"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePlacement(t *testing.T) {
	for in, want := range map[string]Placement{
		"": {Kind: "block"}, "block": {Kind: "block"}, "cyclic": {Kind: "cyclic"}, "rank:3": {Kind: "rank", Rank: 3},
	} {
		got, err := ParsePlacement(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"rank:", "rank:-1", "rank:x", "random"} {
		_, err := ParsePlacement(in)
		assert.Error(t, err, in)
	}
	assert.Equal(t, "rank:3", Placement{Kind: "rank", Rank: 3}.String())
}

func TestAnalyzeHandCase(t *testing.T) {
	// 4 tokens, 2 ranks, experts 0,1 on rank 0 and 2,3 on rank 1.
	// Block placement: tokens 0,1 on rank 0; 2,3 on rank 1.
	s := routing.Shape{Tokens: 4, K: 2, Experts: 4, Ranks: 2}
	r, err := routing.NewRouting([]int64{
		0, 1, // rank 0 -> rank 0 (once, two experts)
		2, -1, // rank 0 -> rank 1
		0, 3, // rank 1 -> ranks 0 and 1
		-1, -1, // rank 1 -> nowhere
	}, s)
	require.NoError(t, err)
	tr, err := Analyze(r, Placement{Kind: "block"})
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 2}, tr.SourceTokens)
	assert.Equal(t, [][]int64{{1, 1}, {1, 1}}, tr.Matrix)
	assert.Equal(t, []int64{2, 2}, tr.RecvTokens)
	assert.Equal(t, []int64{3, 2}, tr.RankEntries)
	assert.Equal(t, []int64{2, 1, 1, 1}, tr.ExpertTokens)
	assert.Equal(t, int64(3), tr.Masked)
	assert.InDelta(t, 1.0, tr.RankImbalance, 1e-12)
	assert.InDelta(t, 3.0/2.5, tr.RankEntryImbalance, 1e-12)
	assert.InDelta(t, 2.0/1.25, tr.ExpertImbalance, 1e-12)

	tr, err = Analyze(r, Placement{Kind: "cyclic"}) // tokens 0,2 on rank 0; 1,3 on rank 1
	require.NoError(t, err)
	assert.Equal(t, [][]int64{{2, 1}, {0, 1}}, tr.Matrix)

	tr, err = Analyze(r, Placement{Kind: "rank", Rank: 1})
	require.NoError(t, err)
	assert.Equal(t, [][]int64{{0, 0}, {2, 2}}, tr.Matrix)
	assert.Equal(t, []int64{0, 4}, tr.SourceTokens)

	_, err = Analyze(r, Placement{Kind: "rank", Rank: 2})
	assert.ErrorContains(t, err, "only 2 ranks")
}

// The traffic matrix's column sums are the layout's tokens per rank, for
// every placement, and nothing is routed on an all-masked routing.
func TestAnalyzeAgreesWithLayout(t *testing.T) {
	for _, s := range []routing.Shape{{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}, {Tokens: 1001, K: 6, Experts: 64, Ranks: 4}, {Tokens: 7, K: 2, Experts: 16, Ranks: 8}} {
		r, err := routing.Generate(s, routing.GenOptions{Seed: uint64(s.Tokens), Masked: 50})
		require.NoError(t, err)
		l, err := r.Layout()
		require.NoError(t, err)
		for _, p := range []Placement{{Kind: "block"}, {Kind: "cyclic"}, {Kind: "rank", Rank: s.Ranks - 1}} {
			tr, err := Analyze(r, p)
			require.NoError(t, err)
			var held int64
			for d := 0; d < s.Ranks; d++ {
				var col int64
				for src := 0; src < s.Ranks; src++ {
					col += tr.Matrix[src][d]
				}
				assert.Equal(t, int64(l.TokensPerRank[d]), col, "%v %v rank %d", s, p, d)
				assert.Equal(t, int64(l.TokensPerRank[d]), tr.RecvTokens[d])
				held += tr.SourceTokens[d]
			}
			assert.Equal(t, int64(s.Tokens), held)
			for e, n := range l.TokensPerExpert {
				assert.Equal(t, int64(n), tr.ExpertTokens[e])
			}
			assert.GreaterOrEqual(t, tr.RankImbalance, 1.0)
			assert.GreaterOrEqual(t, tr.ExpertImbalance, 1.0)
		}
	}
	s := routing.Shape{Tokens: 3, K: 1, Experts: 2, Ranks: 2}
	r, err := routing.NewRouting([]int64{-1, -1, -1}, s)
	require.NoError(t, err)
	tr, err := Analyze(r, Placement{})
	require.NoError(t, err)
	assert.Zero(t, tr.RankImbalance)
	assert.Zero(t, tr.ExpertImbalance)
	assert.Equal(t, []int64{2, 1}, tr.SourceTokens, "ceil(3/2) = 2 tokens on rank 0")
}
