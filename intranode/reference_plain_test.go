package intranode

import (
	"flag"
	"fmt"
	"math"
	"math/rand"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/kernels"
)

// The references as they were written first: one loop over destinations,
// sources and tokens for dispatch, one over receiving ranks and rows for
// combine. ReferenceDispatch and ReferenceCombine split the same work over
// cores; these plain loops are what they must equal, bit for bit.

// plainDispatch is ReferenceDispatch as a single loop.
func plainDispatch(s Shape, in []RankInput, alignment int) ([]RankOutput, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if len(in) != s.Ranks {
		return nil, fmt.Errorf("intranode: %d rank inputs for %d ranks", len(in), s.Ranks)
	}
	fp8 := in[0].XFP8 != nil
	for r, x := range in {
		if err := checkInput(s, r, x, fp8); err != nil {
			return nil, err
		}
	}
	le := s.LocalExperts()
	out := make([]RankOutput, s.Ranks)
	for dst := range out {
		o := &out[dst]
		o.RankPrefix = make([]int32, s.Ranks)
		perExpert := make([]int, le)
		for src, x := range in {
			for t := 0; t < x.Tokens(s); t++ {
				row := x.TopK[t*s.TopK : (t+1)*s.TopK]
				if !hitsRank(row, dst, le) {
					continue
				}
				o.RecvSrcRank = append(o.RecvSrcRank, int32(src))
				o.RecvSrcToken = append(o.RecvSrcToken, int32(t))
				for k, e := range row {
					w := float32(0)
					local := int64(-1)
					if e >= 0 && int(e)/le == dst {
						local = e - int64(dst*le)
						perExpert[local]++
						if x.Weights != nil {
							w = x.Weights[t*s.TopK+k]
						}
					}
					o.RecvTopK = append(o.RecvTopK, local)
					if x.Weights != nil {
						o.RecvWeights = append(o.RecvWeights, w)
					}
				}
				h := s.Hidden
				if fp8 {
					o.RecvXFP8 = append(o.RecvXFP8, x.XFP8[t*h:(t+1)*h]...)
					o.RecvScales = append(o.RecvScales, x.Scales[t*h/128:(t+1)*h/128]...)
				} else {
					o.RecvX = append(o.RecvX, x.X[t*h:(t+1)*h]...)
				}
			}
			o.RankPrefix[src] = int32(len(o.RecvSrcRank))
		}
		for e, n := range perExpert {
			if alignment > 1 {
				n = (n + alignment - 1) / alignment * alignment
			}
			perExpert[e] = n
		}
		o.TokensPerLocalExpert = perExpert
	}
	return out, nil
}

// plainCombine is ReferenceCombine as a single loop.
func plainCombine(s Shape, tokens []int, dispatched []RankOutput, in []CombineInput) ([]CombineOutput, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if len(dispatched) != s.Ranks || len(in) != s.Ranks || len(tokens) != s.Ranks {
		return nil, fmt.Errorf("intranode: combine needs %d ranks of layout, input and token counts", s.Ranks)
	}
	h := s.Hidden
	acc := make([][]float32, s.Ranks)
	out := make([]CombineOutput, s.Ranks)
	withWeights := in[0].Weights != nil
	for r := range acc {
		// Sizes from the caller are checked before any make: a count times
		// hidden that overflows (or is negative) is an error, not a panic.
		n, ok := checked.Mul(tokens[r], h)
		if !ok || tokens[r] > math.MaxInt/max(s.TopK, 1) {
			return nil, fmt.Errorf("intranode: rank %d: %d tokens of hidden %d: negative or too large", r, tokens[r], h)
		}
		acc[r] = make([]float32, n)
		if withWeights {
			out[r].Weights = make([]float32, tokens[r]*s.TopK)
		}
	}
	for r, d := range dispatched {
		n := d.Received()
		if len(in[r].Y) != n*h {
			return nil, fmt.Errorf("intranode: rank %d: combine input has %d values for %d received tokens of hidden %d", r, len(in[r].Y), n, h)
		}
		if withWeights && len(in[r].Weights) != n*s.TopK {
			return nil, fmt.Errorf("intranode: rank %d: %d combine weights for %d tokens of top-k %d", r, len(in[r].Weights), n, s.TopK)
		}
		for i := 0; i < n; i++ {
			src, t := int(d.RecvSrcRank[i]), int(d.RecvSrcToken[i])
			dst := acc[src][t*h : (t+1)*h]
			for j, v := range in[r].Y[i*h : (i+1)*h] {
				dst[j] += kernels.BF16ToFloat32(v)
			}
			if withWeights {
				ws := out[src].Weights[t*s.TopK : (t+1)*s.TopK]
				for k, w := range in[r].Weights[i*s.TopK : (i+1)*s.TopK] {
					ws[k] += w
				}
			}
		}
	}
	for r := range out {
		x := make([]uint16, len(acc[r]))
		for j, v := range acc[r] {
			if b := in[r].Bias0; b != nil {
				v += kernels.BF16ToFloat32(b[j])
			}
			if b := in[r].Bias1; b != nil {
				v += kernels.BF16ToFloat32(b[j])
			}
			x[j] = kernels.Float32ToBF16(v)
		}
		out[r].X = x
	}
	return out, nil
}

// The parallel references equal the plain loops bit for bit on random
// inputs: BF16 and FP8, weights on every rank or on some only, zero, one
// and two biases, NaN/inf/subnormal rows, ranks that send or receive
// nothing, and more tokens than one combine block. GOMAXPROCS is raised so
// that the work really is split even on a small machine.
func TestReferenceMatchesPlainLoops(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	r := rand.New(rand.NewSource(11))
	specials := []uint16{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8003, 0x7f7f}
	for c, s := range []Shape{{256, 8, 64, 8}, {128, 1, 8, 2}, {384, 9, 36, 4}, {128, 4, 512, 8}, {256, 2, 3, 1}} {
		for _, fp8 := range []bool{false, true} {
			in := make([]RankInput, s.Ranks)
			tokens := make([]int, s.Ranks)
			for rank := range in {
				n := r.Intn(200)
				if rank == 1 || r.Intn(6) == 0 {
					n = 0
				}
				tokens[rank] = n
				ids := randomRouting(r, n, s, 0.1)
				if rank == 2 { // a rank no token reaches from here
					for i, e := range ids {
						if int(e)/s.LocalExperts() == 0 {
							ids[i] = -1
						}
					}
				}
				in[rank].TopK = ids
				if fp8 {
					in[rank].XFP8 = make([]uint8, n*s.Hidden)
					for i := range in[rank].XFP8 {
						in[rank].XFP8[i] = uint8(r.Uint32())
					}
					in[rank].Scales = make([]float32, n*s.Hidden/128)
					for i := range in[rank].Scales {
						in[rank].Scales[i] = float32(r.NormFloat64())
					}
				} else {
					in[rank].X = make([]uint16, n*s.Hidden)
					for i := range in[rank].X {
						in[rank].X[i] = uint16(r.Uint32())
					}
				}
				if c%2 == 0 || rank%2 == 0 { // some shapes: weights on even ranks only
					in[rank].Weights = make([]float32, n*s.TopK)
					for i := range in[rank].Weights {
						in[rank].Weights[i] = float32(r.NormFloat64())
					}
				}
			}
			for _, align := range []int{0, 4} {
				want, err := plainDispatch(s, in, align)
				require.NoError(t, err)
				got, err := ReferenceDispatch(s, in, align)
				require.NoError(t, err)
				require.Equal(t, want, got, "shape %v fp8 %v align %d", s, fp8, align)
			}
			if fp8 {
				continue
			}
			out, err := plainDispatch(s, in, 0)
			require.NoError(t, err)
			for bias := 0; bias <= 2; bias++ {
				comb := make([]CombineInput, s.Ranks)
				for rank, o := range out {
					y := make([]uint16, len(o.RecvX))
					for i := range y {
						y[i] = uint16(r.Uint32())
						if r.Intn(50) == 0 {
							y[i] = specials[r.Intn(len(specials))]
						}
					}
					comb[rank].Y = y
					if in[0].Weights != nil {
						comb[rank].Weights = make([]float32, o.Received()*s.TopK)
						for i := range comb[rank].Weights {
							comb[rank].Weights[i] = float32(r.NormFloat64())
						}
					}
					for j := 0; j < bias; j++ {
						b := make([]uint16, tokens[rank]*s.Hidden)
						for i := range b {
							b[i] = uint16(r.Uint32())
						}
						if j == 0 {
							comb[rank].Bias0 = b
						} else {
							comb[rank].Bias1 = b
						}
					}
				}
				want, err := plainCombine(s, tokens, out, comb)
				require.NoError(t, err)
				got, err := ReferenceCombine(s, tokens, out, comb)
				require.NoError(t, err)
				require.Equal(t, len(want), len(got))
				for rank := range want { // bits: NaN != NaN for require.Equal
					require.Equal(t, bits(want[rank].Weights), bits(got[rank].Weights), "shape %v bias %d rank %d weights", s, bias, rank)
					require.Equal(t, want[rank].X, got[rank].X, "shape %v bias %d rank %d x", s, bias, rank)
				}
			}
		}
	}
}

func bits(f []float32) []uint32 {
	if f == nil {
		return nil
	}
	u := make([]uint32, len(f))
	for i, v := range f {
		u[i] = math.Float32bits(v)
	}
	return u
}

// A layout naming a source outside the ranks or their tokens is an error,
// not an index panic.
func TestReferenceCombineRejectsBadLayout(t *testing.T) {
	s := Shape{Hidden: 128, TopK: 1, Experts: 2, Ranks: 2}
	out := []RankOutput{{RecvSrcRank: []int32{1}, RecvSrcToken: []int32{3}}, {}}
	in := []CombineInput{{Y: make([]uint16, 128)}, {}}
	_, err := ReferenceCombine(s, []int{2, 2}, out, in)
	require.ErrorContains(t, err, "row 0 came from rank 1 token 3")
	out[0].RecvSrcRank[0] = 2
	_, err = ReferenceCombine(s, []int{2, 2}, out, in)
	require.ErrorContains(t, err, "from rank 2")
	_, err = ReferenceCombine(s, []int{2, 2}, []RankOutput{{}, {}}, []CombineInput{{Bias0: make([]uint16, 5)}, {}})
	require.ErrorContains(t, err, "bias 0 has 5 values")
}

// The references at DeepEP's shape (8 ranks x 4096 tokens, hidden 7168,
// top-8 of 256 experts, weights, 40 masked entries): what every GPU test
// round pays on the host. -intranode.benchtokens shrinks it for small
// machines (the full shape holds about 6 GB).
func BenchmarkReferenceDispatch(b *testing.B) {
	s, in := benchReferenceInputs(b)
	b.ResetTimer()
	for range b.N {
		if _, err := ReferenceDispatch(s, in, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReferenceCombine(b *testing.B) {
	s, tokens, out, comb := benchCombineInputs(b)
	b.ResetTimer()
	for range b.N {
		if _, err := ReferenceCombine(s, tokens, out, comb); err != nil {
			b.Fatal(err)
		}
	}
}

// benchCombineInputs is the dispatch of benchReferenceInputs and random
// finite BF16 rows to send back, with the received weights.
func benchCombineInputs(b *testing.B) (Shape, []int, []RankOutput, []CombineInput) {
	s, in := benchReferenceInputs(b)
	out, err := ReferenceDispatch(s, in, 0)
	require.NoError(b, err)
	tokens := make([]int, s.Ranks)
	comb := make([]CombineInput, s.Ranks)
	r := rand.New(rand.NewSource(3))
	for rank, o := range out {
		tokens[rank] = in[rank].Tokens(s)
		y := make([]uint16, len(o.RecvX))
		for i := range y {
			y[i] = uint16(r.Uint32())&0x8fff | 0x3000
		}
		comb[rank] = CombineInput{Y: y, Weights: o.RecvWeights}
	}
	return s, tokens, out, comb
}

var benchTokens = flag.Int("intranode.benchtokens", 4096, "tokens a rank in BenchmarkReference*")

func benchReferenceInputs(b *testing.B) (Shape, []RankInput) {
	s := Shape{Hidden: 7168, TopK: 8, Experts: 256, Ranks: 8}
	r := rand.New(rand.NewSource(5))
	in := make([]RankInput, s.Ranks)
	for rank := range in {
		n := *benchTokens
		x := make([]uint16, n*s.Hidden)
		for i := range x {
			x[i] = uint16(r.Uint32())
		}
		w := make([]float32, n*s.TopK)
		for i := range w {
			w[i] = r.Float32()
		}
		ids := randomRouting(r, n, s, 0)
		for range 40 {
			ids[r.Intn(len(ids))] = -1
		}
		in[rank] = RankInput{X: x, TopK: ids, Weights: w}
	}
	return s, in
}

// The plain loops at the same shape: the single-core baseline the split
// references are measured against.
func BenchmarkPlainDispatch(b *testing.B) {
	s, in := benchReferenceInputs(b)
	b.ResetTimer()
	for range b.N {
		if _, err := plainDispatch(s, in, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainCombine(b *testing.B) {
	s, tokens, out, comb := benchCombineInputs(b)
	b.ResetTimer()
	for range b.N {
		if _, err := plainCombine(s, tokens, out, comb); err != nil {
			b.Fatal(err)
		}
	}
}
