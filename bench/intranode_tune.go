package bench

import (
	"github.com/goep-dev/goep/ep"
)

// Tuning: the block sizes swept for each copy path and SM count.
var (
	tuneDispatchThreads = map[ep.CopyMode][]int{
		ep.CopyPlain: {256, 512, 768, 1024},
		ep.CopyWide:  {128, 256, 384, 512},
		ep.CopyTMA:   {128, 256, 512},
	}
	tuneCombineThreads = []int{128, 256, 384, 512}
)

func (r *inRank) tuneSMs() []int {
	var out []int
	for _, s := range r.o.tuneSMs {
		if sms := r.dev.Info().SMs; sms == 0 || s <= sms {
			out = append(out, s)
		}
	}
	return out
}

// tuneDispatch times cached dispatch at every (copy path, SMs, threads).
func (r *inRank) tuneDispatch(t int, dtype string, base ep.DispatchArgs, bytes int64, recv int) error {
	for _, mode := range ep.CopyModes {
		for _, sms := range r.tuneSMs() {
			for _, thr := range tuneDispatchThreads[mode] {
				a := base
				var k inKey
				var err error
				if a.Launch, k, err = r.launch(ep.OpDispatch, sms, thr, mode); err != nil {
					return err
				}
				if err := r.measure(k.with(t, "dispatch", dtype, "cached"), bytes, recv, true, func() (float64, float64, error) {
					return r.timeCalls(r.o.tuneWarmup, r.o.tuneIters, func() error { _, err := r.buf.Dispatch(r.ctx, a); return err })
				}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (r *inRank) tuneBF16(sh *inShared, in inTensors, res ep.DispatchResult, bytes int64) error {
	t, n := sh.tokens, res.NumRecv
	if err := r.tuneDispatch(t, "bf16", ep.DispatchArgs{X: in.x, Handle: res.Handle, Stream: r.st}, bytes, n); err != nil {
		return err
	}
	if err := r.agree("bf16 check after tuning", r.checkDispatch("bf16 dispatch after tuning", res, sh.ref[r.rank], false, false)); err != nil {
		return err
	}
	for _, sms := range r.tuneSMs() {
		for _, thr := range tuneCombineThreads {
			l, k, err := r.launch(ep.OpCombine, sms, thr, ep.CopyDefault)
			if err != nil {
				return err
			}
			a := ep.CombineArgs{X: res.RecvX, Weights: res.RecvWeights, Handle: res.Handle, Stream: r.st, Launch: l}
			if err := r.measure(k.with(t, "combine", "bf16", "events"), bytes, n, true, func() (float64, float64, error) {
				return r.timeCalls(r.o.tuneWarmup, r.o.tuneIters, func() error { _, err := r.buf.Combine(r.ctx, a); return err })
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *inRank) tuneFP8(sh *inShared, in inTensors, res ep.DispatchResult, bytes int64) error {
	if err := r.tuneDispatch(sh.tokens, "fp8", ep.DispatchArgs{X: in.x8, Scales: in.scales, Handle: res.Handle, Stream: r.st}, bytes, res.NumRecv); err != nil {
		return err
	}
	return r.agree("fp8 check after tuning", r.checkDispatch("fp8 dispatch after tuning", res, sh.ref8[r.rank], true, false))
}
