package intranode

import (
	"fmt"
	"math"

	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/internal/parallel"
	"github.com/goep-dev/goep/kernels"
)

// The plain-Go semantics of intranode dispatch and combine, written as loops
// over whole arrays with no notion of channels, rings or SMs. GPU results
// and the host backend are checked against it.
//
// GPU-sized checks (8 ranks x 4096 tokens of hidden 7168) move gigabytes
// here, so the loops are split over cores, but only across outputs that
// no two goroutines share: every output element is computed by the same
// operations in the same order as the single loops (kept in
// reference_plain_test.go, which the split versions must equal bit for bit).
// Nothing here calls a kernel or its twin.
//
// Layout conventions (DeepEP's): rank r owns experts [r*E/R, (r+1)*E/R). A
// token goes to rank r once if any of its top-k experts lives there. A rank
// receives tokens ordered by source rank, then by token index at the source.

// Shape is what all ranks agree on.
type Shape struct {
	Hidden  int
	TopK    int
	Experts int
	Ranks   int
}

// Validate checks the invariants every kernel relies on.
func (s Shape) Validate() error {
	switch {
	case s.Ranks < 1:
		return fmt.Errorf("intranode: %d ranks", s.Ranks)
	case s.Experts < 1 || s.Experts%s.Ranks != 0:
		return fmt.Errorf("intranode: %d experts do not divide evenly over %d ranks", s.Experts, s.Ranks)
	case s.TopK < 1:
		return fmt.Errorf("intranode: top-k %d", s.TopK)
	case s.Hidden < 1 || s.Hidden > MaxHidden:
		return fmt.Errorf("intranode: hidden %d: want 1..%d", s.Hidden, MaxHidden)
	case s.TopK > MaxTopK:
		return fmt.Errorf("intranode: top-k %d: at most %d", s.TopK, MaxTopK)
	case s.Experts > MaxExperts*MaxRanks:
		return fmt.Errorf("intranode: %d experts: at most %d", s.Experts, MaxExperts*MaxRanks)
	}
	return nil
}

// LocalExperts is the number of experts on each rank.
func (s Shape) LocalExperts() int {
	if s.Ranks <= 0 {
		return 0
	}
	return s.Experts / s.Ranks
}

// RankInput is one rank's dispatch input for T tokens. X holds BF16 bits
// [T*Hidden]; for FP8 dispatch XFP8 [T*Hidden] and Scales [T*Hidden/128]
// replace it. Weights [T*TopK] are optional.
type RankInput struct {
	X       []uint16
	XFP8    []uint8
	Scales  []float32
	TopK    []int64
	Weights []float32
}

// Tokens is the number of tokens of this input.
func (in RankInput) Tokens(s Shape) int {
	if s.TopK <= 0 {
		return 0
	}
	return len(in.TopK) / s.TopK
}

// RankOutput is what one rank receives.
type RankOutput struct {
	RecvX      []uint16  // [N*Hidden] (BF16 dispatch)
	RecvXFP8   []uint8   // [N*Hidden] (FP8 dispatch)
	RecvScales []float32 // [N*Hidden/128] (FP8 dispatch)
	// RecvTopK holds local expert ids (global id - rank*LocalExperts) and -1
	// for experts on other ranks; RecvWeights is 0 there.
	RecvTopK    []int64
	RecvWeights []float32
	// RecvSrcRank and RecvSrcToken say where each received token came from.
	RecvSrcRank  []int32
	RecvSrcToken []int32
	// RankPrefix[i] = tokens received from sources 0..i (inclusive).
	RankPrefix []int32
	// TokensPerLocalExpert counts received (token, local expert) pairs, each
	// rounded up to the expert alignment.
	TokensPerLocalExpert []int
}

// Received is the number of tokens this rank received.
func (o RankOutput) Received() int { return len(o.RecvSrcRank) }

// ReferenceDispatch computes every rank's dispatch output. alignment <= 1
// means no rounding of per-expert counts.
func ReferenceDispatch(s Shape, in []RankInput, alignment int) ([]RankOutput, error) {
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
	R := s.Ranks
	// Two passes: count what each (destination, source) pair carries, then
	// fill exact-size outputs. Each pair writes its own disjoint range of
	// its destination's arrays, so the pairs run on all cores; the bytes
	// are those of the plain loop (rows ordered by source, then token).
	rows := make([]int, R*R)      // [dst*R+src]: tokens src sends dst
	perPair := make([][]int, R*R) // [dst*R+src]: (token, local expert) pairs by expert
	parallel.For(R, func(src int) {
		x := in[src]
		for t := 0; t < x.Tokens(s); t++ {
			row := x.TopK[t*s.TopK : (t+1)*s.TopK]
			for dst := 0; dst < R; dst++ {
				if hitsRank(row, dst, le) {
					rows[dst*R+src]++
				}
			}
		}
	})
	out := make([]RankOutput, R)
	rowStart := make([]int, R*R) // first output row of each pair
	wStart := make([]int, R*R)   // first output row of weights (sources with weights only)
	h := s.Hidden
	// Each destination's arrays are made on its own goroutine: zeroing
	// gigabytes on one core was a good part of the time.
	parallel.For(R, func(dst int) {
		o := &out[dst]
		o.RankPrefix = make([]int32, R)
		n, nw := 0, 0
		for src := range in {
			rowStart[dst*R+src], wStart[dst*R+src] = n, nw
			n += rows[dst*R+src]
			if in[src].Weights != nil {
				nw += rows[dst*R+src]
			}
			o.RankPrefix[src] = int32(n)
		}
		// Nil, not empty, for nothing received: what appending to nil gave.
		o.RecvSrcRank = makeOrNil[int32](n)
		o.RecvSrcToken = makeOrNil[int32](n)
		o.RecvTopK = makeOrNil[int64](n * s.TopK)
		o.RecvWeights = makeOrNil[float32](nw * s.TopK)
		if fp8 {
			o.RecvXFP8 = makeOrNil[uint8](n * h)
			o.RecvScales = makeOrNil[float32](n * h / 128)
		} else {
			o.RecvX = makeOrNil[uint16](n * h)
		}
	})
	parallel.For(R*R, func(p int) {
		dst, src := p/R, p%R
		o, x := &out[dst], in[src]
		perExpert := make([]int, le)
		i, iw := rowStart[p], wStart[p]
		for t := 0; t < x.Tokens(s); t++ {
			row := x.TopK[t*s.TopK : (t+1)*s.TopK]
			if !hitsRank(row, dst, le) {
				continue
			}
			o.RecvSrcRank[i] = int32(src)
			o.RecvSrcToken[i] = int32(t)
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
				o.RecvTopK[i*s.TopK+k] = local
				if x.Weights != nil {
					o.RecvWeights[iw*s.TopK+k] = w
				}
			}
			if fp8 {
				copy(o.RecvXFP8[i*h:(i+1)*h], x.XFP8[t*h:(t+1)*h])
				copy(o.RecvScales[i*h/128:(i+1)*h/128], x.Scales[t*h/128:(t+1)*h/128])
			} else {
				copy(o.RecvX[i*h:(i+1)*h], x.X[t*h:(t+1)*h])
			}
			i++
			if x.Weights != nil {
				iw++
			}
		}
		perPair[p] = perExpert
	})
	for dst := range out {
		perExpert := make([]int, le)
		for src := 0; src < R; src++ {
			for e, n := range perPair[dst*R+src] {
				perExpert[e] += n
			}
		}
		for e, n := range perExpert {
			if alignment > 1 {
				n = (n + alignment - 1) / alignment * alignment
			}
			perExpert[e] = n
		}
		out[dst].TokensPerLocalExpert = perExpert
	}
	return out, nil
}

func makeOrNil[T any](n int) []T {
	if n == 0 {
		return nil
	}
	return make([]T, n)
}

func hitsRank(row []int64, rank, localExperts int) bool {
	for _, e := range row {
		if e >= 0 && int(e)/localExperts == rank {
			return true
		}
	}
	return false
}

func checkInput(s Shape, r int, x RankInput, fp8 bool) error {
	if len(x.TopK)%s.TopK != 0 {
		return fmt.Errorf("intranode: rank %d: top-k ids have %d entries, not a multiple of top-k %d", r, len(x.TopK), s.TopK)
	}
	t := x.Tokens(s)
	if _, ok := checked.Mul(t, 2*s.Hidden); !ok {
		return fmt.Errorf("intranode: rank %d: %d tokens of hidden %d overflow a byte count", r, t, s.Hidden)
	}
	for i, e := range x.TopK {
		if e < -1 || e >= int64(s.Experts) {
			return fmt.Errorf("intranode: rank %d: token %d slot %d: expert id %d outside [-1, %d)", r, i/s.TopK, i%s.TopK, e, s.Experts)
		}
	}
	if x.Weights != nil && len(x.Weights) != len(x.TopK) {
		return fmt.Errorf("intranode: rank %d: %d weights for %d top-k entries", r, len(x.Weights), len(x.TopK))
	}
	if fp8 {
		if s.Hidden%128 != 0 {
			return fmt.Errorf("intranode: FP8 needs hidden %% 128 == 0, got %d", s.Hidden)
		}
		if len(x.XFP8) != t*s.Hidden || len(x.Scales) != t*s.Hidden/128 {
			return fmt.Errorf("intranode: rank %d: FP8 input of %d bytes and %d scales for %d tokens", r, len(x.XFP8), len(x.Scales), t)
		}
		return nil
	}
	if len(x.X) != t*s.Hidden {
		return fmt.Errorf("intranode: rank %d: %d BF16 values for %d tokens of hidden %d", r, len(x.X), t, s.Hidden)
	}
	return nil
}

// CombineInput is one rank's combine input: Y [N*Hidden] BF16 bits, one row
// per token that rank received in dispatch (same order); optional Weights
// [N*TopK]; optional biases [T*Hidden] BF16 for the owner's tokens.
type CombineInput struct {
	Y       []uint16
	Weights []float32
	Bias0   []uint16
	Bias1   []uint16
}

// CombineOutput is one rank's combined result for its own T tokens.
type CombineOutput struct {
	X       []uint16  // [T*Hidden] BF16: sum over ranks in fp32, plus biases
	Weights []float32 // [T*TopK]: sum of the ranks' weights (nil if none given)
}

// ReferenceCombine sends each received row back to its owner and sums the
// rows of one token in fp32, then casts to BF16. tokens[r] is rank r's token
// count; dispatched gives the layout (the handle).
func ReferenceCombine(s Shape, tokens []int, dispatched []RankOutput, in []CombineInput) ([]CombineOutput, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if len(dispatched) != s.Ranks || len(in) != s.Ranks || len(tokens) != s.Ranks {
		return nil, fmt.Errorf("intranode: combine needs %d ranks of layout, input and token counts", s.Ranks)
	}
	h := s.Hidden
	out := make([]CombineOutput, s.Ranks)
	withWeights := in[0].Weights != nil
	first := make([]int, s.Ranks+1) // first[r]: global index of rank r's token 0
	for r := range out {
		// Sizes from the caller are checked before any make: a count times
		// hidden that overflows (or is negative) is an error, not a panic.
		n, ok := checked.Mul(tokens[r], h)
		if !ok || tokens[r] > math.MaxInt/max(s.TopK, 1) {
			return nil, fmt.Errorf("intranode: rank %d: %d tokens of hidden %d: negative or too large", r, tokens[r], h)
		}
		if first[r] > math.MaxInt-tokens[r]-1 {
			return nil, fmt.Errorf("intranode: rank %d: %d tokens: the total over all ranks overflows", r, tokens[r])
		}
		first[r+1] = first[r] + tokens[r]
		for j, b := range [][]uint16{in[r].Bias0, in[r].Bias1} {
			if b != nil && len(b) < n {
				return nil, fmt.Errorf("intranode: rank %d: bias %d has %d values for %d tokens of hidden %d", r, j, len(b), tokens[r], h)
			}
		}
		if withWeights {
			out[r].Weights = make([]float32, tokens[r]*s.TopK)
		}
	}
	// Which received rows come back to each token, in the order the plain
	// loop (over receiving ranks, then their rows) adds them: a CSR index
	// over all ranks' tokens, rows ordered by (receiving rank, row).
	count := make([]int, first[s.Ranks]+1)
	for r, d := range dispatched {
		n := d.Received()
		if len(in[r].Y) != n*h {
			return nil, fmt.Errorf("intranode: rank %d: combine input has %d values for %d received tokens of hidden %d", r, len(in[r].Y), n, h)
		}
		if withWeights && len(in[r].Weights) != n*s.TopK {
			return nil, fmt.Errorf("intranode: rank %d: %d combine weights for %d tokens of top-k %d", r, len(in[r].Weights), n, s.TopK)
		}
		if len(d.RecvSrcToken) != n {
			return nil, fmt.Errorf("intranode: rank %d: %d source tokens for %d received rows", r, len(d.RecvSrcToken), n)
		}
		for i := 0; i < n; i++ {
			src, t := int(d.RecvSrcRank[i]), int(d.RecvSrcToken[i])
			if src < 0 || src >= s.Ranks || t < 0 || t >= tokens[src] {
				return nil, fmt.Errorf("intranode: rank %d: row %d came from rank %d token %d, outside the layout", r, i, src, t)
			}
			count[first[src]+t+1]++
		}
	}
	for g := 1; g < len(count); g++ {
		count[g] += count[g-1]
	}
	fromRank := make([]int, count[len(count)-1]) // [count[g], count[g+1]): token g's rows
	fromRow := make([]int, len(fromRank))
	fill := append([]int(nil), count[:len(count)-1]...)
	for r, d := range dispatched {
		for i := 0; i < d.Received(); i++ {
			g := first[d.RecvSrcRank[i]] + int(d.RecvSrcToken[i])
			fromRank[fill[g]], fromRow[fill[g]] = r, i
			fill[g]++
		}
	}
	parallel.For(s.Ranks, func(r int) { out[r].X = make([]uint16, tokens[r]*h) }) // zeroing on all cores
	// Every token is an independent output: blocks of tokens run on all
	// cores, each element summed in fp32 in the order above, then the
	// biases, then the cast.
	const block = 64
	blocks := (first[s.Ranks] + block - 1) / block
	parallel.For(blocks, func(b int) {
		acc := make([]float32, h)
		for g := b * block; g < min((b+1)*block, first[s.Ranks]); g++ {
			owner := 0
			for first[owner+1] <= g {
				owner++
			}
			t := g - first[owner]
			clear(acc)
			for c := count[g]; c < count[g+1]; c++ {
				r, i := fromRank[c], fromRow[c]
				y := in[r].Y[i*h : (i+1)*h]
				acc := acc[:len(y)] // one length: no bounds check per element
				for j, v := range y {
					acc[j] += kernels.BF16ToFloat32(v)
				}
				if withWeights {
					ws := out[owner].Weights[t*s.TopK : (t+1)*s.TopK]
					for k, w := range in[r].Weights[i*s.TopK : (i+1)*s.TopK] {
						ws[k] += w
					}
				}
			}
			x := out[owner].X[t*h : (t+1)*h]
			b0, b1 := in[owner].Bias0, in[owner].Bias1
			for j, v := range acc {
				if b0 != nil {
					v += kernels.BF16ToFloat32(b0[t*h+j])
				}
				if b1 != nil {
					v += kernels.BF16ToFloat32(b1[t*h+j])
				}
				x[j] = kernels.Float32ToBF16(v)
			}
		}
	})
	return out, nil
}
