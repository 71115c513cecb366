package routing

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGenerateDeepEPStyle(t *testing.T) {
	s := Shape{Tokens: 512, K: 8, Experts: 256, Ranks: 8}
	r, err := Generate(s, GenOptions{Seed: 42})
	require.NoError(t, err)
	require.NoError(t, r.Validate())
	require.NoError(t, r.CheckDistinct(), "top-k of distinct scores picks distinct experts")
	for _, v := range r.Idx {
		require.GreaterOrEqual(t, v, int64(0), "no masking asked for")
	}
	again, err := Generate(s, GenOptions{Seed: 42})
	require.NoError(t, err)
	assert.Equal(t, r.Idx, again.Idx, "same seed, same routing")
	other, err := Generate(s, GenOptions{Seed: 43})
	require.NoError(t, err)
	assert.NotEqual(t, r.Idx, other.Idx)

	// Scores are i.i.d., so experts are picked uniformly: 512*8/256 = 16
	// per expert on average. A loose bound catches a biased selection.
	l, err := r.Layout()
	require.NoError(t, err)
	for e, n := range l.TokensPerExpert {
		assert.True(t, n > 0 && n < 48, "expert %d got %d tokens", e, n)
	}
}

func TestGenerateMasked(t *testing.T) {
	s := Shape{Tokens: 100, K: 4, Experts: 32, Ranks: 4}
	r, err := Generate(s, GenOptions{Seed: 1, Masked: 10})
	require.NoError(t, err)
	masked := 0
	for _, v := range r.Idx {
		if v == -1 {
			masked++
		}
	}
	assert.True(t, masked >= 1 && masked <= 10, "masked %d", masked)
	all, err := Generate(s, GenOptions{Seed: 1, Masked: 100000})
	require.NoError(t, err)
	for _, v := range all.Idx {
		require.Equal(t, int64(-1), v, "enough draws mask everything")
	}
	empty, err := Generate(Shape{Tokens: 0, K: 4, Experts: 32, Ranks: 4}, GenOptions{Masked: 5})
	require.NoError(t, err)
	assert.Empty(t, empty.Idx)
}

func TestGenerateSkews(t *testing.T) {
	s := Shape{Tokens: 200, K: 1, Experts: 64, Ranks: 8}
	r, err := Generate(s, GenOptions{Seed: 2, Always: []int{17}})
	require.NoError(t, err)
	for _, v := range r.Idx {
		require.Equal(t, int64(17), v, "K=1 with one hot expert sends every token there")
	}

	s.K = 4
	r, err = Generate(s, GenOptions{Seed: 2, Always: []int{40, 3}})
	require.NoError(t, err)
	require.NoError(t, r.CheckDistinct())
	for tok := 0; tok < s.Tokens; tok++ {
		require.Equal(t, []int64{40, 3}, r.Row(tok)[:2], "forced experts lead each row in the given order")
	}

	s.K = 8
	r, err = Generate(s, GenOptions{Seed: 3, EmptyRanks: []int{0, 5}})
	require.NoError(t, err)
	require.NoError(t, r.CheckDistinct())
	for _, v := range r.Idx {
		rank := s.RankOf(int(v))
		require.True(t, rank != 0 && rank != 5, "expert %d is on an empty rank", v)
	}
}

func TestGenerateRejectsImpossibleOptions(t *testing.T) {
	s := Shape{Tokens: 4, K: 4, Experts: 8, Ranks: 4}
	cases := map[string]GenOptions{
		"negative mask count":   {Masked: -1},
		"empty rank 4":          {EmptyRanks: []int{4}},
		"do not fit top-4":      {Always: []int{0, 1, 2, 3, 4}},
		"expert 8 out of range": {Always: []int{8}},
		"always-picked twice":   {Always: []int{1, 1}},
		"its rank 0 is empty":   {Always: []int{1}, EmptyRanks: []int{0}},
		"only 2 experts":        {EmptyRanks: []int{0, 1, 2}},
	}
	for msg, o := range cases {
		_, err := Generate(s, o)
		assert.ErrorContains(t, err, msg)
	}
	_, err := Generate(Shape{Tokens: 4, K: 4, Experts: 6, Ranks: 4}, GenOptions{})
	assert.ErrorContains(t, err, "do not divide evenly")
}
