package routing

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShapeValidate(t *testing.T) {
	good := []Shape{
		{0, 1, 1, 1}, {1, 1, 8, 8}, {4096, 8, 256, 8}, {7, MaxTopK, MaxExperts, MaxRanks}, {MaxTokens, 9, 512, 2},
	}
	for _, s := range good {
		assert.NoError(t, s.Validate(), "%v", s)
	}
	bad := map[Shape]string{
		{-1, 8, 256, 8}:            "negative token count",
		{MaxTokens + 1, 8, 256, 8}: "more than",
		{4, 0, 256, 8}:             "top-k must be",
		{4, MaxTopK + 1, 256, 8}:   "top-k must be",
		{4, 8, 0, 8}:               "experts must be",
		{4, 8, MaxExperts + 64, 8}: "experts must be",
		{4, 8, 256, 0}:             "ranks must be",
		{4, 8, 256, MaxRanks * 2}:  "ranks must be",
		{4, 8, 100, 8}:             "do not divide evenly",
	}
	for s, msg := range bad {
		err := s.Validate()
		require.Error(t, err, "%v", s)
		assert.Contains(t, err.Error(), msg, "%v", s)
	}
}

func TestRankOf(t *testing.T) {
	s := Shape{Tokens: 1, K: 1, Experts: 256, Ranks: 8}
	assert.Equal(t, 32, s.ExpertsPerRank())
	assert.Equal(t, 0, s.RankOf(0))
	assert.Equal(t, 0, s.RankOf(31))
	assert.Equal(t, 1, s.RankOf(32))
	assert.Equal(t, 7, s.RankOf(255))
}

// The layout kernel computes e / (E/R) as (e * (2^32/d + 1)) >> 32. This
// checks the claim its comment makes for every expert id and every d the
// limits allow.
func TestKernelRankDivisionIsExact(t *testing.T) {
	if testing.Short() {
		t.Skip("exhaustive")
	}
	for d := uint64(1); d <= MaxExperts; d++ {
		magic := (uint64(1)<<32)/d + 1
		for e := uint64(0); e < MaxExperts; e += 1 + e/512 { // every id up to 512, then sampled
			if got := (e * magic) >> 32; got != e/d {
				t.Fatalf("d=%d e=%d: multiply-high gives %d, want %d", d, e, got, e/d)
			}
		}
		if e := uint64(MaxExperts - 1); (e*magic)>>32 != e/d {
			t.Fatalf("d=%d e=%d: multiply-high is wrong", d, e)
		}
	}
}
