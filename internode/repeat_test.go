package internode_test

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// repeatRound is one round's inputs and the reference's results, drawn
// from the round's own seed so that a long run keeps only the rounds in
// flight (ranks are at most a round apart: every call is collective).
type repeatRound struct {
	ids     [][]int64
	in      []internode.RankInput
	cin     []internode.CombineInput
	opt     internode.CombineOptions
	notify  []internode.NotifyResult
	disp    []internode.RankOutput
	combine []internode.CombineOutput
}

func makeRepeatRound(t *testing.T, s internode.Shape, seed int64, e int) (*repeatRound, error) {
	rng := rand.New(rand.NewSource(seed*1_000_003 + int64(e)))
	w := s.World()
	fp8, weights, biases := e%2 == 1, e%4 < 2, e%3
	d := &repeatRound{ids: make([][]int64, w), in: make([]internode.RankInput, w), cin: make([]internode.CombineInput, w),
		opt: internode.CombineOptions{Partial: []internode.Partial{internode.PartialBF16, internode.PartialFP32}[e/2%2]}}
	zero := rng.Intn(w)
	tokens := make([]int, w)
	for r := range d.in {
		d.ids[r] = notifyIDs(rng, s, r, zero)
		d.in[r] = dispatchInput(rng, s, d.ids[r], fp8, weights)
		tokens[r] = len(d.ids[r]) / s.TopK
	}
	d.notify = wantNotify(t, s, d.ids, 0)
	var err error
	if d.disp, err = internode.ReferenceDispatch(s, d.in, 0); err != nil {
		return nil, err
	}
	for r := range d.cin {
		n := d.disp[r].Received()
		c := internode.CombineInput{Y: bf16s(rng, n*s.Hidden)}
		if weights {
			c.Weights = make([]float32, n*s.TopK)
			for j := range c.Weights {
				c.Weights[j] = rng.Float32()
			}
		}
		if biases >= 1 {
			c.Bias0 = bf16s(rng, tokens[r]*s.Hidden)
		}
		if biases >= 2 {
			c.Bias1 = bf16s(rng, tokens[r]*s.Hidden)
		}
		d.cin[r] = c
	}
	if d.combine, err = internode.ReferenceCombine(s, tokens, d.disp, d.cin, d.opt); err != nil {
		return nil, err
	}
	return d, nil
}

// checkRepeatedRounds runs rounds rounds of notify, dispatch and combine
// on one setup and checks every rank's results of every round against the
// reference's, keeping only the rounds some rank still works on.
func checkRepeatedRounds(t *testing.T, b backend, topo internode.Topology, rounds int, seed int64) {
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 4, Experts: 2 * w}
	var mu sync.Mutex
	cache := map[int]*repeatRound{}
	left := map[int]int{}
	get := func(e int) (*repeatRound, error) {
		mu.Lock()
		defer mu.Unlock()
		if d := cache[e]; d != nil {
			return d, nil
		}
		d, err := makeRepeatRound(t, s, seed, e)
		if err != nil {
			return nil, err
		}
		cache[e], left[e] = d, w
		return d, nil
	}
	release := func(e int) {
		mu.Lock()
		defer mu.Unlock()
		if left[e]--; left[e] == 0 {
			delete(cache, e)
			delete(left, e)
		}
	}
	start := time.Now()
	errs := runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 61, MaxTokens: maxNotifyTokens, SendMemory: testSendMemory, Forward: forward(), PutGroups: putGroups(), ReduceUnits: reduceUnits()})
		if err != nil {
			return nil, err
		}
		me := c.Rank()
		for e := 0; e < rounds; e++ {
			d, err := get(e)
			if err != nil {
				return nt, err
			}
			res, err := nt.Run(d.ids[me])
			if err != nil {
				return nt, err
			}
			if !reflect.DeepEqual(*res, d.notify[me]) {
				return nt, fmt.Errorf("round %d rank %d: notify %+v, want %+v", e+1, me, *res, d.notify[me])
			}
			out, err := nt.Dispatch(d.in[me])
			if err != nil {
				return nt, err
			}
			if !reflect.DeepEqual(comparable(*out), comparable(d.disp[me])) {
				return nt, fmt.Errorf("round %d rank %d: dispatch differs from the reference", e+1, me)
			}
			co, err := nt.Combine(d.cin[me], d.opt)
			if err != nil {
				return nt, err
			}
			want := d.combine[me]
			if !reflect.DeepEqual(co.X, want.X) || (d.cin[me].Weights != nil && !reflect.DeepEqual(co.Weights, want.Weights)) {
				return nt, fmt.Errorf("round %d rank %d: combine differs from the reference", e+1, me)
			}
			release(e)
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	t.Logf("%d checked rounds of %v in %v", rounds, topo, time.Since(start))
}

// Twelve rounds of every step on the host backend, the checks of the
// repeated GPU variant (which a short run here keeps honest).
func TestRoundsRepeated(t *testing.T) {
	checkRepeatedRounds(t, hostBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 12, 5)
}
