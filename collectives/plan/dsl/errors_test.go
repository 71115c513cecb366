package dsl

import (
	"strings"
	"testing"
)

func newTest(t *testing.T, cfg Config) *Program {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "t"
	}
	if cfg.Collective == "" {
		cfg.Collective = AllReduce
	}
	if cfg.Ranks == 0 {
		cfg.Ranks = 2
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRefused: programs that must not compile, each with the words its
// error must carry (the operation, ranks, what is wrong).
func TestRefused(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		build func(p *Program)
		want  []string
	}{
		{"two ranks write one chunk", Config{}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.Put(0, a, p.Output(1, 0, 1), p.Input(0, 0, 1))
			p.Copy(1, 0, p.Output(1, 0, 1), p.Input(1, 1, 1))
			_ = b
		}, []string{"race on rank 1 output chunk 0", "rank 0 tb 0 op 0 (put on memory channel 0->1 #0)", "writes", "rank 1 tb 0 op 0 (copy)"}},
		{"read before the signal arrives", Config{}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.Put(0, a, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
			p.Signal(0, a)
			p.Copy(1, 0, p.Output(1, 0, 1), p.Scratch(1, 0, 1)) // before the wait
			p.Wait(0, b)
		}, []string{"race on rank 1 scratch chunk 0", "rank 1 tb 0 op 0 (copy)", "reads"}},
		{"relaxed signal orders no data", Config{}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.Put(0, a, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
			p.RelaxedSignal(0, a)
			p.Wait(0, b)
			p.Copy(1, 0, p.Output(1, 0, 1), p.Scratch(1, 0, 1))
		}, []string{"race on rank 1 scratch chunk 0"}},
		{"two threadblocks of one rank", Config{}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 0, 1), p.Input(0, 0, 1))
			p.Reduce(0, 1, p.Output(0, 1, 1), p.Output(0, 0, 1), p.Input(0, 1, 1))
		}, []string{"race on rank 0 output chunk 0", "rank 0 tb 0 op 0 (copy)", "rank 0 tb 1 op 0 (reduce)"}},
		{"in place aliasing", Config{InPlace: true}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 1, 1), p.Input(0, 0, 1))
			p.Copy(0, 1, p.Scratch(0, 0, 1), p.Input(0, 1, 1)) // input 1 is output 1
		}, []string{"race on rank 0 output chunk 1"}},
		{"port put then overwrite before flush", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Port, 0, 1)
			p.Put(0, a, p.Output(1, 0, 1), p.Output(0, 0, 1))
			p.Copy(0, 0, p.Output(0, 0, 1), p.Input(0, 0, 1))
		}, []string{"race on rank 0 output chunk 0", "(the proxy's copy)", "rank 0 tb 0 op 1 (copy) writes"}},
		{"port put ordered by a memory signal", Config{}, func(p *Program) {
			pa, _ := p.pairChannels(Port, 0, 1)
			ma, mb := p.pairChannels(Memory, 0, 1)
			p.Put(0, pa, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
			p.Signal(0, ma) // the proxy may not have copied yet
			p.Wait(0, mb)
			p.Copy(1, 0, p.Output(1, 0, 1), p.Scratch(1, 0, 1))
		}, []string{"race on rank 1 scratch chunk 0", "(the proxy's copy) writes", "rank 1 tb 0 op 1 (copy) reads"}},
		{"one chunk at two granularities, replicated", Config{Instances: 2}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 0, 2), p.Input(0, 0, 2))
			p.Copy(0, 0, p.Scratch(0, 0, 1), p.Output(0, 1, 1)) // fine once; across instances a race
		}, []string{"race on rank 0 output chunk 2", "rank 0 tb 0 (instance 1: plan threadblock 1) op 0 (copy) writes",
			"rank 0 tb 0 (instance 0: plan threadblock 0) op 1 (copy) reads"}},
		{"nil channel", Config{}, func(p *Program) {
			p.Put(0, nil, p.Output(1, 0, 1), p.Input(0, 0, 1))
		}, []string{"rank 0 tb 0 op 0 (put", "unknown channel"}},
		{"foreign channel", Config{}, func(p *Program) {
			q, _ := New(Config{Name: "other", Collective: AllReduce, Ranks: 2})
			c, _ := q.pairChannels(Memory, 0, 1)
			p.Signal(0, c)
		}, []string{"(signal on memory channel 0->1 #0)", "unknown channel"}},
		{"remote chunk through a foreign channel", Config{}, func(p *Program) {
			q, _ := New(Config{Name: "other", Collective: AllReduce, Ranks: 2})
			c, _ := q.pairChannels(Memory, 0, 1)
			p.ReadReduce(0, 0, p.Output(0, 0, 1), p.Input(0, 0, 1), Remote{c, p.Input(1, 0, 1)})
		}, []string{"rank 0 tb 0 op 0 (read-reduce)", "unknown channel"}},
		{"channel without partner", Config{}, func(p *Program) {
			a := p.MemoryChannel(0, 1)
			p.Signal(0, a)
		}, []string{"memory channel 0->1 #0 has no partner", "used by rank 0 tb 0 op 0 (signal"}},
		{"rank out of range", Config{Ranks: 4}, func(p *Program) {
			p.Copy(4, 0, p.Output(4, 0, 1), p.Input(4, 0, 1))
		}, []string{"rank 4 out of range", "(copy)"}},
		{"channel to a rank out of range", Config{Ranks: 4}, func(p *Program) {
			p.MemoryChannel(0, 9)
		}, []string{"memory channel 0->9", "rank 9 out of range"}},
		{"chunk past the input", Config{}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 0, 1), p.Input(0, 2, 1))
		}, []string{"rank 0 tb 0 op 0 (copy)", "rank 0 input[2:3] is out of bounds (the input has 2 chunks)"}},
		{"empty chunk", Config{}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 0, 0), p.Input(0, 0, 0))
		}, []string{"(copy)", "out of bounds"}},
		{"chunk on the wrong rank", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			p.Put(0, a, p.Output(0, 0, 1), p.Input(0, 0, 1))
		}, []string{"(put on memory channel 0->1 #0)", "the channel must lead from rank 0 to the chunk's rank"}},
		{"sizes differ", Config{Ranks: 4}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 0, 2), p.Input(0, 2, 1))
		}, []string{"(copy)", "an op moves one size"}},
		{"wait without signal", Config{}, func(p *Program) {
			_, b := p.pairChannels(Memory, 0, 1)
			p.Wait(0, b)
		}, []string{"rank 1 tb 0 op 0 (wait on memory channel 1->0 #0)", "signals memory channel 0->1 #0 0 times", "waits", "1 times"}},
		{"signal without wait", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			p.Signal(0, a)
		}, []string{"rank 0 tb 0 op 0 (signal", "1 times", "0 times"}},
		{"deadlock", Config{}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.Wait(0, a)
			p.Signal(0, a)
			p.Wait(0, b)
			p.Signal(0, b)
		}, []string{"deadlock", "rank 0 tb 0 op 0 (wait", "rank 1 tb 0 op 0 (wait"}},
		{"signals of one channel from two threadblocks", Config{}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.Signal(0, a)
			p.Signal(1, a)
			p.Wait(0, b)
			p.Wait(0, b)
		}, []string{"rank 0 tb 1 op 0 (signal", "from threadblocks 0 and 1"}},
		{"packets in a Simple program", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			p.PutPackets(0, a, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
		}, []string{"(put-packets", "need protocol LL"}},
		{"packets no one writes", Config{Protocol: LL}, func(p *Program) {
			p.UnpackPackets(0, 0, p.Output(0, 0, 1), p.Scratch(0, 0, 1))
		}, []string{"rank 0 tb 0 op 0 (unpack-packets)", "no op writes", "wait forever"}},
		{"packets written twice", Config{Protocol: LL}, func(p *Program) {
			a, b := p.pairChannels(Memory, 0, 1)
			p.PutPackets(0, a, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
			p.CopyPackets(1, 0, p.Scratch(1, 0, 1), p.Input(1, 0, 1))
			_ = b
		}, []string{"both write packets to rank 1 scratch chunk 0"}},
		{"port packets copied before they arrive", Config{Ranks: 3, Protocol: LL}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			b, _ := p.pairChannels(Port, 1, 2)
			p.PutPackets(0, a, p.Scratch(1, 0, 1), p.Input(0, 0, 1))
			// Rank 1's proxy copies the packet bytes without waiting for
			// their flags: rppkt would wait, ppkt does not.
			p.PutPackets(0, b, p.Scratch(2, 0, 1), p.Scratch(1, 0, 1))
			p.UnpackPackets(2, 0, p.Output(2, 0, 1), p.Scratch(2, 0, 1))
		}, []string{"race on rank 1 scratch chunk 0", "rank 1 tb 0 op 0 (put-packets on port channel 1->2 #0) (the proxy's copy) reads"}},
		{"packets to a peer's output", Config{Protocol: LL}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			p.PutPackets(0, a, p.Output(1, 0, 1), p.Input(0, 0, 1))
		}, []string{"(put-packets", "must be in scratch"}},
		{"get through a port channel", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Port, 0, 1)
			p.Get(0, a, p.Output(0, 0, 1), p.Input(1, 0, 1))
		}, []string{"(get on port channel 0->1 #0)", "memory channel"}},
		{"flush on a memory channel", Config{}, func(p *Program) {
			a, _ := p.pairChannels(Memory, 0, 1)
			p.Flush(0, a)
		}, []string{"(flush on memory channel", "port channel"}},
		{"semaphore never released", Config{}, func(p *Program) {
			s := p.NewSemaphore(0, 0)
			p.Acquire(1, s)
		}, []string{"rank 0 tb 1 op 0 (semaphore-acquire)", "wait forever"}},
		{"destination overlaps source", Config{Ranks: 4}, func(p *Program) {
			p.Copy(0, 0, p.Output(0, 1, 2), p.Output(0, 0, 2))
		}, []string{"(copy)", "overlaps source"}},
		{"threadblock out of range", Config{Instances: 4}, func(p *Program) {
			p.Copy(0, 256, p.Output(0, 0, 1), p.Input(0, 0, 1))
		}, []string{"threadblock 256 out of range"}},
		{"too many ops in a threadblock", Config{Ranks: 2}, func(p *Program) {
			for i := 0; i < 40; i++ {
				p.Copy(0, 0, p.Output(0, i%2, 1), p.Input(0, i%2, 1))
				p.Copy(0, 0, p.Input(0, i%2, 1), p.Output(0, i%2, 1))
			}
		}, []string{"rank 0 threadblock 0 has", "at most 64"}},
		{"nested pipelines", Config{}, func(p *Program) {
			p.Pipeline(0, 0, 1024, 1, func() {
				p.Pipeline(0, 0, 1024, 1, func() {})
			})
		}, []string{"pipelines do not nest"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newTest(t, c.cfg)
			c.build(p)
			_, _, err := p.Compile()
			if err == nil {
				t.Fatal("compiled")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestNewRefused: configurations New refuses.
func TestNewRefused(t *testing.T) {
	for _, c := range []Config{
		{Name: "x", Collective: "reduce", Ranks: 2},
		{Name: "", Collective: AllReduce, Ranks: 2},
		{Name: "x", Collective: AllReduce, Ranks: 0},
		{Name: "x", Collective: AllReduce, Ranks: 2, Protocol: "LL128"},
		{Name: "x", Collective: AllReduce, Ranks: 2, Instances: -1},
		{Name: "x", Collective: AllReduce, Ranks: 2, ThreadsPerBlock: 2048},
		{Name: "x", Collective: AllReduce, Ranks: 2, MinMessageSize: 10, MaxMessageSize: 5},
		{Name: "x", Collective: AllReduce, Ranks: 2, Alignment: 12},
		{Name: "x", Collective: AllReduce, Ranks: 2, InputChunks: 3, OutputChunks: 2},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := Build("nope", Options{Ranks: 2}); err == nil {
		t.Error("unknown builtin accepted")
	}
	if _, err := Build("allreduce-ring", Options{Ranks: 1}); err == nil {
		t.Error("one rank accepted")
	}
	var p *Program
	p.Copy(0, 0, p.Output(0, 0, 1), p.Input(0, 0, 1))
	p.Signal(0, p.MemoryChannel(0, 1))
	p.Acquire(0, p.NewSemaphore(0, 1))
	p.Barrier(0, 0)
	p.Pipeline(0, 0, 64, 1, func() {})
	if _, _, err := p.Compile(); err == nil {
		t.Error("nil program compiled")
	}
}
