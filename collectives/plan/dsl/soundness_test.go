package dsl

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
)

// TestCheckerSound: random programs with no discipline at all (data ops on
// random threadblocks, signal/wait pairs here and there). Whatever the
// dependency check accepts must be deterministic: random schedules that
// respect only the program's synchronisation, and the host interpreter,
// all leave the same bytes. A race the check missed would show as two
// schedules that disagree.

type soundOp struct {
	tb    [2]int // rank, threadblock
	sync  int    // 0 data, 1 signal, 2 wait
	ch    [3]int // (set, from, to) of the channel signalled or waited on
	apply func(*simState)
}

func genSound(seed uint64) (*Program, []soundOp, int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	W := 2 + rng.IntN(2)
	p, _ := New(Config{Name: fmt.Sprintf("sound-%d", seed), Collective: AllReduce, Ranks: W})
	// Channel set k is signalled and waited on by threadblock k only.
	var ch [2][][]*Channel
	for k := range ch {
		ch[k] = make([][]*Channel, W)
		for r := range ch[k] {
			ch[k][r] = make([]*Channel, W)
		}
		for r := 0; r < W; r++ {
			for q := r + 1; q < W; q++ {
				ch[k][r][q], ch[k][q][r] = p.pairChannels(Memory, r, q)
			}
		}
	}
	var ops []soundOp
	pick := func(r int) Chunk {
		if rng.IntN(3) == 0 {
			return p.Scratch(r, rng.IntN(propScratch), 1)
		}
		return p.Output(r, rng.IntN(W), 1)
	}
	for n := 0; n < 6+rng.IntN(8); n++ {
		r, tb := rng.IntN(W), rng.IntN(2)
		q := (r + 1 + rng.IntN(W-1)) % W
		switch rng.IntN(4) {
		case 0: // put
			src, dst := pick(r), pick(q)
			p.Put(tb, ch[0][r][q], dst, src)
			ops = append(ops, soundOp{tb: [2]int{r, tb}, apply: func(s *simState) { copy(s.buf(dst), s.buf(src)) }})
		case 1: // reduce into a local chunk
			a, b, dst := pick(r), pick(r), pick(r)
			if dst == b {
				a, b = b, a // an in-place reduction names its destination first
			}
			p.Reduce(r, tb, dst, a, b)
			ops = append(ops, soundOp{tb: [2]int{r, tb}, apply: func(s *simState) {
				acc := bytes.Clone(s.buf(a))
				addInt32(acc, s.buf(b))
				copy(s.buf(dst), acc)
			}})
		default: // r tells q through set tb's channel
			p.Signal(tb, ch[tb][r][q])
			p.Wait(tb, ch[tb][q][r])
			ops = append(ops, soundOp{tb: [2]int{r, tb}, sync: 1, ch: [3]int{tb, r, q}},
				soundOp{tb: [2]int{q, tb}, sync: 2, ch: [3]int{tb, r, q}})
		}
	}
	return p, ops, W
}

// schedule runs ops in a random order that keeps each threadblock's order
// and puts every wait after its signal.
func schedule(ops []soundOp, s *simState, rng *rand.Rand) error {
	queues := map[[2]int][]soundOp{}
	var keys [][2]int
	for _, o := range ops {
		if _, ok := queues[o.tb]; !ok {
			keys = append(keys, o.tb)
		}
		queues[o.tb] = append(queues[o.tb], o)
	}
	signals, waits := map[[3]int]int{}, map[[3]int]int{}
	for left := len(ops); left > 0; left-- {
		var ready [][2]int
		for _, k := range keys {
			q := queues[k]
			if len(q) > 0 && (q[0].sync != 2 || signals[q[0].ch] > waits[q[0].ch]) {
				ready = append(ready, k)
			}
		}
		if len(ready) == 0 {
			return fmt.Errorf("stuck with %d ops left", left)
		}
		k := ready[rng.IntN(len(ready))]
		o := queues[k][0]
		queues[k] = queues[k][1:]
		switch o.sync {
		case 0:
			o.apply(s)
		case 1:
			signals[o.ch]++
		case 2:
			waits[o.ch]++
		}
	}
	return nil
}

func TestCheckerSound(t *testing.T) {
	n := 300
	if testing.Short() || raceEnabled {
		n = 100
	}
	accepted := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		p, ops, W := genSound(seed)
		pl, _, err := p.Compile()
		if err != nil {
			continue // refused: a race, or a signal without its wait
		}
		accepted++
		size := uint64(W * propChunk)
		w, err := plan.NewHostWorld(pl, W, size, false, plan.HostConfig{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		in, out, _ := hostBuffers(w, plan.Int32, seed)
		start := func() *simState {
			s := &simState{}
			for r := 0; r < W; r++ {
				s.in = append(s.in, bytes.Clone(in[r]))
				s.out = append(s.out, bytes.Clone(out[r]))
				s.scratch = append(s.scratch, make([]byte, propScratch*propChunk))
			}
			return s
		}
		var first *simState
		for k := 0; k < 4; k++ {
			s := start()
			if err := schedule(ops, s, rand.New(rand.NewPCG(seed, uint64(k)))); err != nil {
				t.Fatalf("seed %d: accepted program cannot run: %v", seed, err)
			}
			if first == nil {
				first = s
				continue
			}
			for r := 0; r < W; r++ {
				if !bytes.Equal(s.out[r], first.out[r]) || !bytes.Equal(s.scratch[r], first.scratch[r]) {
					t.Fatalf("seed %d: the check accepted a program whose result depends on the schedule (rank %d)", seed, r)
				}
			}
		}
		if err := w.Run(context.Background(), plan.Int32, in, out); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for r := 0; r < W; r++ {
			if i := firstDiff(out[r], first.out[r]); i >= 0 {
				t.Fatalf("seed %d: rank %d: the host interpreter differs from the schedules at byte %d", seed, r, i)
			}
		}
	}
	if accepted < n/10 || accepted == n {
		t.Fatalf("%d of %d random programs accepted: the generator tests too little", accepted, n)
	}
	t.Logf("%d of %d random programs accepted", accepted, n)
}
