package lowlatency_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/lowlatency"
)

// A hand-worked case: 2 ranks, 2 local experts each, top-2.
func TestReferenceDispatchByHand(t *testing.T) {
	c := lowlatency.Config{Ranks: 2, MaxTokens: 3, Hidden: 8, TopK: 2, LocalExperts: 2}
	row := func(v float32) []uint16 {
		r := make([]uint16, 8)
		for i := range r {
			r[i] = kernels.Float32ToBF16(v)
		}
		return r
	}
	cat := func(rs ...[]uint16) []uint16 {
		var o []uint16
		for _, r := range rs {
			o = append(o, r...)
		}
		return o
	}
	ins := []lowlatency.RankInput{
		// rank 0: token 0 -> experts 1, 2; token 1 -> 3, -1; token 2 -> 1, 1 (listed twice)
		{X: cat(row(1), row(2), row(3)), TopK: []int64{1, 2, 3, -1, 1, 1}, Weights: []float32{.5, .25, 2, 9, 1, 3}},
		// rank 1: token 0 -> 0, 7 (7 is out of range: ignored)
		{X: row(4), TopK: []int64{0, 7}},
	}
	got, err := lowlatency.ReferenceDispatch(c, ins, lowlatency.Options{})
	require.NoError(t, err)
	// -1 is no expert; 7 (of 4 experts) is counted; -2 and 4 would be too.
	require.Equal(t, []int{0, 1}, lowlatency.ReferenceInvalidIDs(c, ins))
	require.Equal(t, []int{2}, lowlatency.ReferenceInvalidIDs(lowlatency.Config{Ranks: 1, LocalExperts: 4},
		[]lowlatency.RankInput{{TopK: []int64{-1, -2, 4, 3, 0}}}))
	type rt struct{ src, tok, slot int }
	rows := func(r []lowlatency.RecvRow) []rt {
		o := []rt{}
		for _, x := range r {
			o = append(o, rt{x.Src, x.Token, x.Slot})
		}
		return o
	}
	// rank 0, expert 0: rank 1 token 0; expert 1: rank 0 tokens 0, 2 (twice).
	require.Equal(t, []rt{{1, 0, 0}}, rows(got[0].Experts[0]))
	require.Equal(t, []rt{{0, 0, 0}, {0, 2, 0}, {0, 2, 1}}, rows(got[0].Experts[1]))
	require.Equal(t, [2]int{0, 3}, got[0].Range[1][0])
	require.Equal(t, [2]int{3, 0}, got[0].Range[1][1])
	// rank 1, expert 0 (global 2): rank 0 token 0 slot 1; expert 1 (3): rank 0 token 1.
	require.Equal(t, []rt{{0, 0, 1}}, rows(got[1].Experts[0]))
	require.Equal(t, []rt{{0, 1, 0}}, rows(got[1].Experts[1]))
	require.Equal(t, float32(.25), got[1].Experts[0][0].Weight)
	require.Equal(t, []bool{true, true, false}, got[1].Sources[0])
	require.Equal(t, []int32{-1, 0, 1, -1, -1, -1}, got[1].LocalIDs[0])

	// Combine with y = the received row times (le+1): token 0 of rank 0 is
	// 0.5*1*2 (rank 0, expert 1) + 0.25*1*1 (rank 1, expert 0) = 1.25.
	ys := make([]lowlatency.CombineInput, 2)
	for d, rv := range got {
		ys[d].Y = make([][][]uint16, 2)
		for l, rs := range rv.Experts {
			for _, r := range rs {
				y := make([]uint16, 8)
				for i, v := range r.X {
					y[i] = kernels.Float32ToBF16(kernels.BF16ToFloat32(v) * float32(l+1))
				}
				ys[d].Y[l] = append(ys[d].Y[l], y)
			}
		}
	}
	out, err := lowlatency.ReferenceCombine(c, ins, got, ys, false, lowlatency.Options{})
	require.NoError(t, err)
	require.Equal(t, float32(1.25), kernels.BF16ToFloat32(out[0][0]))
	require.Equal(t, float32(2*2*2), kernels.BF16ToFloat32(out[0][8]))      // token 1: x 2, weight 2, rank 1 expert 1 (y = 2x)
	require.Equal(t, float32(3*2*(1+3)), kernels.BF16ToFloat32(out[0][16])) // token 2: twice expert 1 on rank 0
	require.Equal(t, float32(4*1), kernels.BF16ToFloat32(out[1][0]))        // rank 1 token 0: expert 0, weight 1

	// Masking rank 1: rank 0 keeps only its own rows, rank 1 gets nothing.
	got, err = lowlatency.ReferenceDispatch(c, ins, lowlatency.Options{Masked: 2})
	require.NoError(t, err)
	require.Equal(t, []rt{{0, 0, 0}, {0, 2, 0}, {0, 2, 1}}, rows(got[0].Experts[1]))
	require.Empty(t, got[0].Experts[0])
	require.Empty(t, got[1].Experts[0])
	require.Empty(t, got[1].Experts[1])
}

// The FP8 cast: per 128-group scales, dequantization within FP8's rounding
// error, UE8M0 scales powers of two at least the FP8 scale.
func TestQuantizeRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]uint16, 512)
	for i := range x {
		x[i] = kernels.Float32ToBF16(float32(rng.NormFloat64() * math.Pow(2, float64(i/128*5-8))))
	}
	for i := 128; i < 256; i++ {
		x[i] = 0 // amax clamps to 1e-4
	}
	q, s, _ := lowlatency.QuantizeRow(x, lowlatency.FP8)
	qu, su, ex := lowlatency.QuantizeRow(x, lowlatency.UE8M0)
	for g := 0; g < 4; g++ {
		amax := float32(1e-4)
		for _, v := range x[g*128 : (g+1)*128] {
			amax = max(amax, float32(math.Abs(float64(kernels.BF16ToFloat32(v)))))
		}
		require.Equal(t, amax/448, s[g], "group %d", g)
		require.Equal(t, float64(su[g]), math.Ldexp(1, int(ex[g])-127), "group %d", g)
		require.GreaterOrEqual(t, su[g], s[g])
		require.Less(t, su[g], 2*s[g])
		for i := g * 128; i < (g+1)*128; i++ {
			v := float64(kernels.BF16ToFloat32(x[i]))
			for _, c := range []struct {
				q  uint8
				sc float32
			}{{q[i], s[g]}, {qu[i], su[g]}} {
				d := float64(kernels.FP8E4M3ToFloat32(c.q)) * float64(c.sc)
				// E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normals,
				// absolute <= half a subnormal step (2^-10 * scale) below.
				require.LessOrEqual(t, math.Abs(d-v), math.Max(math.Abs(v)/16, math.Ldexp(float64(c.sc), -10)), "x[%d]=%g", i, v)
			}
		}
	}
	require.Equal(t, []uint32{uint32(ex[0]) | uint32(ex[1])<<8 | uint32(ex[2])<<16 | uint32(ex[3])<<24}, lowlatency.PackExps(ex))
}

func TestConfigRefusals(t *testing.T) {
	ok := lowlatency.Config{Ranks: 8, MaxTokens: 128, Hidden: 7168, TopK: 8, LocalExperts: 32, FP8: true}
	require.NoError(t, ok.Validate())
	for _, c := range []lowlatency.Config{
		{Ranks: 9, MaxTokens: 1, Hidden: 8, TopK: 1, LocalExperts: 1},
		{Ranks: 2, MaxTokens: 0, Hidden: 8, TopK: 1, LocalExperts: 1},
		{Ranks: 2, MaxTokens: 1, Hidden: 12, TopK: 1, LocalExperts: 1},
		{Ranks: 2, MaxTokens: 1, Hidden: 64, TopK: 1, LocalExperts: 1, FP8: true},
		{Ranks: 2, MaxTokens: 1, Hidden: 8, TopK: 33, LocalExperts: 1},
		{Ranks: 2, MaxTokens: 1, Hidden: 8, TopK: 1, LocalExperts: 0},
		{Ranks: 3, MaxTokens: 1, Hidden: 8, TopK: 1, LocalExperts: 1, Nodes: 2}, // nodes do not divide the ranks
		{Ranks: 9, MaxTokens: 1, Hidden: 8, TopK: 1, LocalExperts: 1, Nodes: 1}, // 9 ranks on one node
		{Ranks: 8, MaxTokens: 1 << 20, Hidden: 8, TopK: 1, LocalExperts: 512},
	} {
		_, err := lowlatency.NewLayout(c)
		require.Error(t, err, "%+v", c)
	}
	l, err := lowlatency.NewLayout(ok)
	require.NoError(t, err)
	n, err := lowlatency.SizeHint(ok)
	require.NoError(t, err)
	require.Equal(t, l.Size, n)
	// Regions are disjoint and in order.
	end := l.Ctrl.End()
	for b := range l.Set {
		s := l.Set[b]
		for _, r := range []lowlatency.Region{s.StageX, s.StageS, s.StageIDs, s.StageW, s.RecvX, s.RecvS, s.RecvSrc, s.RecvRange,
			s.RecvCount, s.TabPos, s.TabW, s.TabT, s.TabRow, s.OwnMask, s.CStage, s.CombineX, s.CombineS} {
			require.GreaterOrEqual(t, r.Offset, end)
			require.Zero(t, r.Offset%256)
			end = r.End()
		}
	}
	require.LessOrEqual(t, end, l.Size)
}
