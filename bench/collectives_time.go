package bench

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
)

// slowest returns the largest per-call time over ranks (0 when any rank
// failed).
func (r *collRun) slowest(us float64, failed error) (float64, error) {
	if failed != nil {
		us = -1
	}
	all, err := r.c.Bootstrap().AllGather(r.ctx, binary.LittleEndian.AppendUint64(nil, math.Float64bits(us)))
	if err != nil {
		return 0, err
	}
	m := 0.0
	for _, b := range all {
		v := math.Float64frombits(binary.LittleEndian.Uint64(b))
		if v < 0 {
			return 0, nil
		}
		m = max(m, v)
	}
	return m, nil
}

func bandwidth(k collectives.Kind, W, size int, us float64) (alg, bus float64) {
	if us <= 0 {
		return 0, 0
	}
	total := float64(size)
	factor := float64(W-1) / float64(W)
	if k == collectives.AllReduce {
		factor *= 2
	} else {
		total *= float64(W)
	}
	alg = total / (us * 1e3)
	return alg, alg * factor
}

// time measures cs in one mode and returns microseconds per call.
func (r *collRun) time(cs colltest.Case, mode string) (float64, int, error) {
	issue := func() error {
		_, err := r.b.Issue(r.ctx, cs, r.s)
		return err
	}
	elapsed := func(calls int) (float64, error) {
		if err := r.ev[1].Synchronize(); err != nil {
			return 0, err
		}
		if err := r.c.Check(); err != nil {
			return 0, err
		}
		d, err := r.dev.Elapsed(r.ev[0], r.ev[1])
		return float64(d) / float64(time.Microsecond) / float64(calls), err
	}
	switch mode {
	case "eager":
		for i := 0; i < min(5, r.o.iters); i++ {
			if err := issue(); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		for i := 0; i < r.o.iters; i++ {
			if err := issue(); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		us, err := elapsed(r.o.iters)
		return us, r.o.iters, err
	case "graph":
		g, err := r.dev.Capture(r.s, func() error {
			for i := 0; i < r.o.graphCalls; i++ {
				if err := issue(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
		defer g.Close()
		if err := g.Launch(r.s); err != nil {
			return 0, 0, err
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		for i := 0; i < r.o.replays; i++ {
			if err := g.Launch(r.s); err != nil {
				return 0, 0, err
			}
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		calls := r.o.graphCalls * r.o.replays
		us, err := elapsed(calls)
		return us, calls, err
	}
	// flushed: each call alone, after an L2 flush and a device barrier
	// (an 8-byte LL allreduce), timed between its own events.
	if err := issue(); err != nil { // warm-up
		return 0, 0, err
	}
	total := 0.0
	for i := 0; i < r.o.flushIters; i++ {
		if r.flush.Ptr != 0 {
			if err := r.dev.MemsetAsync(r.flush.Ptr, byte(i), r.flush.Size, r.s); err != nil {
				return 0, 0, err
			}
		}
		if _, err := r.c.AllReduce(r.ctx, r.s, r.bar.Ptr, r.bar.Ptr, 8, ref.FP32, ref.Sum, collectives.WithAlgorithm(collectives.AlgoLL)); err != nil {
			return 0, 0, err
		}
		if err := r.ev[0].Record(r.s); err != nil {
			return 0, 0, err
		}
		if err := issue(); err != nil {
			return 0, 0, err
		}
		if err := r.ev[1].Record(r.s); err != nil {
			return 0, 0, err
		}
		us, err := elapsed(1)
		if err != nil {
			return 0, 0, err
		}
		total += us
	}
	return total / float64(r.o.flushIters), r.o.flushIters, nil
}
