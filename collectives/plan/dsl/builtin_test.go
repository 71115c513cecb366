package dsl

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/goep-dev/goep/collectives/plan"
)

// sizesFor are test message sizes (bytes of the input; allgather: of one
// rank's input) for a builtin: one element, sizes that are not multiples
// of chunks x alignment, whole chunks, and with big set 32 MiB of the
// collective's message.
func sizesFor(b Builtin, W, instances int, dt plan.DataType, big bool) []uint64 {
	e := uint64(dt.Size())
	w := uint64(W)
	unit := w * 16 * uint64(instances) // chunks x alignment of a W-chunk buffer
	var sizes []uint64
	switch b.Collective {
	case AllToAll:
		// Blocks must be whole chunks: the layout puts chunk k at k*C.
		sizes = []uint64{unit, 3 * unit, 64 * unit}
	case ReduceScatter:
		sizes = []uint64{w * e, w * e * 7, unit, w * (unit + e), w * 1000 * e}
	default:
		sizes = []uint64{e, 7 * e, unit, unit + e, 1000 * e, 3*unit/2 + 12}
	}
	if big {
		n := uint64(32 << 20)
		if b.Collective == AllGather {
			n /= w // the message is the output
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// TestBuiltinsHost compiles every builtin for 2, 4 and 8 ranks, in and out
// of place, loads it and runs it on the host interpreter at every size of
// sizesFor (two launches each: the second on the other scratch half and
// flag), comparing every rank's output with the collective's definition.
func TestBuiltinsHost(t *testing.T) {
	for _, b := range Builtins() {
		for _, W := range []int{2, 4, 8} {
			for _, inPlace := range []bool{false, true} {
				// Replication is checked the same way: 2 instances for 4
				// ranks, the builtin's default for 8.
				instances := map[int]int{2: 1, 4: 2, 8: 0}[W]
				name := fmt.Sprintf("%s/W%d/x%d/inplace=%v", b.Name, W, instances, inPlace)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					p, err := b.Program(Options{Ranks: W, Instances: instances, InPlace: inPlace})
					if err != nil {
						t.Fatal(err)
					}
					instances := p.Config().Instances
					pl, js, err := p.Compile()
					if err != nil {
						t.Fatal(err)
					}
					// What Compile returns is what the loader makes of the
					// JSON it returns.
					again, err := plan.Parse(js)
					if err != nil || again.Name != pl.Name || again.World() != W || again.InPlace != inPlace {
						t.Fatalf("reparse: %v", err)
					}
					big := W == 8 && !inPlace && !testing.Short() && !raceEnabled
					for i, size := range sizesFor(b, W, instances, plan.DataTypes[W%4], big) {
						dt := plan.DataTypes[(i+W)%len(plan.DataTypes)]
						if size%uint64(dt.Size()) != 0 || b.Collective == ReduceScatter && size%uint64(W*dt.Size()) != 0 {
							dt = plan.DataTypes[W%4]
						}
						launches := 2
						if size > 1<<20 {
							launches = 1
						}
						if err := runHost(pl, size, dt, launches); err != nil {
							t.Fatalf("size %d %s: %v", size, dt, err)
						}
					}
				})
			}
		}
	}
}

// TestBuiltinJSONFormat checks the emitted JSON has the keys MSCCL++'s
// executor indexes without defaults, and nothing our loader would ignore.
func TestBuiltinJSONFormat(t *testing.T) {
	p, err := Build("allreduce-ring", Options{Ranks: 4, Instances: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, js, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(js, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "collective", "protocol", "inplace", "reuse_resources", "use_double_scratch_buffer",
		"buffer_alignment", "num_threads_per_block", "min_message_size", "max_message_size", "gpus"} {
		if _, ok := top[k]; !ok {
			t.Errorf("key %q missing", k)
		}
	}
	gpus := top["gpus"].([]any)
	if len(gpus) != 4 {
		t.Fatalf("%d gpus", len(gpus))
	}
	g0 := gpus[0].(map[string]any)
	for _, k := range []string{"id", "input_chunks", "output_chunks", "scratch_chunks", "threadblocks", "channels", "remote_buffers", "semaphores"} {
		if _, ok := g0[k]; !ok {
			t.Errorf("gpu key %q missing", k)
		}
	}
	if n := len(g0["semaphores"].([]any)); n != 1 {
		t.Errorf("ring: %d semaphores on gpu 0, want 1", n)
	}
}

// TestFusion checks the fused forms appear where the program allows them
// and not with NoFusion, and that both forms compute the same thing.
func TestFusion(t *testing.T) {
	names := func(js []byte) map[string]int {
		var pl plan.Plan
		if err := json.Unmarshal(js, &pl); err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, g := range pl.GPUs {
			for _, tb := range g.Threadblocks {
				for _, o := range tb.Ops {
					out[o.Name]++
				}
			}
		}
		return out
	}
	for _, c := range []struct {
		builtin string
		fused   []string
		plain   []string
	}{
		{"allreduce-rs-ag", []string{"rres", "rlxsignal"}, []string{"rre", "put"}},
		{"allreduce-allpairs-packet", []string{"ppkt", "repkt"}, []string{"ppkt", "repkt"}},
		{"allreduce-packet-rs-ag", []string{"ppkt", "respkt", "upkt"}, []string{"ppkt", "repkt", "upkt"}},
		{"allreduce-ring", []string{"res"}, []string{"re", "put"}},
		{"sendrecv-ring", []string{"pwsf"}, []string{"pwsf"}},
	} {
		for _, noFusion := range []bool{false, true} {
			b, _ := lookup(c.builtin)
			p, err := New(Config{Name: b.Name, Collective: b.Collective, Ranks: 4, Protocol: b.Protocol, NoFusion: noFusion, Instances: b.DefaultInstances(4)})
			if err != nil {
				t.Fatal(err)
			}
			b.build(p)
			pl, js, err := p.Compile()
			if err != nil {
				t.Fatal(err)
			}
			got := names(js)
			want := c.fused
			if noFusion {
				want = c.plain
			}
			for _, n := range want {
				if got[n] == 0 {
					t.Errorf("%s fusion=%v: no %q op (ops %v)", c.builtin, !noFusion, n, got)
				}
			}
			if !noFusion && c.builtin == "allreduce-rs-ag" && (got["rre"] != 0 || got["put"] != 0) {
				t.Errorf("%s: unfused ops left: %v", c.builtin, got)
			}
			if err := runHost(pl, 4096+64, plan.FP32, 2); err != nil {
				t.Errorf("%s fusion=%v: %v", c.builtin, !noFusion, err)
			}
		}
	}
}

func lookup(name string) (Builtin, bool) {
	for _, b := range builtins {
		if b.Name == name {
			return b, true
		}
	}
	return Builtin{}, false
}

// TestRegister registers builtins and checks selection, with and without a
// registry selector and a per-plan accept.
func TestRegister(t *testing.T) {
	var reg plan.Registry
	entries, err := RegisterBuiltins(&reg, Options{Ranks: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(builtins) {
		t.Fatalf("%d entries", len(entries))
	}
	q := plan.Query{Collective: AllReduce, World: 4, Bytes: 1 << 20}
	if e := reg.Select(q); e == nil || e.Plan.Name != "allreduce-allpairs-packet" {
		t.Fatalf("default selection: %v", e)
	}
	// A selector like MSCCL++'s: packets below 64 KiB, the ring above.
	reg.SetSelector(func(q plan.Query, cands []*plan.Entry) *plan.Entry {
		want := "allreduce-ring"
		if q.Bytes < 64<<10 {
			want = "allreduce-allpairs-packet"
		}
		for _, e := range cands {
			if e.Plan.Name == want {
				return e
			}
		}
		return nil
	})
	if e := reg.Select(q); e == nil || e.Plan.Name != "allreduce-ring" {
		t.Fatalf("selector, 1 MiB: %v", e)
	}
	q.Bytes = 4096
	if e := reg.Select(q); e == nil || e.Plan.Name != "allreduce-allpairs-packet" {
		t.Fatalf("selector, 4 KiB: %v", e)
	}
	q.InPlace = true // nothing registered in place
	if e := reg.Select(q); e != nil {
		t.Fatalf("in place: %v", e.Plan.Name)
	}
	// A selector returning a plan that does not take the call gets nothing.
	reg.SetSelector(func(plan.Query, []*plan.Entry) *plan.Entry { return entries[len(entries)-1] })
	if e := reg.Select(plan.Query{Collective: AllGather, World: 4, Bytes: 4096}); e != nil {
		t.Fatalf("foreign choice accepted: %v", e.Plan.Name)
	}
	reg.SetSelector(nil)
	// Per-plan accept.
	p, err := Build("allgather-fullmesh", Options{Ranks: 4, InPlace: true})
	if err != nil {
		t.Fatal(err)
	}
	e, err := Register(&reg, p, func(q plan.Query) bool { return q.Bytes >= 1024 })
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.Select(plan.Query{Collective: AllGather, World: 4, InPlace: true, Bytes: 4096}); got != e {
		t.Fatalf("accepting: %v", got)
	}
	if got := reg.Select(plan.Query{Collective: AllGather, World: 4, InPlace: true, Bytes: 512}); got != nil {
		t.Fatalf("declining: %v", got.Plan.Name)
	}
	if _, err := Register(nil, p, nil); err == nil {
		t.Fatal("nil registry accepted")
	}
}

// TestPipeline runs a pipelined transfer (put, signal and wait per unit)
// on the host: the emitted op is a pipeline with the iteration context, and
// the result is sendrecv's at sizes of several units and of part of one.
func TestPipeline(t *testing.T) {
	p := newTest(t, Config{Name: "pipelined-sendrecv", Collective: SendRecv, Ranks: 2})
	a, b := p.pairChannels(Memory, 0, 1)
	for r, ch := range []*Channel{a, b} {
		n := 1 - r
		p.handshake(0, r, ch)
		p.Pipeline(r, 0, 256, 1, func() {
			p.Put(0, ch, p.Output(n, 0, 1), p.Input(r, 0, 1))
			p.Signal(0, ch)
			p.Wait(0, ch)
		})
	}
	pl, js, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var got plan.Plan
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range got.GPUs[0].Threadblocks[0].Ops {
		if o.Name == "pipeline" && o.IterContext != nil && o.IterContext.UnitSize == 256 && len(o.Ops) >= 3 {
			found = true
		}
	}
	if !found {
		t.Fatalf("no pipeline op in %s", js)
	}
	for _, size := range []uint64{8, 256, 1000, 4096} {
		if err := runHost(pl, size, plan.BF16, 2); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
	}
}

// TestPacketRelay: an LL allgather on a ring of 3 where packets are
// copied into local scratch (cpkt), forwarded hop by hop (rppkt through
// memory channels, ppkt through a port channel) and unpacked (upkt).
func TestPacketRelay(t *testing.T) {
	const W = 3
	for _, port := range []bool{false, true} {
		p := newTest(t, Config{Name: "relay", Collective: AllGather, Ranks: W, Protocol: LL})
		typ := Memory
		if port {
			typ = Port
		}
		send := make([]*Channel, W)
		for r := 0; r < W; r++ {
			send[r], _ = p.pairChannels(typ, r, (r+1)%W)
		}
		// Scratch slot q of every rank holds rank q's input as packets.
		for r := 0; r < W; r++ {
			n := (r + 1) % W
			p.CopyPackets(r, 0, p.Scratch(r, r, 1), p.Input(r, 0, 1))
			if port {
				p.PutPackets(0, send[r], p.Scratch(n, r, 1), p.Scratch(r, r, 1))
			} else {
				p.ReadPutPackets(0, send[r], p.Scratch(n, r, 1), p.Scratch(r, r, 1))
			}
			prev := (r + W - 1) % W
			p.ReadPutPackets(1, send[r], p.Scratch(n, prev, 1), p.Scratch(r, prev, 1)) // relay r-1's to r+1
			p.Copy(r, 0, p.Output(r, r, 1), p.Input(r, 0, 1))
			for q := 0; q < W; q++ {
				if q != r {
					p.UnpackPackets(r, 2, p.Output(r, q, 1), p.Scratch(r, q, 1))
				}
			}
		}
		pl, _, err := p.Compile()
		if err != nil {
			t.Fatalf("port %v: %v", port, err)
		}
		for _, size := range []uint64{16, 4096, 1 << 16} {
			if err := runHost(pl, size, plan.FP16, 2); err != nil {
				t.Fatalf("port %v size %d: %v", port, size, err)
			}
		}
	}
}
