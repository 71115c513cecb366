package bench

import (
	"context"
	"math/rand/v2"
	"sync"
	"unsafe"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// inShared is every rank's input at one token count and the reference
// results, computed once per process (goroutine ranks share it; launched
// ranks each compute it from the same seed).
type inShared struct {
	tokens int
	shape  intranode.Shape
	in     []intranode.RankInput // BF16 rows with weights
	in8    []intranode.RankInput // the same routing with FP8 rows (--fp8)
	ref    []intranode.RankOutput
	ref8   []intranode.RankOutput
	comb   []intranode.CombineOutput // combine of the received rows with their weights
}

// inputCache holds the current token count's inputs.
type inputCache struct {
	o     inOpts
	ranks int
	mu    sync.Mutex
	cur   *inShared
	err   error
}

func (c *inputCache) get(ctx context.Context, tokens int) (*inShared, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.tokens == tokens {
		return c.cur, c.err
	}
	c.cur = nil // let the last one go first
	c.cur, c.err = prepareInputs(ctx, c.o, c.ranks, tokens)
	return c.cur, c.err
}

// prepareInputs draws every rank's routing (DeepEP's: top-k of |randn|+1),
// rows and weights from the seed, and computes the reference dispatch and
// combine (combine of the received rows, with their weights, as DeepEP's
// test checks it).
func prepareInputs(ctx context.Context, o inOpts, ranks, tokens int) (*inShared, error) {
	sh := &inShared{tokens: tokens, shape: intranode.Shape{Hidden: o.hidden, TopK: o.topk, Experts: o.experts, Ranks: ranks},
		in: make([]intranode.RankInput, ranks)}
	for r := range ranks {
		if err := interrupted(ctx); err != nil {
			return nil, err
		}
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: o.topk, Experts: o.experts, Ranks: ranks},
			routing.GenOptions{Seed: rankSeed(o.seed, r), Masked: o.masked})
		if err != nil {
			return nil, err
		}
		rng := rand.New(rand.NewPCG(o.seed, uint64(r)))
		sh.in[r] = intranode.RankInput{TopK: rt.Idx, X: randomBF16(rng, tokens*o.hidden), Weights: randomF32(rng, tokens*o.topk)}
	}
	var err error
	if sh.ref, err = intranode.ReferenceDispatch(sh.shape, sh.in, 0); err != nil {
		return nil, err
	}
	cins := make([]intranode.CombineInput, ranks)
	toks := make([]int, ranks)
	for r := range ranks {
		cins[r] = intranode.CombineInput{Y: sh.ref[r].RecvX, Weights: sh.ref[r].RecvWeights}
		toks[r] = tokens
	}
	if sh.comb, err = intranode.ReferenceCombine(sh.shape, toks, sh.ref, cins); err != nil {
		return nil, err
	}
	if o.fp8 {
		sh.in8 = make([]intranode.RankInput, ranks)
		for r := range ranks {
			rng := rand.New(rand.NewPCG(o.seed+1, uint64(r)))
			q := make([]uint8, tokens*o.hidden)
			for i := 0; i < len(q); i += 8 {
				v := rng.Uint64()
				for j := i; j < min(i+8, len(q)); j++ {
					q[j] = uint8(v>>(8*(j-i))) & 0x7e // finite E4M3
				}
			}
			sh.in8[r] = intranode.RankInput{TopK: sh.in[r].TopK, XFP8: q, Scales: randomF32(rng, tokens*o.hidden/128)}
		}
		if sh.ref8, err = intranode.ReferenceDispatch(sh.shape, sh.in8, 0); err != nil {
			return nil, err
		}
	}
	return sh, nil
}

// rankSeed is the routing generator's seed of rank r (route --generate
// writes the same routings).
func rankSeed(seed uint64, r int) uint64 { return seed*1000 + uint64(r) }

// randomBF16 draws BF16 values of either sign with magnitudes 2^-8..2^8,
// four per 64-bit draw.
func randomBF16(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	var bits uint64
	for i := range x {
		if i%4 == 0 {
			bits = rng.Uint64()
		}
		v := uint16(bits)
		bits >>= 16
		x[i] = v&0x8000 | (119+(v>>8)&15)<<7 | v&0x7f
	}
	return x
}

func randomF32(rng *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return w
}

func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// inTensors are one rank's inputs on the device.
type inTensors struct {
	x, ids, w, x8, scales ep.Tensor
}

func (r *inRank) uploadInputs(sh *inShared) (in inTensors, err error) {
	t, o := sh.tokens, r.o
	my := sh.in[r.rank]
	var p uintptr
	if p, err = r.upload(asBytes(my.X)); err != nil {
		return in, err
	}
	in.x = ep.NewTensor(p, ep.BF16, t, o.hidden)
	if p, err = r.upload(asBytes(my.TopK)); err != nil {
		return in, err
	}
	in.ids = ep.NewTensor(p, ep.I64, t, o.topk)
	if p, err = r.upload(asBytes(my.Weights)); err != nil {
		return in, err
	}
	in.w = ep.NewTensor(p, ep.F32, t, o.topk)
	if o.fp8 {
		my8 := sh.in8[r.rank]
		if p, err = r.upload(asBytes(my8.XFP8)); err != nil {
			return in, err
		}
		in.x8 = ep.NewTensor(p, ep.FP8E4M3, t, o.hidden)
		if p, err = r.upload(asBytes(my8.Scales)); err != nil {
			return in, err
		}
		in.scales = ep.NewTensor(p, ep.F32, t, o.hidden/128)
	}
	return in, nil
}
