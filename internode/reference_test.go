package internode_test

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/routing"
)

func bf(v float32) uint16 { return kernels.Float32ToBF16(v) }

func fill(n int, v float32) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = bf(v)
	}
	return out
}

// 2 nodes x 2 ranks (node 0: ranks 0, 1; node 1: ranks 2, 3), one expert
// per rank, top-2, hidden 8 (16-byte BF16 rows), every count by hand.
func TestHandCase(t *testing.T) {
	s := internode.Shape{Topology: internode.Topology{Nodes: 2, RanksPerNode: 2}, Hidden: 8, TopK: 2, Experts: 4}
	in := []internode.RankInput{
		// Rank 0: token 0 -> ranks 1 (own node) and 3 (node 1); token 1 ->
		// ranks 2 and 3 (node 1 only); token 2: nothing (9 is invalid).
		{X: append(append(fill(8, 1), fill(8, 2)...), fill(8, 3)...), TopK: []int64{1, 3, 2, 3, -1, 9},
			Weights: []float32{.5, .25, 1, 2, 3, 4}},
		{X: []uint16{}, TopK: []int64{}, Weights: []float32{}},
		{X: []uint16{}, TopK: []int64{}, Weights: []float32{}},
		// Rank 3: token 0 -> ranks 0 and 1 (node 0); token 1 -> rank 3
		// twice (itself).
		{X: append(fill(8, 4), fill(8, 5)...), TopK: []int64{0, 1, 3, 3}, Weights: []float32{.1, .2, .3, .4}},
	}
	out, err := internode.ReferenceDispatch(s, in, 0)
	require.NoError(t, err)

	type src struct{ rank, token int32 }
	received := func(o internode.RankOutput) []src {
		var l []src
		for i := range o.RecvSrcRank {
			l = append(l, src{o.RecvSrcRank[i], o.RecvSrcToken[i]})
		}
		return l
	}
	require.Equal(t, []src{{3, 0}}, received(out[0]))
	require.Equal(t, []src{{0, 0}, {3, 0}}, received(out[1]))
	require.Equal(t, []src{{0, 1}}, received(out[2]))
	require.Equal(t, []src{{0, 0}, {0, 1}, {3, 1}}, received(out[3]))
	require.Equal(t, append(append(fill(8, 1), fill(8, 2)...), fill(8, 5)...), out[3].RecvX)
	require.Equal(t, []int64{-1, 0, -1, 0, 0, 0}, out[3].RecvTopK)
	require.Equal(t, []float32{0, .25, 0, 2, .3, .4}, out[3].RecvWeights)
	require.Equal(t, []int{4}, out[3].TokensPerLocalExpert, "(token, expert) pairs: rank 3's token 1 counts twice")
	require.Equal(t, []int32{2, 2, 2, 3}, out[3].RankPrefix)
	require.Equal(t, []int32{2, 3}, out[3].NodePrefix)
	require.Equal(t, []int32{1, 2}, out[1].NodePrefix)

	// Forwarders' network receive buffers (target bit = local rank).
	require.Equal(t, []internode.Relay{{SrcRank: 0, SrcToken: 0, Targets: 0b10}}, out[0].Relayed, "own node: rank 0 forwards itself")
	require.Equal(t, []internode.Relay{{SrcRank: 3, SrcToken: 0, Targets: 0b11}}, out[1].Relayed)
	require.Equal(t, []internode.Relay{{SrcRank: 0, SrcToken: 0, Targets: 0b10}, {SrcRank: 0, SrcToken: 1, Targets: 0b11}}, out[2].Relayed)
	require.Equal(t, []internode.Relay{{SrcRank: 3, SrcToken: 1, Targets: 0b10}}, out[3].Relayed)

	hop := func(n int, row int64) internode.Hop { return internode.Hop{Tokens: n, Bytes: int64(n) * row} }
	want := []internode.Traffic{
		{NetworkSend: hop(2, 16), NVLinkSend: hop(1, 16), NVLinkRecv: hop(1, 16), RDMASend: hop(3, 16), NVLRecv: hop(1, 16)},
		{NetworkRecv: hop(1, 16), NVLinkSend: hop(1, 16), NVLinkRecv: hop(1, 16), NVLRecv: hop(2, 16)},
		{NetworkRecv: hop(2, 16), NVLinkSend: hop(2, 16), NVLRecv: hop(1, 16)},
		{NetworkSend: hop(1, 16), NVLinkRecv: hop(2, 16), RDMASend: hop(2, 16), NVLRecv: hop(3, 16)},
	}
	for r := range want {
		require.Equal(t, want[r], out[r].Traffic, "dispatch traffic of rank %d", r)
	}

	// Combine: rank d's rows all hold d+1 and weight 1 per slot.
	cin := make([]internode.CombineInput, 4)
	for d, o := range out {
		w := make([]float32, o.Received()*2)
		for i := range w {
			w[i] = float32(d + 1)
		}
		cin[d] = internode.CombineInput{Y: fill(o.Received()*8, float32(d+1)), Weights: w}
	}
	cin[0].Bias0 = fill(3*8, 10)
	tokens := []int{3, 0, 0, 2}
	for _, p := range []internode.Partial{internode.PartialBF16, internode.PartialFP32} {
		res, err := internode.ReferenceCombine(s, tokens, out, cin, internode.CombineOptions{Partial: p})
		require.NoError(t, err)
		// Token (0,0) went to ranks 1 and 3, (0,1) to 2 and 3, (0,2) nowhere
		// (bias only), (3,0) to 0 and 1, (3,1) to 3.
		require.Equal(t, append(append(fill(8, 2+4+10), fill(8, 3+4+10)...), fill(8, 10)...), res[0].X)
		require.Equal(t, append(fill(8, 1+2), fill(8, 4)...), res[3].X)
		require.Equal(t, []float32{6, 6, 7, 7, 0, 0}, res[0].Weights)
		require.Empty(t, res[1].X)
		// Rows to forwarders: rank 0's (3,0) to rank 1, rank 1's (0,0) to
		// rank 0, rank 3's (0,0) and (0,1) to rank 2. Partials over the
		// network: rank 1 -> rank 3 for (3,0), rank 2 -> rank 0 for (0,0)
		// and (0,1).
		nb := int64(16)
		if p == internode.PartialFP32 {
			nb = 32
		}
		want := []internode.Traffic{
			{NetworkRecv: hop(2, nb), NVLinkSend: hop(1, 16), NVLinkRecv: hop(1, 16), RDMASend: hop(1, nb), NVLRecv: hop(1, 16)},
			{NetworkSend: hop(1, nb), NVLinkSend: hop(1, 16), NVLinkRecv: hop(1, 16), RDMASend: hop(1, nb), NVLRecv: hop(2, 16)},
			{NetworkSend: hop(2, nb), NVLinkRecv: hop(2, 16), RDMASend: hop(2, nb), NVLRecv: hop(3, 16)},
			{NetworkRecv: hop(1, nb), NVLinkSend: hop(2, 16), RDMASend: hop(1, nb), NVLRecv: hop(1, 16)},
		}
		for r := range want {
			require.Equal(t, want[r], res[r].Traffic, "combine traffic of rank %d (%v)", r, p)
		}
	}

	// FP8 rows: hidden 128 -> 128 bytes + one f32 scale.
	require.Equal(t, int64(132), internode.Shape{Hidden: 128}.DispatchRowBytes(true))
	require.Equal(t, int64(256), internode.Shape{Hidden: 128}.DispatchRowBytes(false))
}

// Network rounding: a node partial crosses as BF16 under PartialBF16 and
// exactly under PartialFP32; the own node's partial is never rounded.
func TestCombinePartialRounding(t *testing.T) {
	s := internode.Shape{Topology: internode.Topology{Nodes: 2, RanksPerNode: 1}, Hidden: 1, TopK: 2, Experts: 2}
	// Rank 0's token reaches rank 0 (own node) and rank 1 (other node).
	in := []internode.RankInput{{X: []uint16{bf(1)}, TopK: []int64{0, 1}}, {X: []uint16{}, TopK: []int64{}}}
	out, err := internode.ReferenceDispatch(s, in, 0)
	require.NoError(t, err)
	// One row per node: every partial is a BF16 value, so both formats
	// agree; 256 + 1 rounds once, at the end (tie to even: 256).
	cin := []internode.CombineInput{{Y: []uint16{bf(256)}}, {Y: []uint16{bf(1)}}}
	for _, p := range []internode.Partial{internode.PartialBF16, internode.PartialFP32} {
		res, err := internode.ReferenceCombine(s, []int{1, 0}, out, cin, internode.CombineOptions{Partial: p})
		require.NoError(t, err)
		require.Equal(t, []uint16{bf(256)}, res[0].X, "partial %d", p)
	}
	// Two rows on the remote node whose sum is not BF16.
	s2 := internode.Shape{Topology: internode.Topology{Nodes: 2, RanksPerNode: 2}, Hidden: 1, TopK: 3, Experts: 4}
	in2 := []internode.RankInput{{X: []uint16{bf(1)}, TopK: []int64{0, 2, 3}}, {X: []uint16{}, TopK: []int64{}},
		{X: []uint16{}, TopK: []int64{}}, {X: []uint16{}, TopK: []int64{}}}
	out2, err := internode.ReferenceDispatch(s2, in2, 0)
	require.NoError(t, err)
	// Own node: 0.5. Node 1: 256 + 1 = 257, which BF16 rounds to 256 (tie
	// to even); the final 0.5 + P: fp32 partial 257.5 -> BF16 258; BF16
	// partial 256.5 -> 256.
	cin2 := []internode.CombineInput{{Y: []uint16{bf(.5)}}, {Y: []uint16{}}, {Y: []uint16{bf(256)}}, {Y: []uint16{bf(1)}}}
	res, err := internode.ReferenceCombine(s2, []int{1, 0, 0, 0}, out2, cin2, internode.CombineOptions{Partial: internode.PartialBF16})
	require.NoError(t, err)
	require.Equal(t, bf(256), res[0].X[0])
	res, err = internode.ReferenceCombine(s2, []int{1, 0, 0, 0}, out2, cin2, internode.CombineOptions{Partial: internode.PartialFP32})
	require.NoError(t, err)
	require.Equal(t, bf(258), res[0].X[0])
	_, err = internode.ReferenceCombine(s2, []int{1, 0, 0, 0}, out2, cin2, internode.CombineOptions{Partial: 7})
	require.Error(t, err)
}

// The layout against routing's reference (rank and expert parts) and a
// node mask derived from routing's per-rank mask.
func TestLayoutMatchesRouting(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, top := range []internode.Topology{{Nodes: 1, RanksPerNode: 4}, {Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}, {Nodes: 4, RanksPerNode: 2}, {Nodes: 3, RanksPerNode: 3}} {
		for iter := 0; iter < 20; iter++ {
			w := top.World()
			s := internode.Shape{Topology: top, Hidden: 8, TopK: 1 + rng.Intn(9), Experts: w * (1 + rng.Intn(4))}
			tokens := rng.Intn(30)
			if iter == 0 {
				tokens = 0
			}
			ids := randomIDs(rng, s, tokens, iter%4)
			got, err := internode.ReferenceLayout(s, ids)
			require.NoError(t, err)
			rs := routing.Shape{Tokens: tokens, K: s.TopK, Experts: s.Experts, Ranks: w}
			want := routing.NewLayout(rs)
			invalid := routing.CountLayout(ids, rs, want.TokensPerRank, want.TokensPerExpert, want.IsTokenInRank)
			require.Equal(t, tokens, got.Tokens)
			require.Equal(t, invalid, got.Invalid)
			require.Equal(t, want.TokensPerRank, got.TokensPerRank)
			require.Equal(t, want.TokensPerExpert, got.TokensPerExpert)
			require.Equal(t, want.IsTokenInRank, got.IsTokenInRank)
			perNode := make([]int32, top.Nodes)
			inNode := make([]uint8, tokens*top.Nodes)
			for tok := 0; tok < tokens; tok++ {
				for n := 0; n < top.Nodes; n++ {
					for l := 0; l < top.RanksPerNode; l++ {
						if want.InRank(tok, n*top.RanksPerNode+l) {
							inNode[tok*top.Nodes+n] = 1
						}
					}
					perNode[n] += int32(inNode[tok*top.Nodes+n])
				}
			}
			require.Equal(t, perNode, got.TokensPerNode, "%v", top)
			require.Equal(t, inNode, got.IsTokenInNode, "%v", top)
		}
	}
}

// randomIDs draws top-k ids for tokens tokens. mode 0: uniform with -1 and
// out-of-range ids mixed in; 1: every id the same expert; 2: the last rank's
// experts (one rank: its last expert) never chosen; 3: only node 0's experts, mostly -1.
func randomIDs(rng *rand.Rand, s internode.Shape, tokens, mode int) []int64 {
	ids := make([]int64, tokens*s.TopK)
	one := int64(rng.Intn(s.Experts))
	le := s.Experts / s.World()
	for i := range ids {
		switch mode {
		case 0:
			switch r := rng.Intn(20); {
			case r == 0:
				ids[i] = -1
			case r == 1:
				ids[i] = []int64{int64(s.Experts), int64(s.Experts) + 3, -2, -7, 1 << 40}[rng.Intn(5)]
			default:
				ids[i] = int64(rng.Intn(s.Experts))
			}
		case 1:
			ids[i] = one
		case 2:
			// With one rank, leave out its last expert instead.
			n := s.Experts - le
			if n == 0 {
				n = s.Experts - 1
			}
			ids[i] = -1
			if n > 0 {
				ids[i] = int64(rng.Intn(n))
			}
		case 3:
			ids[i] = -1
			if rng.Intn(3) == 0 {
				ids[i] = int64(rng.Intn(le * s.RanksPerNode))
			}
		}
	}
	return ids
}

type key struct{ rank, token int32 }

// The key invariant: the forwarding path changes the route, not the result.
// Every rank receives the same rows as intranode's reference over the same
// world (same set; and, as documented, the same order), and combine gives
// intranode's result: bit for bit with one node, within the rounding bound
// of the node partials with several, exactly for small integers.
func TestMatchesIntranode(t *testing.T) {
	rng := rand.New(rand.NewSource(14))
	tops := []internode.Topology{{Nodes: 1, RanksPerNode: 1}, {Nodes: 1, RanksPerNode: 2}, {Nodes: 1, RanksPerNode: 4}, {Nodes: 1, RanksPerNode: 8},
		{Nodes: 2, RanksPerNode: 1}, {Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}, {Nodes: 4, RanksPerNode: 2}, {Nodes: 8, RanksPerNode: 1}}
	cases := 0
	for _, top := range tops {
		for iter := 0; iter < 40; iter++ {
			c := randomCase(rng, top, iter)
			t.Run(fmt.Sprintf("%v/%d", top, iter), func(t *testing.T) { checkCase(t, c) })
			cases++
		}
	}
	t.Logf("%d cases; %d elements where BF16 node partials changed the result (within the bound)", cases, roundedAway)
	require.Positive(t, roundedAway, "the tolerance path was never exercised")
}

// roundedAway counts combine elements that differ from intranode's.
var roundedAway int

type testCase struct {
	s         internode.Shape
	in        []internode.RankInput
	clean     []intranode.RankInput // ids outside [-1, E) replaced by -1
	fp8       bool
	ints      bool // small-integer values: combine must be exact
	weights   bool
	biases    bool
	alignment int
}

func randomCase(rng *rand.Rand, top internode.Topology, iter int) testCase {
	w := top.World()
	// Flags drawn independently (iteration numbers would tie them together);
	// top-k walks 1..9.
	c := testCase{fp8: rng.Intn(5) == 0, ints: rng.Intn(2) == 0, weights: rng.Intn(4) != 0, biases: rng.Intn(3) == 0, alignment: []int{0, 1, 4}[rng.Intn(3)]}
	c.s = internode.Shape{Topology: top, Hidden: 8, TopK: 1 + iter%9, Experts: w * (1 + rng.Intn(3))}
	if c.fp8 {
		c.s.Hidden = 128
	}
	h, k := c.s.Hidden, c.s.TopK
	mode := rng.Intn(4)
	value := func() float32 {
		if c.ints {
			return float32(rng.Intn(9) - 4)
		}
		return float32(rng.NormFloat64())
	}
	for r := 0; r < w; r++ {
		tokens := rng.Intn(12)
		if r == iter%w && rng.Intn(3) == 0 {
			tokens = 0
		}
		in := internode.RankInput{TopK: randomIDs(rng, c.s, tokens, mode)}
		if c.fp8 {
			in.XFP8 = make([]uint8, tokens*h)
			rng.Read(in.XFP8)
			in.Scales = make([]float32, tokens*h/128)
			for i := range in.Scales {
				in.Scales[i] = rng.Float32()
			}
		} else {
			in.X = make([]uint16, tokens*h)
			for i := range in.X {
				in.X[i] = bf(value())
			}
		}
		if c.weights {
			in.Weights = make([]float32, tokens*k)
			for i := range in.Weights {
				in.Weights[i] = value()
			}
		}
		cl := in
		cl.TopK = append([]int64(nil), in.TopK...)
		for i, e := range cl.TopK {
			if e < -1 || e >= int64(c.s.Experts) {
				cl.TopK[i] = -1
			}
		}
		c.in = append(c.in, in)
		c.clean = append(c.clean, cl)
	}
	return c
}

func checkCase(t *testing.T, c testCase) {
	s, w := c.s, c.s.World()
	ishape := intranode.Shape{Hidden: s.Hidden, TopK: s.TopK, Experts: s.Experts, Ranks: w}
	want, err := intranode.ReferenceDispatch(ishape, c.clean, c.alignment)
	require.NoError(t, err)
	got, err := internode.ReferenceDispatch(s, c.in, c.alignment)
	require.NoError(t, err)
	require.Len(t, got, w)

	// Received rows as sets keyed by source (rank, token), then the order.
	for d := range got {
		g, x := got[d], want[d]
		require.Equal(t, x.Received(), g.Received(), "rank %d received count", d)
		rows := map[key]int{}
		for i := range x.RecvSrcRank {
			rows[key{x.RecvSrcRank[i], x.RecvSrcToken[i]}] = i
		}
		for i := range g.RecvSrcRank {
			j, ok := rows[key{g.RecvSrcRank[i], g.RecvSrcToken[i]}]
			require.True(t, ok, "rank %d got (%d, %d), which intranode does not send it", d, g.RecvSrcRank[i], g.RecvSrcToken[i])
			delete(rows, key{g.RecvSrcRank[i], g.RecvSrcToken[i]})
			k, h := s.TopK, s.Hidden
			require.Equal(t, x.RecvTopK[j*k:(j+1)*k], g.RecvTopK[i*k:(i+1)*k], "rank %d row %d top-k", d, i)
			if c.weights {
				require.Equal(t, x.RecvWeights[j*k:(j+1)*k], g.RecvWeights[i*k:(i+1)*k], "rank %d row %d weights", d, i)
			}
			if c.fp8 {
				require.Equal(t, x.RecvXFP8[j*h:(j+1)*h], g.RecvXFP8[i*h:(i+1)*h])
				require.Equal(t, x.RecvScales[j*h/128:(j+1)*h/128], g.RecvScales[i*h/128:(i+1)*h/128])
			} else {
				require.Equal(t, x.RecvX[j*h:(j+1)*h], g.RecvX[i*h:(i+1)*h])
			}
		}
		require.Empty(t, rows, "rank %d misses rows", d)
		// The documented order (by source rank, then token) is intranode's.
		require.Equal(t, x.RecvSrcRank, g.RecvSrcRank, "rank %d order", d)
		require.Equal(t, x.RecvSrcToken, g.RecvSrcToken, "rank %d order", d)
		require.Equal(t, x.RankPrefix, g.RankPrefix, "rank %d", d)
		require.Equal(t, x.TokensPerLocalExpert, g.TokensPerLocalExpert, "rank %d", d)
		for n := 0; n < s.Nodes; n++ {
			require.Equal(t, x.RankPrefix[s.Rank(n, s.RanksPerNode-1)], g.NodePrefix[n], "rank %d node prefix %d", d, n)
		}
	}
	checkRoute(t, c, got)

	// Combine: each rank's input built from intranode's rows by key, so the
	// comparison does not lean on the order.
	tokens := make([]int, w)
	for r, x := range c.in {
		tokens[r] = len(x.TopK) / s.TopK
	}
	rng := rand.New(rand.NewSource(int64(w*1000 + s.TopK)))
	value := func() float32 {
		if c.ints {
			return float32(rng.Intn(7) - 3)
		}
		return float32(rng.NormFloat64())
	}
	wantIn := make([]intranode.CombineInput, w)
	gotIn := make([]internode.CombineInput, w)
	for d := range want {
		n, h, k := want[d].Received(), s.Hidden, s.TopK
		wi := intranode.CombineInput{Y: make([]uint16, n*h)}
		for i := range wi.Y {
			wi.Y[i] = bf(value())
		}
		if c.weights {
			wi.Weights = make([]float32, n*k)
			for i := range wi.Weights {
				wi.Weights[i] = value()
			}
		}
		if c.biases {
			wi.Bias0, wi.Bias1 = make([]uint16, tokens[d]*h), make([]uint16, tokens[d]*h)
			for i := range wi.Bias0 {
				wi.Bias0[i], wi.Bias1[i] = bf(value()), bf(value())
			}
		}
		pos := map[key]int{}
		for i := range want[d].RecvSrcRank {
			pos[key{want[d].RecvSrcRank[i], want[d].RecvSrcToken[i]}] = i
		}
		gi := internode.CombineInput{Y: make([]uint16, n*h), Bias0: wi.Bias0, Bias1: wi.Bias1}
		if c.weights {
			gi.Weights = make([]float32, n*k)
		}
		for i := range got[d].RecvSrcRank {
			j := pos[key{got[d].RecvSrcRank[i], got[d].RecvSrcToken[i]}]
			copy(gi.Y[i*h:(i+1)*h], wi.Y[j*h:(j+1)*h])
			if c.weights {
				copy(gi.Weights[i*k:(i+1)*k], wi.Weights[j*k:(j+1)*k])
			}
		}
		wantIn[d], gotIn[d] = wi, gi
	}
	wantC, err := intranode.ReferenceCombine(ishape, tokens, want, wantIn)
	require.NoError(t, err)
	// Per element, the sum of magnitudes that reach it: the error bound.
	mag := make([][]float64, w)
	wmag := make([][]float64, w)
	for r := range mag {
		mag[r] = make([]float64, tokens[r]*s.Hidden)
		wmag[r] = make([]float64, tokens[r]*s.TopK)
		if c.biases {
			for i := range mag[r] {
				mag[r][i] = math.Abs(float64(kernels.BF16ToFloat32(wantIn[r].Bias0[i]))) + math.Abs(float64(kernels.BF16ToFloat32(wantIn[r].Bias1[i])))
			}
		}
	}
	for d := range want {
		h, k := s.Hidden, s.TopK
		for i := range want[d].RecvSrcRank {
			src, tok := int(want[d].RecvSrcRank[i]), int(want[d].RecvSrcToken[i])
			for j := 0; j < h; j++ {
				mag[src][tok*h+j] += math.Abs(float64(kernels.BF16ToFloat32(wantIn[d].Y[i*h+j])))
			}
			if c.weights {
				for j := 0; j < k; j++ {
					wmag[src][tok*k+j] += math.Abs(float64(wantIn[d].Weights[i*k+j]))
				}
			}
		}
	}
	for _, p := range []internode.Partial{internode.PartialBF16, internode.PartialFP32} {
		gotC, err := internode.ReferenceCombine(s, tokens, got, gotIn, internode.CombineOptions{Partial: p})
		require.NoError(t, err)
		for r := range gotC {
			exact := s.Nodes == 1 || c.ints
			if exact {
				require.Equal(t, wantC[r].X, gotC[r].X, "rank %d combine (%v, partial %d)", r, s.Topology, p)
			} else {
				// Each node partial rounded to BF16 and the two final
				// roundings (each at most 2^-8 relative, of values no larger
				// than the magnitudes summed), plus fp32 reordering: below
				// 2^-6 of the magnitudes summed. FP32 partials leave the two
				// final roundings: 2^-7, and a hair for the reordering.
				bound := 1.0 / 64
				if p == internode.PartialFP32 {
					bound = 1.0/128 + 1e-6
				}
				for i, v := range gotC[r].X {
					a, b := float64(kernels.BF16ToFloat32(v)), float64(kernels.BF16ToFloat32(wantC[r].X[i]))
					require.LessOrEqual(t, math.Abs(a-b), mag[r][i]*bound, "rank %d element %d: %v vs %v (partial %d)", r, i, a, b, p)
					if a != b && p == internode.PartialBF16 {
						roundedAway++
					}
				}
			}
			if !c.weights {
				require.Nil(t, gotC[r].Weights)
				continue
			}
			if exact {
				require.Equal(t, wantC[r].Weights, gotC[r].Weights, "rank %d combine weights", r)
				continue
			}
			for i, v := range gotC[r].Weights {
				require.LessOrEqual(t, math.Abs(float64(v-wantC[r].Weights[i])), wmag[r][i]*1e-6, "rank %d weight %d", r, i)
			}
		}
		checkCombineTraffic(t, c, got, gotC, p)
	}
}

// checkRoute derives the forwarders' buffers and the dispatch traffic
// from routing's per-rank layout, independently of the route code.
func checkRoute(t *testing.T, c testCase, got []internode.RankOutput) {
	s, w, p := c.s, c.s.World(), c.s.RanksPerNode
	inRank := make([]*routing.Layout, w)
	for r, x := range c.in {
		rs := routing.Shape{Tokens: len(x.TopK) / s.TopK, K: s.TopK, Experts: s.Experts, Ranks: w}
		inRank[r] = routing.NewLayout(rs)
		routing.CountLayout(x.TopK, rs, inRank[r].TokensPerRank, inRank[r].TokensPerExpert, inRank[r].IsTokenInRank)
	}
	row := s.DispatchRowBytes(c.fp8)
	want := make([]internode.Traffic, w)
	for f := 0; f < w; f++ {
		n, i := s.Node(f), s.Local(f)
		var relayed []internode.Relay
		for a := 0; a < s.Nodes; a++ {
			src := s.Rank(a, i)
			for tok := 0; tok < inRank[src].Tokens; tok++ {
				var m uint8
				for l := 0; l < p; l++ {
					if inRank[src].InRank(tok, s.Rank(n, l)) {
						m |= 1 << l
					}
				}
				if m == 0 {
					continue
				}
				relayed = append(relayed, internode.Relay{SrcRank: int32(src), SrcToken: int32(tok), Targets: m})
				want[src].RDMASend.Tokens++
				if a != n {
					want[src].NetworkSend.Tokens++
					want[f].NetworkRecv.Tokens++
				}
				for l := 0; l < p; l++ {
					if m>>l&1 == 1 {
						want[s.Rank(n, l)].NVLRecv.Tokens++
						if l != i {
							want[f].NVLinkSend.Tokens++
							want[s.Rank(n, l)].NVLinkRecv.Tokens++
						}
					}
				}
			}
		}
		require.Equal(t, relayed, got[f].Relayed, "forwarder %d's network receive buffer", f)
	}
	for r := range want {
		for _, h := range []*internode.Hop{&want[r].NetworkSend, &want[r].NetworkRecv, &want[r].NVLinkSend, &want[r].NVLinkRecv, &want[r].RDMASend, &want[r].NVLRecv} {
			h.Bytes = int64(h.Tokens) * row
		}
		require.Equal(t, want[r], got[r].Traffic, "dispatch traffic of rank %d", r)
		if s.Nodes == 1 {
			require.Zero(t, got[r].Traffic.NetworkSend.Tokens, "one node: nothing crosses the network")
		}
	}
}

// checkCombineTraffic: combine moves, per link, what dispatch moved the
// other way, except that a forwarder sends one partial per (token, node)
// where dispatch's NVLink fan-out sent several rows.
func checkCombineTraffic(t *testing.T, c testCase, d []internode.RankOutput, comb []internode.CombineOutput, p internode.Partial) {
	h := int64(c.s.Hidden)
	nb := 2 * h
	if p == internode.PartialFP32 {
		nb = 4 * h
	}
	for r := range d {
		dt, ct := d[r].Traffic, comb[r].Traffic
		require.Equal(t, internode.Hop{Tokens: dt.NetworkRecv.Tokens, Bytes: int64(dt.NetworkRecv.Tokens) * nb}, ct.NetworkSend, "rank %d", r)
		require.Equal(t, internode.Hop{Tokens: dt.NetworkSend.Tokens, Bytes: int64(dt.NetworkSend.Tokens) * nb}, ct.NetworkRecv, "rank %d", r)
		require.Equal(t, len(d[r].Relayed), ct.RDMASend.Tokens, "rank %d", r)
		require.Equal(t, internode.Hop{Tokens: dt.NVLinkRecv.Tokens, Bytes: int64(dt.NVLinkRecv.Tokens) * 2 * h}, ct.NVLinkSend, "rank %d", r)
		require.Equal(t, internode.Hop{Tokens: dt.NVLinkSend.Tokens, Bytes: int64(dt.NVLinkSend.Tokens) * 2 * h}, ct.NVLinkRecv, "rank %d", r)
	}
}

// Bad input is an error naming what is wrong, never a panic.
func TestReferenceErrors(t *testing.T) {
	top := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: top, Hidden: 8, TopK: 2, Experts: 4}
	ok := func() []internode.RankInput {
		in := make([]internode.RankInput, 4)
		for r := range in {
			in[r] = internode.RankInput{X: make([]uint16, 8), TopK: []int64{0, 3}, Weights: []float32{1, 1}}
		}
		return in
	}
	_, err := internode.ReferenceDispatch(s, ok(), 0)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		s   internode.Shape
		mod func([]internode.RankInput) []internode.RankInput
		msg string
	}{
		"topology": {internode.Shape{Topology: internode.Topology{Nodes: 2, RanksPerNode: 9}, Hidden: 8, TopK: 2, Experts: 18}, nil, "ranks per node"},
		"experts":  {internode.Shape{Topology: top, Hidden: 8, TopK: 2, Experts: 6}, nil, "6 experts over 4 ranks"},
		"topk":     {internode.Shape{Topology: top, Hidden: 8, TopK: 33, Experts: 4}, nil, "top-k 33"},
		"hidden":   {internode.Shape{Topology: top, Hidden: 0, TopK: 2, Experts: 4}, nil, "hidden 0"},
		"ranks":    {s, func(in []internode.RankInput) []internode.RankInput { return in[:3] }, "3 rank inputs for 4 ranks"},
		"ids":      {s, func(in []internode.RankInput) []internode.RankInput { in[2].TopK = []int64{1}; return in }, "rank 2: 1 top-k ids"},
		"weights":  {s, func(in []internode.RankInput) []internode.RankInput { in[1].Weights = []float32{1}; return in }, "rank 1: 1 weights"},
		"x":        {s, func(in []internode.RankInput) []internode.RankInput { in[3].X = in[3].X[:7]; return in }, "rank 3: 7 BF16 values"},
		"fp8 hidden": {s, func(in []internode.RankInput) []internode.RankInput {
			in[0].XFP8, in[0].X = make([]uint8, 8), nil
			return in
		}, "FP8 needs hidden"},
		"mixed": {s, func(in []internode.RankInput) []internode.RankInput { in[1].XFP8 = make([]uint8, 8); return in }, "rank 1: 8 BF16 values (and 8 FP8 bytes)"},
	} {
		in := ok()
		if tc.mod != nil {
			in = tc.mod(in)
		}
		_, err := internode.ReferenceDispatch(tc.s, in, 0)
		require.Error(t, err, name)
		require.ErrorContains(t, err, tc.msg, name)
	}
	s128 := s
	s128.Hidden = 128
	fp8 := make([]internode.RankInput, 4)
	for r := range fp8 {
		fp8[r] = internode.RankInput{XFP8: make([]uint8, 128), Scales: []float32{1}, TopK: []int64{0, 3}}
	}
	_, err = internode.ReferenceDispatch(s128, fp8, 0)
	require.NoError(t, err)
	fp8[2].Scales = nil
	_, err = internode.ReferenceDispatch(s128, fp8, 0)
	require.ErrorContains(t, err, "rank 2: FP8 input of 128 bytes, 0 scales")
	_, err = internode.ReferenceLayout(s, []int64{1, 2, 3})
	require.ErrorContains(t, err, "layout: 3 top-k ids")

	out, err := internode.ReferenceDispatch(s, ok(), 0)
	require.NoError(t, err)
	cin := make([]internode.CombineInput, 4)
	for d, o := range out {
		cin[d] = internode.CombineInput{Y: make([]uint16, o.Received()*8)}
	}
	tokens := []int{1, 1, 1, 1}
	_, err = internode.ReferenceCombine(s, tokens, out, cin, internode.CombineOptions{})
	require.NoError(t, err)
	_, err = internode.ReferenceCombine(s, []int{1, -1, 1, 1}, out, cin, internode.CombineOptions{})
	require.ErrorContains(t, err, "rank 1: -1 tokens")
	_, err = internode.ReferenceCombine(s, []int{1, math.MaxInt / 2, 1, 1}, out, cin, internode.CombineOptions{})
	require.ErrorContains(t, err, "more than")
	_, err = internode.ReferenceCombine(s, tokens[:3], out, cin, internode.CombineOptions{})
	require.ErrorContains(t, err, "combine needs 4 ranks")
	_, err = internode.ReferenceCombine(s, []int{0, 1, 1, 1}, out, cin, internode.CombineOptions{})
	require.ErrorContains(t, err, "names token 0 of rank 0")
	bad := append([]internode.CombineInput(nil), cin...)
	bad[3].Y = bad[3].Y[:1]
	_, err = internode.ReferenceCombine(s, tokens, out, bad, internode.CombineOptions{})
	require.ErrorContains(t, err, "rank 3: combine input has 1 values")
	bad = append([]internode.CombineInput(nil), cin...)
	bad[2].Bias1 = make([]uint16, 3)
	_, err = internode.ReferenceCombine(s, tokens, out, bad, internode.CombineOptions{})
	require.ErrorContains(t, err, "rank 2: bias of 3 values")
	bad = append([]internode.CombineInput(nil), cin...)
	bad[0].Weights = []float32{}
	_, err = internode.ReferenceCombine(s, tokens, out, bad, internode.CombineOptions{})
	require.ErrorContains(t, err, "combine weights")
}
