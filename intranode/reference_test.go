package intranode

import (
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/kernels"
)

func bf(v float32) uint16 { return kernels.Float32ToBF16(v) }

func TestReferenceDispatchHandCase(t *testing.T) {
	// 2 ranks, 4 experts (rank 0: 0,1; rank 1: 2,3), top-2, hidden 2.
	s := Shape{Hidden: 2, TopK: 2, Experts: 4, Ranks: 2}
	in := []RankInput{
		{X: []uint16{bf(1), bf(2), bf(3), bf(4)}, TopK: []int64{0, 3, 1, -1}, Weights: []float32{.5, .25, 1, 0}},
		{X: []uint16{bf(5), bf(6)}, TopK: []int64{2, 3}, Weights: []float32{.1, .2}},
	}
	out, err := ReferenceDispatch(s, in, 0)
	require.NoError(t, err)
	// Rank 0 gets rank 0's tokens 0 and 1 (experts 0 and 1), nothing from rank 1.
	require.Equal(t, []uint16{bf(1), bf(2), bf(3), bf(4)}, out[0].RecvX)
	require.Equal(t, []int64{0, -1, 1, -1}, out[0].RecvTopK)
	require.Equal(t, []float32{.5, 0, 1, 0}, out[0].RecvWeights)
	require.Equal(t, []int32{2, 2}, out[0].RankPrefix)
	require.Equal(t, []int{1, 1}, out[0].TokensPerLocalExpert)
	// Rank 1 gets rank 0's token 0 (expert 3) then rank 1's token 0.
	require.Equal(t, []uint16{bf(1), bf(2), bf(5), bf(6)}, out[1].RecvX)
	require.Equal(t, []int64{-1, 1, 0, 1}, out[1].RecvTopK)
	require.Equal(t, []int32{0, 1}, out[1].RecvSrcRank)
	require.Equal(t, []int32{0, 0}, out[1].RecvSrcToken)
	require.Equal(t, []int32{1, 2}, out[1].RankPrefix)
	require.Equal(t, []int{1, 2}, out[1].TokensPerLocalExpert)

	aligned, err := ReferenceDispatch(s, in, 4)
	require.NoError(t, err)
	require.Equal(t, []int{4, 4}, aligned[1].TokensPerLocalExpert)

	// Combine: each rank returns its rows doubled; token 0 of rank 0 was on
	// both ranks, so it comes back as 2x + 2x.
	comb := make([]CombineInput, 2)
	for r, o := range out {
		y := make([]uint16, len(o.RecvX))
		for i, v := range o.RecvX {
			y[i] = bf(2 * kernels.BF16ToFloat32(v))
		}
		comb[r] = CombineInput{Y: y, Weights: o.RecvWeights}
	}
	res, err := ReferenceCombine(s, []int{2, 1}, out, comb)
	require.NoError(t, err)
	require.Equal(t, []uint16{bf(4), bf(8), bf(6), bf(8)}, res[0].X)
	require.Equal(t, []uint16{bf(10), bf(12)}, res[1].X)
	require.Equal(t, []float32{.5, .25, 1, 0}, res[0].Weights, "weights come back whole")
}

// randomRouting draws DeepEP's routing: top-k of |randn|+1 scores, with some
// entries masked to -1.
func randomRouting(r *rand.Rand, tokens int, s Shape, maskProb float64) []int64 {
	ids := make([]int64, 0, tokens*s.TopK)
	scores := make([]float64, s.Experts)
	for t := 0; t < tokens; t++ {
		for e := range scores {
			scores[e] = math.Abs(r.NormFloat64()) + 1
		}
		for k := 0; k < s.TopK; k++ {
			best := 0
			for e, v := range scores {
				if v > scores[best] {
					best = e
				}
			}
			scores[best] = -1
			id := int64(best)
			if r.Float64() < maskProb {
				id = -1
			}
			ids = append(ids, id)
		}
	}
	return ids
}

func TestReferenceDispatchCombineProperties(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	for _, s := range []Shape{{256, 8, 64, 8}, {128, 1, 8, 2}, {384, 9, 36, 4}, {128, 4, 512, 8}} {
		in := make([]RankInput, s.Ranks)
		tokens := make([]int, s.Ranks)
		for rank := range in {
			n := r.Intn(40)
			if rank == 1 {
				n = 0 // a rank that sends nothing
			}
			tokens[rank] = n
			x := make([]uint16, n*s.Hidden)
			for i := range x {
				x[i] = bf(float32(r.NormFloat64()))
			}
			w := make([]float32, n*s.TopK)
			for i := range w {
				w[i] = r.Float32()
			}
			in[rank] = RankInput{X: x, TopK: randomRouting(r, n, s, 0.1), Weights: w}
		}
		out, err := ReferenceDispatch(s, in, 0)
		require.NoError(t, err)
		var pairs, recvPairs int
		for _, x := range in {
			for _, e := range x.TopK {
				if e >= 0 {
					pairs++
				}
			}
		}
		for dst, o := range out {
			require.Equal(t, o.Received(), int(o.RankPrefix[s.Ranks-1]))
			for i := 0; i < o.Received(); i++ {
				src, tok := o.RecvSrcRank[i], o.RecvSrcToken[i]
				require.Equal(t, in[src].X[int(tok)*s.Hidden:int(tok+1)*s.Hidden], o.RecvX[i*s.Hidden:(i+1)*s.Hidden])
				if i > 0 { // ordered by source rank, then token
					p, pt := o.RecvSrcRank[i-1], o.RecvSrcToken[i-1]
					require.True(t, p < src || (p == src && pt < tok))
				}
			}
			for _, n := range o.TokensPerLocalExpert {
				recvPairs += n
			}
			for _, e := range o.RecvTopK {
				require.True(t, e >= -1 && e < int64(s.LocalExperts()), "rank %d local id %d", dst, e)
			}
		}
		require.Equal(t, pairs, recvPairs, "every (token, expert) pair lands exactly once")

		// DeepEP's combine check: send back what was received; the sum over
		// the ranks a token reached, divided by their number, is x again.
		comb := make([]CombineInput, s.Ranks)
		for rank, o := range out {
			comb[rank] = CombineInput{Y: o.RecvX, Weights: o.RecvWeights}
		}
		res, err := ReferenceCombine(s, tokens, out, comb)
		require.NoError(t, err)
		le := s.LocalExperts()
		for rank, x := range in {
			for tok := 0; tok < tokens[rank]; tok++ {
				reached := 0
				for dst := 0; dst < s.Ranks; dst++ {
					if hitsRank(x.TopK[tok*s.TopK:(tok+1)*s.TopK], dst, le) {
						reached++
					}
				}
				for j := 0; j < s.Hidden; j++ {
					want := kernels.BF16ToFloat32(x.X[tok*s.Hidden+j])
					got := kernels.BF16ToFloat32(res[rank].X[tok*s.Hidden+j])
					if reached == 0 {
						require.Zero(t, got)
						continue
					}
					require.InDelta(t, want, got/float32(reached), math.Abs(float64(want))/128+1e-30)
				}
				for k := 0; k < s.TopK; k++ {
					if x.TopK[tok*s.TopK+k] >= 0 {
						require.Equal(t, x.Weights[tok*s.TopK+k], res[rank].Weights[tok*s.TopK+k])
					}
				}
			}
		}
	}
}

func TestReferenceEdgeCases(t *testing.T) {
	s := Shape{Hidden: 128, TopK: 2, Experts: 8, Ranks: 4}
	one := func(ids ...int64) RankInput { return RankInput{X: make([]uint16, len(ids)/2*128), TopK: ids} }
	// All tokens to expert 5 (rank 2); the other ranks receive nothing.
	in := []RankInput{one(5, -1, -1, 5), one(), one(-1, -1), one(5, 4)}
	out, err := ReferenceDispatch(s, in, 0)
	require.NoError(t, err)
	require.Equal(t, 0, out[0].Received())
	require.Equal(t, 0, out[1].Received())
	require.Equal(t, 3, out[2].Received())
	require.Equal(t, []int{1, 3}, out[2].TokensPerLocalExpert) // expert 4 once, expert 5 three times

	_, err = ReferenceDispatch(s, []RankInput{one(8, 0), one(), one(), one()}, 0)
	require.ErrorContains(t, err, "token 0 slot 0: expert id 8")
	_, err = ReferenceDispatch(s, []RankInput{one(0, -2), one(), one(), one()}, 0)
	require.ErrorContains(t, err, "expert id -2")
	_, err = ReferenceDispatch(Shape{Hidden: 128, TopK: 2, Experts: 6, Ranks: 4}, in, 0)
	require.ErrorContains(t, err, "do not divide")
	_, err = ReferenceDispatch(s, in[:3], 0)
	require.Error(t, err)
	bad := one(0, 1)
	bad.X = bad.X[:5]
	_, err = ReferenceDispatch(s, []RankInput{bad, one(), one(), one()}, 0)
	require.ErrorContains(t, err, "BF16 values")
	_, err = ReferenceDispatch(Shape{Hidden: 100, TopK: 2, Experts: 8, Ranks: 4},
		[]RankInput{{XFP8: make([]uint8, 100), Scales: make([]float32, 0), TopK: []int64{0, 1}}, {XFP8: []uint8{}}, {XFP8: []uint8{}}, {XFP8: []uint8{}}}, 0)
	require.ErrorContains(t, err, "hidden % 128")
}

func TestReferenceFP8CarriesScales(t *testing.T) {
	s := Shape{Hidden: 256, TopK: 1, Experts: 2, Ranks: 2}
	q := make([]uint8, 2*256)
	for i := range q {
		q[i] = uint8(i)
	}
	in := []RankInput{{XFP8: q, Scales: []float32{1, 2, 3, 4}, TopK: []int64{1, 0}}, {XFP8: []uint8{}, Scales: []float32{}, TopK: nil}}
	out, err := ReferenceDispatch(s, in, 0)
	require.NoError(t, err)
	require.Equal(t, q[256:], out[0].RecvXFP8)
	require.Equal(t, []float32{3, 4}, out[0].RecvScales)
	require.Equal(t, q[:256], out[1].RecvXFP8)
	require.Equal(t, []float32{1, 2}, out[1].RecvScales)
}
