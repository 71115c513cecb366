package intranode

import (
	"fmt"
	"math"

	"github.com/goep-dev/goep/internal/checked"
	"github.com/goep-dev/goep/kernels"
)

// The plain-Go semantics of intranode dispatch and combine, written as loops
// over whole arrays with no notion of channels, rings or SMs. GPU results
// and the host backend are checked against it.
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
