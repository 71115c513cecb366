package lowlatency

import (
	"fmt"
	"math"

	"github.com/goep-dev/goep/kernels"
)

// The plain-Go semantics of the low-latency kernels, written from the
// definitions below and nothing else (no protocol, no layout of the
// workspace), so that tests can hold the kernels and their twins to them.
//
// Dispatch. Token t of rank s with top-k ids ids[t][j] goes to rank d when
// some id lies in d's experts [d*LE, (d+1)*LE) and neither s nor d is
// masked; ids outside [0, E) are ignored, and those outside [-1, E) are
// counted at their source rank, masked or not (ReferenceInvalidIDs: the
// input is wrong whatever the mask). At rank d, the rows of local
// expert le are ordered by source rank, then token, then top-k slot (an id
// listed twice gives two rows), from row 0 on; Count[le] is their number.
// Rank-major: row (s, t) holds token t of source s when it was sent.
//
// FP8 cast of a row, per group of 128 elements (float32 arithmetic, each
// operation rounded to nearest even, no fused multiply-add):
//
//	amax = max |x| (NaN ignored), at least 1e-4
//	FP8:   scale = amax / 448,  inv = 448 / amax
//	UE8M0: s = amax / 448 rounded up to a power of two 2^(e-127)
//	       (e the biased exponent, stored as the scale byte), inv = 2^(127-e)
//	       (0 when e >= 254)
//	q = fp8_e4m3(x * inv)   (saturating, kernels.Float32ToFP8E4M3)
//
// Combine. Expert rank d returns, for each token (s, t) it received,
// partial = bf16(sum over its top-k slots j on d, ascending, of
// w[j] * y[row of (s, t, j)]) (acc = 0; acc = acc + w*y, each rounded), with
// w = 1 when dispatch had no weights, y dequantized as fp8 * scale when the
// combine input is FP8; rank-major, partial = y[s][t] as given. Owner s
// computes out[t] = bf16(sum over d ascending in its destinations, not
// masked, of partial_d[t]) (0 when none).

// RankInput is one rank's dispatch input.
type RankInput struct {
	X       []uint16  // BF16 [T][Hidden]
	TopK    []int64   // [T][TopK], -1 = none
	Weights []float32 // [T][TopK], nil = weights of 1
}

// Tokens is T.
func (in RankInput) Tokens(topk int) int {
	if topk <= 0 {
		return 0
	}
	return len(in.TopK) / topk
}

// RecvRow is one received row.
type RecvRow struct {
	Src, Token, Slot int
	X                []uint16  // BF16 row (format BF16)
	X8               []uint8   // FP8 row (FP8, UE8M0)
	Scales           []float32 // FP8: Hidden/128 scales; UE8M0: the same scales (powers of two)
	Exps             []uint8   // UE8M0: the biased exponents of Scales
	Weight           float32
}

// RankRecv is what one rank receives.
type RankRecv struct {
	// Experts[le] are local expert le's rows in order.
	Experts [][]RecvRow
	// Range[le][s] = {begin, count} of source s's rows of expert le.
	Range [][][2]int
	// Sources[s][t] says whether token t of source s came here (len T_s;
	// empty for a masked source); LocalIDs[s][t*K+j] is its local expert id
	// at this rank or -1, Weights likewise (0 where -1).
	Sources  [][]bool
	LocalIDs [][]int32
	Weights  [][]float32
	// Rows[s][t] is the row as sent (rank-major view), nil when not sent.
	Rows [][]RecvRow
}

// Count is the row count of each local expert.
func (r RankRecv) Count() []int32 {
	c := make([]int32, len(r.Experts))
	for i, e := range r.Experts {
		c[i] = int32(len(e))
	}
	return c
}

// Options of a reference call.
type Options struct {
	Format Format
	// Masked has bit r set for every masked rank (seen alike by every rank).
	Masked uint32
}

func (o Options) masked(r int) bool { return o.Masked>>uint(r)&1 != 0 }

// QuantizeRow casts a BF16 row to FP8 in format f (FP8 or UE8M0): the
// bytes, one scale per 128 elements, and (UE8M0) the scale exponents.
func QuantizeRow(x []uint16, f Format) (q []uint8, scales []float32, exps []uint8) {
	groups := len(x) / FP8Block
	q = make([]uint8, len(x))
	scales = make([]float32, groups)
	if f == UE8M0 {
		exps = make([]uint8, groups)
	}
	for g := 0; g < groups; g++ {
		xs := x[g*FP8Block : (g+1)*FP8Block]
		amax := float32(0)
		for _, v := range xs {
			a := float32(math.Abs(float64(kernels.BF16ToFloat32(v))))
			if a > amax {
				amax = a
			}
		}
		if amax < 1e-4 {
			amax = 1e-4
		}
		scale := amax / 448
		inv := 448 / amax
		if f == UE8M0 {
			u := math.Float32bits(scale)
			if u&0x7fffff != 0 {
				u = u&0x7f800000 + 0x800000
			}
			e := u >> 23
			scale = math.Float32frombits(u)
			inv = 0
			if e < 254 {
				inv = math.Float32frombits((254 - e) << 23)
			}
			exps[g] = uint8(e)
		}
		scales[g] = scale
		for i, v := range xs {
			q[g*FP8Block+i] = kernels.Float32ToFP8E4M3(kernels.BF16ToFloat32(v) * inv)
		}
	}
	return q, scales, exps
}

// PackExps packs UE8M0 exponents four a word (byte i%4 of word i/4), the
// layout of RecvS in UE8M0 format.
func PackExps(exps []uint8) []uint32 {
	w := make([]uint32, (len(exps)+3)/4)
	for i, e := range exps {
		w[i/4] |= uint32(e) << (8 * uint(i%4))
	}
	return w
}

func (c Config) check(ins []RankInput, f Format) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if len(ins) != c.Ranks {
		return fmt.Errorf("lowlatency: reference: %d inputs for %d ranks", len(ins), c.Ranks)
	}
	if f.Quantized() && c.Hidden%FP8Block != 0 {
		return fmt.Errorf("lowlatency: reference: %v needs hidden %% 128 == 0", f)
	}
	for r, in := range ins {
		if len(in.TopK)%c.TopK != 0 {
			return fmt.Errorf("lowlatency: reference: rank %d: %d ids is not a multiple of top-k %d", r, len(in.TopK), c.TopK)
		}
		t := in.Tokens(c.TopK)
		if t > c.MaxTokens {
			return fmt.Errorf("lowlatency: reference: rank %d: %d tokens above the maximum %d", r, t, c.MaxTokens)
		}
		if len(in.X) != t*c.Hidden {
			return fmt.Errorf("lowlatency: reference: rank %d: x has %d elements, want %d", r, len(in.X), t*c.Hidden)
		}
		if in.Weights != nil && len(in.Weights) != len(in.TopK) {
			return fmt.Errorf("lowlatency: reference: rank %d: %d weights for %d ids", r, len(in.Weights), len(in.TopK))
		}
	}
	return nil
}

// ReferenceInvalidIDs is each rank's count of top-k ids outside [-1, E)
// (what the dispatch's receive step publishes for its set).
func ReferenceInvalidIDs(c Config, ins []RankInput) []int {
	e := int64(c.Experts())
	out := make([]int, len(ins))
	for r, in := range ins {
		for _, id := range in.TopK {
			if id < -1 || id >= e {
				out[r]++
			}
		}
	}
	return out
}

// ReferenceDispatch computes what every rank receives.
func ReferenceDispatch(c Config, ins []RankInput, o Options) ([]RankRecv, error) {
	if err := c.check(ins, o.Format); err != nil {
		return nil, err
	}
	le, k, h := c.LocalExperts, c.TopK, c.Hidden
	e := int64(c.Experts())
	rows := make([][]RecvRow, c.Ranks) // rows[s][t]: the row token t of s sends
	for s, in := range ins {
		t := in.Tokens(k)
		rows[s] = make([]RecvRow, t)
		for tok := 0; tok < t; tok++ {
			x := in.X[tok*h : (tok+1)*h]
			row := RecvRow{Src: s, Token: tok}
			if o.Format.Quantized() {
				row.X8, row.Scales, row.Exps = QuantizeRow(x, o.Format)
			} else {
				row.X = x
			}
			rows[s][tok] = row
		}
	}
	out := make([]RankRecv, c.Ranks)
	for d := range out {
		rv := RankRecv{Experts: make([][]RecvRow, le), Range: make([][][2]int, le), Sources: make([][]bool, c.Ranks),
			LocalIDs: make([][]int32, c.Ranks), Weights: make([][]float32, c.Ranks), Rows: make([][]RecvRow, c.Ranks)}
		for i := range rv.Range {
			rv.Range[i] = make([][2]int, c.Ranks)
			rv.Experts[i] = []RecvRow{}
		}
		lo := int64(d * le)
		for s, in := range ins {
			if o.masked(s) || o.masked(d) {
				continue
			}
			t := in.Tokens(k)
			rv.Sources[s] = make([]bool, t)
			rv.LocalIDs[s] = make([]int32, t*k)
			rv.Weights[s] = make([]float32, t*k)
			rv.Rows[s] = make([]RecvRow, t)
			for tok := 0; tok < t; tok++ {
				for j := 0; j < k; j++ {
					id := in.TopK[tok*k+j]
					rv.LocalIDs[s][tok*k+j] = -1
					if id >= lo && id < lo+int64(le) && id < e {
						rv.Sources[s][tok] = true
						rv.LocalIDs[s][tok*k+j] = int32(id - lo)
						rv.Weights[s][tok*k+j] = 1
						if in.Weights != nil {
							rv.Weights[s][tok*k+j] = in.Weights[tok*k+j]
						}
					}
				}
				if rv.Sources[s][tok] {
					rv.Rows[s][tok] = rows[s][tok]
				}
			}
		}
		for l := 0; l < le; l++ {
			for s := range ins {
				begin := len(rv.Experts[l])
				for tok, sent := range rv.Sources[s] {
					if !sent {
						continue
					}
					for j := 0; j < k; j++ {
						if rv.LocalIDs[s][tok*k+j] == int32(l) {
							row := rows[s][tok]
							row.Slot, row.Weight = j, rv.Weights[s][tok*k+j]
							rv.Experts[l] = append(rv.Experts[l], row)
						}
					}
				}
				rv.Range[l][s] = [2]int{begin, len(rv.Experts[l]) - begin}
			}
		}
		out[d] = rv
	}
	return out, nil
}

// CombineInput is one rank's combine input.
type CombineInput struct {
	// Y[le][i] is the expert output of row i of local expert le (BF16
	// [Hidden]), or, with Y8, FP8 bytes and Scales (Hidden/128).
	Y      [][][]uint16
	Y8     [][][]uint8
	Scales [][][]float32
	// RankMajor[s][t] is the row returned for token t of source s (BF16),
	// used instead of Y in rank-major combine.
	RankMajor [][][]uint16
}

// Explicit conversions keep Go from fusing a multiply and an add (the
// kernels round each operation).
func mulRN(a, b float32) float32 { return float32(a * b) }
func addRN(a, b float32) float32 { return float32(a + b) }

// ReferenceCombine computes every rank's combined output ([T][Hidden] BF16)
// from the dispatch result recv and each rank's combine input.
func ReferenceCombine(c Config, ins []RankInput, recv []RankRecv, ys []CombineInput, rankMajor bool, o Options) ([][]uint16, error) {
	if err := c.check(ins, BF16); err != nil {
		return nil, err
	}
	if len(recv) != c.Ranks || len(ys) != c.Ranks {
		return nil, fmt.Errorf("lowlatency: reference combine: %d results, %d inputs for %d ranks", len(recv), len(ys), c.Ranks)
	}
	h, k := c.Hidden, c.TopK
	// partial[d][s][t]
	partial := make([][][][]uint16, c.Ranks)
	for d, rv := range recv {
		partial[d] = make([][][]uint16, c.Ranks)
		// Row index of (s, t, j) in expert order.
		pos := map[[3]int]int{}
		for l, rows := range rv.Experts {
			for i, r := range rows {
				pos[[3]int{r.Src, r.Token, r.Slot}] = l<<32 | i
			}
		}
		for s, sent := range rv.Sources {
			partial[d][s] = make([][]uint16, len(sent))
			for tok, ok := range sent {
				if !ok {
					continue
				}
				if rankMajor {
					y := ys[d].RankMajor[s][tok]
					if len(y) != h {
						return nil, fmt.Errorf("lowlatency: reference combine: rank %d row (%d, %d) has %d elements", d, s, tok, len(y))
					}
					partial[d][s][tok] = y
					continue
				}
				acc := make([]float32, h)
				for j := 0; j < k; j++ {
					l := rv.LocalIDs[s][tok*k+j]
					if l < 0 {
						continue
					}
					p := pos[[3]int{s, tok, j}]
					le, i := p>>32, p&(1<<32-1)
					w := rv.Weights[s][tok*k+j]
					for x := 0; x < h; x++ {
						var y float32
						if ys[d].Y8 != nil {
							sc := ys[d].Scales[le][i][x/FP8Block]
							y = mulRN(kernels.FP8E4M3ToFloat32(ys[d].Y8[le][i][x]), sc)
						} else {
							y = kernels.BF16ToFloat32(ys[d].Y[le][i][x])
						}
						acc[x] = addRN(acc[x], mulRN(w, y))
					}
				}
				p := make([]uint16, h)
				for x, v := range acc {
					p[x] = kernels.Float32ToBF16(v)
				}
				partial[d][s][tok] = p
			}
		}
	}
	out := make([][]uint16, c.Ranks)
	for s, in := range ins {
		t := in.Tokens(k)
		out[s] = make([]uint16, t*h)
		for tok := 0; tok < t; tok++ {
			acc := make([]float32, h)
			for d := 0; d < c.Ranks; d++ {
				if o.masked(d) || o.masked(s) || len(partial[d][s]) <= tok || partial[d][s][tok] == nil {
					continue
				}
				for x, v := range partial[d][s][tok] {
					acc[x] = addRN(acc[x], kernels.BF16ToFloat32(v))
				}
			}
			for x, v := range acc {
				out[s][tok*h+x] = kernels.Float32ToBF16(v)
			}
		}
	}
	return out, nil
}
