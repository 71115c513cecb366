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
	sync  int    // one of the constants below
	ch    [3]int // (set, from, to) of the channel signalled or waited on (set 2: the port channels)
	apply func(*simState)
}

const (
	sData       = iota
	sSignal     // memory: counts at once
	sWait       // waits for its signal
	sPortPut    // queued to the proxy of (rank, tb, channel)
	sPortSignal // queued behind the puts: counts when the proxy gets to it
	sFlush      // waits until that proxy's queue is empty
)

func genSound(seed uint64) (*Program, []soundOp, int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	W := 2 + rng.IntN(2)
	p, _ := New(Config{Name: fmt.Sprintf("sound-%d", seed), Collective: AllReduce, Ranks: W})
	// Channel set k is signalled and waited on by threadblock k only;
	// port channels are signalled from threadblock 0 only, puts from any.
	ch := [2][][]*Channel{p.mesh(Memory), p.mesh(Memory)}
	pc := p.mesh(Port)
	var ops []soundOp
	pick := func(r int) Chunk {
		if rng.IntN(3) == 0 {
			return p.Scratch(r, rng.IntN(propScratch), 1)
		}
		return p.Output(r, rng.IntN(W), 1)
	}
	for n := 0; n < 4+rng.IntN(10); n++ {
		r, tb := rng.IntN(W), rng.IntN(2)
		q := (r + 1 + rng.IntN(W-1)) % W
		switch rng.IntN(8) {
		case 4, 7: // put through the proxy, sometimes flushed
			src, dst := pick(r), pick(q)
			p.Put(tb, pc[r][q], dst, src)
			ops = append(ops, soundOp{tb: [2]int{r, tb}, sync: sPortPut, ch: [3]int{2, r, q}, apply: func(s *simState) { copy(s.buf(dst), s.buf(src)) }})
			if rng.IntN(2) == 0 {
				p.Flush(tb, pc[r][q])
				ops = append(ops, soundOp{tb: [2]int{r, tb}, sync: sFlush, ch: [3]int{2, r, q}})
			}
		case 5: // a port signal from threadblock 0, waited on by the peer's
			p.Signal(0, pc[r][q])
			p.Wait(0, pc[q][r])
			ops = append(ops, soundOp{tb: [2]int{r, 0}, sync: sPortSignal, ch: [3]int{2, r, q}},
				soundOp{tb: [2]int{q, 0}, sync: sWait, ch: [3]int{2, r, q}})
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
		default: // 2, 3, 6: r tells q through set tb's channel
			p.Signal(tb, ch[tb][r][q])
			p.Wait(tb, ch[tb][q][r])
			ops = append(ops, soundOp{tb: [2]int{r, tb}, sync: sSignal, ch: [3]int{tb, r, q}},
				soundOp{tb: [2]int{q, tb}, sync: sWait, ch: [3]int{tb, r, q}})
		}
	}
	return p, ops, W
}

// schedule runs ops in a random order that keeps each threadblock's order,
// puts every wait after its signal, and runs port puts and signals on a
// proxy per (rank, threadblock, channel), in the order they were queued.
// lazy runs a proxy step only when no threadblock can move (proxies as
// late as possible); otherwise every step is a random one.
func schedule(ops []soundOp, s *simState, rng *rand.Rand, lazy bool) error {
	queues := map[[2]int][]soundOp{}
	var keys [][2]int
	for _, o := range ops {
		if _, ok := queues[o.tb]; !ok {
			keys = append(keys, o.tb)
		}
		queues[o.tb] = append(queues[o.tb], o)
	}
	type proxyKey struct {
		tb [2]int
		ch [3]int
	}
	proxies := map[proxyKey][]soundOp{}
	var pkeys []proxyKey
	signals, waits := map[[3]int]int{}, map[[3]int]int{}
	for {
		var ready []func()
		for _, k := range keys {
			q := queues[k]
			if len(q) == 0 {
				continue
			}
			o, pk := q[0], proxyKey{k, q[0].ch}
			switch {
			case o.sync == sWait && signals[o.ch] <= waits[o.ch]:
			case o.sync == sFlush && len(proxies[pk]) > 0:
			default:
				ready = append(ready, func() {
					queues[k] = queues[k][1:]
					switch o.sync {
					case sData:
						o.apply(s)
					case sSignal:
						signals[o.ch]++
					case sWait:
						waits[o.ch]++
					case sPortPut, sPortSignal:
						if _, ok := proxies[pk]; !ok {
							pkeys = append(pkeys, pk)
						}
						proxies[pk] = append(proxies[pk], o)
					}
				})
			}
		}
		for _, pk := range pkeys {
			if len(proxies[pk]) > 0 && !(lazy && len(ready) > 0) {
				ready = append(ready, func() {
					o := proxies[pk][0]
					proxies[pk] = proxies[pk][1:]
					if o.sync == sPortSignal {
						signals[o.ch]++
					} else {
						o.apply(s)
					}
				})
			}
		}
		if len(ready) == 0 {
			for _, q := range queues {
				if len(q) > 0 {
					return fmt.Errorf("stuck: threadblock %v waits", q[0].tb)
				}
			}
			return nil
		}
		ready[rng.IntN(len(ready))]()
	}
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
		for k := 0; k < 6; k++ {
			s := start()
			if err := schedule(ops, s, rand.New(rand.NewPCG(seed, uint64(k))), k%2 == 1); err != nil {
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
