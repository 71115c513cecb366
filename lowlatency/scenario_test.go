package lowlatency_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/lowlatency"
)

// llCase is one scenario run on some backend and checked against the
// reference: iterations of one or two micro-batches (sets 0 and 1), each
// a dispatch and a combine, fused or split into send and receive steps
// (both micro-batches' sends before either receive).
type llCase struct {
	name              string
	nodes             int // 0 or 1: one node; else nodes of ranks/nodes (newNodeGroup)
	ranks, maxTokens  int
	hidden, topk, le  int
	tokens            []int // per rank (each iteration); nil: random in 0..maxTokens
	format            lowlatency.Format
	rankMajor         bool
	weights, ids32    bool
	fp8Combine        bool
	split             bool
	microBatches      int      // 1 or 2
	iters             int      // >= 1
	masks             []uint32 // per iteration (cycled); nil: none
	minus1, bad, dups int      // percent of ids that are -1, out of range, repeated
	hot, cold         int      // an expert every token picks / no token picks (-1: none)
	cfg               lowlatency.LaunchConfig
	general           bool // the general kernels even where a specialised one applies (emulated runs)
}

func (c llCase) config() lowlatency.Config {
	return lowlatency.Config{Ranks: c.ranks, MaxTokens: c.maxTokens, Hidden: c.hidden, TopK: c.topk, LocalExperts: c.le,
		FP8: c.format.Quantized() || c.fp8Combine, Nodes: c.nodes}
}

func randBF16(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	for i := range x {
		x[i] = kernels.Float32ToBF16(float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(12)-6)))
		if rng.IntN(50) == 0 {
			x[i] = 0
		}
	}
	return x
}

// genInput draws one rank's tokens, ids and weights.
func (c llCase) genInput(rng *rand.Rand, t int) lowlatency.RankInput {
	e := c.ranks * c.le
	in := lowlatency.RankInput{X: randBF16(rng, t*c.hidden), TopK: make([]int64, t*c.topk)}
	for tok := 0; tok < t; tok++ {
		row := in.TopK[tok*c.topk : (tok+1)*c.topk]
		for j := range row {
			for {
				row[j] = int64(rng.IntN(e))
				if int(row[j]) != c.cold || e == 1 {
					break
				}
			}
			switch p := rng.IntN(100); {
			case p < c.minus1:
				row[j] = -1
			case p < c.minus1+c.bad:
				row[j] = []int64{int64(e), int64(e) + 7, -3}[rng.IntN(3)]
			case p < c.minus1+c.bad+c.dups && j > 0:
				row[j] = row[j-1]
			}
		}
		if c.hot >= 0 {
			row[rng.IntN(c.topk)] = int64(c.hot)
		}
	}
	if c.weights {
		in.Weights = make([]float32, t*c.topk)
		for i := range in.Weights {
			in.Weights[i] = float32(rng.NormFloat64())
		}
	}
	return in
}

type mbData struct {
	ins                  []lowlatency.RankInput
	x, ids, w, out, y, s []uintptr
	tokens               []int
	recv                 []lowlatency.RankRecv
	cins                 []lowlatency.CombineInput
}

func runCase(t *testing.T, g *group, c llCase) {
	lc := c.config()
	opt := func(it int) lowlatency.Options {
		o := lowlatency.Options{Format: c.format}
		if len(c.masks) > 0 {
			o.Masked = c.masks[it%len(c.masks)]
		}
		return o
	}
	nb := max(1, c.microBatches)
	slots := lc.Slots()
	h := c.hidden
	for it := 0; it < max(1, c.iters); it++ {
		o := opt(it)
		mbs := make([]*mbData, nb)
		for b := range mbs {
			m := &mbData{ins: make([]lowlatency.RankInput, c.ranks), tokens: make([]int, c.ranks)}
			for _, p := range []*[]uintptr{&m.x, &m.ids, &m.w, &m.out, &m.y, &m.s} {
				*p = make([]uintptr, c.ranks)
			}
			for i, r := range g.ranks {
				rng := rand.New(rand.NewPCG(uint64(it*16+b), uint64(i)+1000*uint64(len(c.name))))
				tk := rng.IntN(c.maxTokens + 1)
				if c.tokens != nil {
					tk = c.tokens[i]
				}
				m.tokens[i] = tk
				m.ins[i] = c.genInput(rng, tk)
				m.x[i] = r.upload(t, bytesOf(m.ins[i].X))
				if c.ids32 {
					ids := make([]int32, len(m.ins[i].TopK))
					for j, v := range m.ins[i].TopK {
						ids[j] = int32(v)
					}
					m.ids[i] = r.upload(t, bytesOf(ids))
				} else {
					m.ids[i] = r.upload(t, bytesOf(m.ins[i].TopK))
				}
				if c.weights {
					m.w[i] = r.upload(t, bytesOf(m.ins[i].Weights))
				}
				m.out[i] = r.upload(t, make([]byte, 2*tk*h))
				require.NoError(t, r.dev.MemsetAsync(m.out[i], 0xEE, max(2*tk*h, 1), nil))
			}
			mbs[b] = m
		}
		// Dispatch: the steps in lockstep across ranks (group.steps says
		// why); split: both micro-batches' sends, then their receives.
		var disp []func(i int, r *rank) error
		if len(c.masks) > 0 {
			disp = append(disp, func(i int, r *rank) error {
				return r.ws.SetMask(r.dev, r.stream, lowlatency.MaskSet, o.Masked)
			})
		}
		for _, p := range phasesOf(c.split) {
			for b := range mbs {
				disp = append(disp, func(i int, r *rank) error {
					m := mbs[b]
					a := lowlatency.DispatchArgs{Set: b, X: m.x[i], TopK: m.ids[i], IDs64: !c.ids32, Weights: m.w[i],
						Tokens: m.tokens[i], Format: c.format, RankMajor: c.rankMajor, Phase: p}
					return r.ws.Dispatch(r.dev, r.stream, a, c.cfg)
				})
			}
		}
		g.steps(t, disp...)
		for b, m := range mbs {
			var err error
			m.recv, err = lowlatency.ReferenceDispatch(lc, m.ins, o)
			require.NoError(t, err)
			// Every rank counts its own ids outside [-1, E), masked or not.
			for i, n := range lowlatency.ReferenceInvalidIDs(lc, m.ins) {
				require.Equal(t, []uint32{uint32(n)}, down[uint32](t, g.ranks[i], g.ranks[i].ws.InvalidPtr(b), 1),
					"iter %d mb %d rank %d invalid ids", it, b, i)
			}
			for d, r := range g.ranks {
				checkRecv(t, c, r, b, m.recv[d], fmt.Sprintf("iter %d mb %d rank %d", it, b, d))
			}
		}
		// Combine inputs: in the zero-copy buffer on even iterations,
		// elsewhere on odd ones.
		for b, m := range mbs {
			m.cins = make([]lowlatency.CombineInput, c.ranks)
			for d, r := range g.ranks {
				rng := rand.New(rand.NewPCG(uint64(it*16+b)+77, uint64(d)))
				rv := m.recv[d]
				ci := &m.cins[d]
				var ybytes, sbytes []byte
				if c.rankMajor {
					ci.RankMajor = make([][][]uint16, c.ranks)
					yb := make([]uint16, c.ranks*c.maxTokens*h)
					for s := range rv.Rows {
						ci.RankMajor[s] = make([][]uint16, len(rv.Rows[s]))
						for tok := range rv.Rows[s] {
							y := randBF16(rng, h)
							ci.RankMajor[s][tok] = y
							copy(yb[(s*c.maxTokens+tok)*h:], y)
						}
					}
					ybytes = bytesOf(yb)
				} else if c.fp8Combine {
					ci.Y8 = make([][][]uint8, c.le)
					ci.Scales = make([][][]float32, c.le)
					yb := make([]uint8, c.le*slots*h)
					sb := make([]float32, c.le*slots*h/128)
					for l, rows := range rv.Experts {
						for p := range rows {
							q := make([]uint8, h)
							sc := make([]float32, h/128)
							for x := range q {
								q[x] = uint8(rng.Uint32())&^0x7f | uint8(rng.IntN(0x7e)) // no NaN
							}
							for x := range sc {
								sc[x] = rng.Float32()
							}
							ci.Y8[l] = append(ci.Y8[l], q)
							ci.Scales[l] = append(ci.Scales[l], sc)
							copy(yb[(l*slots+p)*h:], q)
							copy(sb[(l*slots+p)*h/128:], sc)
						}
					}
					ybytes, sbytes = yb, bytesOf(sb)
				} else {
					ci.Y = make([][][]uint16, c.le)
					yb := make([]uint16, c.le*slots*h)
					for l, rows := range rv.Experts {
						for p := range rows {
							y := randBF16(rng, h)
							ci.Y[l] = append(ci.Y[l], y)
							copy(yb[(l*slots+p)*h:], y)
						}
					}
					ybytes = bytesOf(yb)
				}
				if it%2 == 0 {
					cb := r.ws.CombineBuffer(b)
					m.y[d], m.s[d] = cb.X, cb.S
					require.NoError(t, r.dev.CopyIn(m.y[d], ybytes))
					if sbytes != nil {
						require.NoError(t, r.dev.CopyIn(m.s[d], sbytes))
					}
				} else {
					m.y[d] = r.upload(t, ybytes)
					if sbytes != nil {
						m.s[d] = r.upload(t, sbytes)
					}
				}
			}
		}
		var comb []func(i int, r *rank) error
		for _, p := range phasesOf(c.split) {
			for b, m := range mbs {
				comb = append(comb, func(i int, r *rank) error {
					a := lowlatency.CombineArgs{Set: b, Tokens: m.tokens[i], Y: m.y[i], YScales: m.s[i], YFP8: c.fp8Combine,
						Out: m.out[i], RankMajor: c.rankMajor, Phase: p}
					return r.ws.Combine(r.dev, r.stream, a, c.cfg)
				})
			}
		}
		g.steps(t, comb...)
		for b, m := range mbs {
			want, err := lowlatency.ReferenceCombine(lc, m.ins, m.recv, m.cins, c.rankMajor, o)
			require.NoError(t, err)
			for s, r := range g.ranks {
				sameSlice(t, want[s], down[uint16](t, r, m.out[s], m.tokens[s]*h), "iter %d mb %d rank %d combine", it, b, s)
			}
		}
	}
}

// phasesOf is the steps of one call: fused, or send then receive.
func phasesOf(split bool) []lowlatency.Phase {
	if split {
		return []lowlatency.Phase{lowlatency.Send, lowlatency.Recv}
	}
	return []lowlatency.Phase{lowlatency.Both}
}

// checkRecv compares rank r's outputs of set b with the reference.
func checkRecv(t *testing.T, c llCase, r *rank, b int, want lowlatency.RankRecv, what string) {
	t.Helper()
	lc := c.config()
	h, k, slots := c.hidden, c.topk, lc.Slots()
	if c.rankMajor {
		v := r.ws.RankMajor(b)
		ntok := down[int32](t, r, v.Tokens, c.ranks)
		ids := down[int32](t, r, v.IDs, c.ranks*c.maxTokens*k)
		ws := down[float32](t, r, v.Weights, c.ranks*c.maxTokens*k)
		for s := 0; s < c.ranks; s++ {
			require.Equal(t, int32(len(want.Sources[s])), ntok[s], "%s: tokens of source %d", what, s)
			for tok, sent := range want.Sources[s] {
				q := (s*c.maxTokens + tok) * k
				sameSlice(t, want.LocalIDs[s][tok*k:(tok+1)*k], ids[q:q+k], "%s: ids (%d, %d)", what, s, tok)
				sameSlice(t, want.Weights[s][tok*k:(tok+1)*k], ws[q:q+k], "%s: weights (%d, %d)", what, s, tok)
				if !sent {
					continue
				}
				row := want.Rows[s][tok]
				at := v.X + uintptr((s*c.maxTokens+tok)*2*h)
				if c.format.Quantized() {
					sameSlice(t, row.X8, down[uint8](t, r, at, h), "%s: fp8 row (%d, %d)", what, s, tok)
					sameSlice(t, row.Scales, down[float32](t, r, v.Scales+uintptr(4*(s*c.maxTokens+tok)*h/128), h/128),
						"%s: scales (%d, %d)", what, s, tok)
				} else {
					sameSlice(t, row.X, down[uint16](t, r, at, h), "%s: row (%d, %d)", what, s, tok)
				}
			}
		}
		return
	}
	v := r.ws.Recv(b)
	sameSlice(t, want.Count(), down[int32](t, r, v.Count, c.le), "%s: counts", what)
	rng := down[uint64](t, r, v.LayoutRange, c.le*c.ranks)
	for l, rows := range want.Experts {
		for s := 0; s < c.ranks; s++ {
			got := rng[l*c.ranks+s]
			require.Equal(t, want.Range[l][s], [2]int{int(uint32(got)), int(got >> 32)}, "%s: range (%d, %d)", what, l, s)
		}
		if len(rows) == 0 {
			continue
		}
		src := down[int32](t, r, v.SrcInfo+uintptr(4*l*slots), len(rows))
		for p, row := range rows {
			require.Equal(t, int32(row.Token), src[p], "%s: src info (%d, %d)", what, l, p)
			i := l*slots + p
			switch c.format {
			case lowlatency.BF16:
				sameSlice(t, row.X, down[uint16](t, r, v.X+uintptr(2*i*h), h), "%s: row (%d, %d)", what, l, p)
			case lowlatency.FP8:
				sameSlice(t, row.X8, down[uint8](t, r, v.X+uintptr(i*h), h), "%s: fp8 row (%d, %d)", what, l, p)
				sameSlice(t, f32bits(row.Scales), f32bits(down[float32](t, r, v.Scales+uintptr(4*i*h/128), h/128)),
					"%s: scales (%d, %d)", what, l, p)
			case lowlatency.UE8M0:
				nw := lc.PackedScalesPerRow()
				sameSlice(t, row.X8, down[uint8](t, r, v.X+uintptr(i*h), h), "%s: fp8 row (%d, %d)", what, l, p)
				sameSlice(t, lowlatency.PackExps(row.Exps), down[uint32](t, r, v.Scales+uintptr(4*i*nw), nw),
					"%s: ue8m0 scales (%d, %d)", what, l, p)
			}
		}
	}
}

func f32bits(v []float32) []uint32 {
	o := make([]uint32, len(v))
	for i, x := range v {
		o[i] = math.Float32bits(x)
	}
	return o
}

func newRNG(a, b uint64) *rand.Rand { return rand.New(rand.NewPCG(a, b)) }
