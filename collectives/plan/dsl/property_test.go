package dsl

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/goep-dev/goep/collectives/plan"
)

// The property test: random small programs compile, and the host
// interpreter's result equals a direct simulation of the program's
// operations. The generator keeps every program race-free by construction
// (within a round, a chunk another threadblock touches is never written;
// rounds end with a barrier of both threadblocks of every rank and a
// signal/wait with every peer), records the meaning of each op as a
// closure over plain byte slices, and the simulation runs those closures in
// recording order: for a race-free program any order that respects each
// threadblock's order gives the same result.

const (
	propTBs     = 2
	propScratch = 4
	propChunk   = 64 // bytes of a chunk: the message is ranks x propChunk
)

type simState struct {
	in, out, scratch [][]byte // per rank; in place, in aliases out
}

func (s *simState) buf(c Chunk) []byte {
	var b []byte
	switch c.Buf {
	case Input:
		b = s.in[c.Rank]
	case Output:
		b = s.out[c.Rank]
	default:
		b = s.scratch[c.Rank]
	}
	return b[c.Index*propChunk : (c.Index+c.Size)*propChunk]
}

func addInt32(dst, x []byte) {
	for i := 0; i+4 <= len(dst); i += 4 {
		v := int32(binary.LittleEndian.Uint32(dst[i:])) + int32(binary.LittleEndian.Uint32(x[i:]))
		binary.LittleEndian.PutUint32(dst[i:], uint32(v))
	}
}

type cellUse struct {
	thread [2]int // rank, tb
	write  bool
}

type gen struct {
	rng     *rand.Rand
	p       *Program
	W       int
	inPlace bool
	mem     [][]*Channel
	port    [][]*Channel
	sim     []func(*simState)
	round   map[[3]int][]cellUse // (rank, canonical buffer, chunk) -> uses this round
}

func (g *gen) chunk(rank int, bufs ...BufKind) Chunk {
	b := bufs[g.rng.IntN(len(bufs))]
	n := g.W
	if b == Scratch {
		n = propScratch
	}
	size := 1 + g.rng.IntN(2)
	if g.p.cfg.Instances > 1 {
		// Replication cuts a range of s chunks into s-chunk parts of the
		// refined buffer: ops on one chunk at two granularities would then
		// overlap across instances (the checker refuses that as a race).
		size = 1
	}
	if size > n {
		size = n
	}
	return Chunk{rank, b, g.rng.IntN(n - size + 1), size}
}

func (g *gen) cells(c Chunk) [][3]int {
	var out [][3]int
	for i := c.Index; i < c.Index+c.Size; i++ {
		b := c.Buf
		if g.inPlace && b == Input {
			b = Output
		}
		out = append(out, [3]int{c.Rank, int(b), i})
	}
	return out
}

// admit says whether an op of thread th reading reads and writing writes
// keeps the round race-free, and records its uses if so.
func (g *gen) admit(th [2]int, reads, writes []Chunk) bool {
	ok := func(c Chunk, write bool) bool {
		for _, k := range g.cells(c) {
			for _, u := range g.round[k] {
				if u.thread != th && (u.write || write) {
					return false
				}
			}
		}
		return true
	}
	for _, c := range reads {
		if !ok(c, false) {
			return false
		}
	}
	for _, c := range writes {
		if !ok(c, true) {
			return false
		}
		// Within one op a destination may equal a source but not
		// overlap it otherwise.
		for _, r := range reads {
			for _, kw := range g.cells(c) {
				for _, kr := range g.cells(r) {
					if kw == kr && (c.Index != r.Index || c.Buf != r.Buf && !(g.inPlace && c.Buf != Scratch && r.Buf != Scratch)) {
						return false
					}
				}
			}
		}
	}
	for _, c := range reads {
		for _, k := range g.cells(c) {
			g.round[k] = append(g.round[k], cellUse{th, false})
		}
	}
	for _, c := range writes {
		for _, k := range g.cells(c) {
			g.round[k] = append(g.round[k], cellUse{th, true})
		}
	}
	return true
}

func (g *gen) peer(r int) int {
	q := g.rng.IntN(g.W - 1)
	if q >= r {
		q++
	}
	return q
}

// op adds one random data op on rank r, threadblock tb, if it keeps the
// round race-free.
func (g *gen) op(r, tb int) {
	p, th := g.p, [2]int{r, tb}
	all := []BufKind{Input, Output, Scratch}
	switch g.rng.IntN(6) {
	case 0, 1: // put, through a memory or a port channel
		q := g.peer(r)
		src := g.chunk(r, all...)
		dst := g.chunk(q, all...)
		dst.Size = src.Size
		if dst.Index+dst.Size > map[bool]int{true: propScratch, false: g.W}[dst.Buf == Scratch] {
			return
		}
		if !g.admit(th, []Chunk{src}, []Chunk{dst}) {
			return
		}
		if g.rng.IntN(2) == 0 {
			p.Put(tb, g.mem[r][q], dst, src)
		} else {
			p.Put(tb, g.port[r][q], dst, src)
			p.Flush(tb, g.port[r][q])
		}
		g.sim = append(g.sim, func(s *simState) { copy(s.buf(dst), s.buf(src)) })
	case 2: // get
		q := g.peer(r)
		src := g.chunk(q, all...)
		dst := g.chunk(r, Output, Scratch)
		dst.Size = src.Size
		if dst.Index+dst.Size > map[bool]int{true: propScratch, false: g.W}[dst.Buf == Scratch] || !g.admit(th, []Chunk{src}, []Chunk{dst}) {
			return
		}
		p.Get(tb, g.mem[r][q], dst, src)
		g.sim = append(g.sim, func(s *simState) { copy(s.buf(dst), s.buf(src)) })
	case 3: // copy
		src := g.chunk(r, all...)
		dst := g.chunk(r, Output, Scratch)
		dst.Size = src.Size
		if dst.Index+dst.Size > map[bool]int{true: propScratch, false: g.W}[dst.Buf == Scratch] || !g.admit(th, []Chunk{src}, []Chunk{dst}) {
			return
		}
		p.Copy(r, tb, dst, src)
		g.sim = append(g.sim, func(s *simState) { copy(s.buf(dst), s.buf(src)) })
	case 4: // reduce of local chunks
		a := g.chunk(r, all...)
		b := g.chunk(r, all...)
		b.Size = a.Size
		dst := a
		if g.rng.IntN(2) == 0 {
			dst = g.chunk(r, Output, Scratch)
			dst.Size = a.Size
		}
		lim := map[bool]int{true: propScratch, false: g.W}
		if b.Index+b.Size > lim[b.Buf == Scratch] || dst.Index+dst.Size > lim[dst.Buf == Scratch] || !g.admit(th, []Chunk{a, b}, []Chunk{dst}) {
			return
		}
		p.Reduce(r, tb, dst, a, b)
		g.sim = append(g.sim, func(s *simState) {
			acc := bytes.Clone(s.buf(a))
			addInt32(acc, s.buf(b))
			copy(s.buf(dst), acc)
		})
	case 5: // read-reduce from one or two peers
		local := g.chunk(r, all...)
		dst := g.chunk(r, Output, Scratch)
		dst.Size = local.Size
		var rem []Remote
		reads := []Chunk{local}
		for _, q := range peers(g.W, r)[:min(g.W-1, 1+g.rng.IntN(2))] {
			c := g.chunk(q, all...)
			c.Size = local.Size
			if c.Index+c.Size > map[bool]int{true: propScratch, false: g.W}[c.Buf == Scratch] {
				return
			}
			rem = append(rem, Remote{g.mem[r][q], c})
			reads = append(reads, c)
		}
		if dst.Index+dst.Size > map[bool]int{true: propScratch, false: g.W}[dst.Buf == Scratch] || !g.admit(th, reads, []Chunk{dst}) {
			return
		}
		p.ReadReduce(r, tb, dst, local, rem...)
		g.sim = append(g.sim, func(s *simState) {
			acc := bytes.Clone(s.buf(local))
			for _, x := range rem {
				addInt32(acc, s.buf(x.Chunk))
			}
			copy(s.buf(dst), acc)
		})
	}
}

// endRound orders everything of the round before everything after it.
func (g *gen) endRound() {
	for r := 0; r < g.W; r++ {
		g.p.Barrier(r, 0, 1)
		for _, q := range peers(g.W, r) {
			g.p.Signal(0, g.mem[r][q])
		}
		for _, q := range peers(g.W, r) {
			g.p.Wait(0, g.mem[r][q])
		}
		g.p.Barrier(r, 0, 1)
	}
	g.round = map[[3]int][]cellUse{}
}

func genProgram(seed uint64) (*gen, error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	W := 2 + rng.IntN(3)
	g := &gen{rng: rng, W: W, inPlace: rng.IntN(3) == 0, round: map[[3]int][]cellUse{}}
	p, err := New(Config{Name: fmt.Sprintf("random-%d", seed), Collective: AllReduce, Ranks: W, InPlace: g.inPlace,
		Instances: 1 + rng.IntN(2)})
	if err != nil {
		return nil, err
	}
	g.p = p
	g.mem, g.port = p.mesh(Memory), p.mesh(Port)
	rounds := 1 + rng.IntN(3)
	for k := 0; k < rounds; k++ {
		for n := 0; n < 3*W; n++ {
			g.op(rng.IntN(W), rng.IntN(propTBs))
		}
		g.endRound()
	}
	return g, nil
}

func TestRandomProgramsMatchSimulation(t *testing.T) {
	n := 60
	if testing.Short() || raceEnabled {
		n = 20
	}
	ops := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		g, err := genProgram(seed)
		if err != nil {
			t.Fatal(err)
		}
		ops += len(g.sim)
		pl, _, err := g.p.Compile()
		if err != nil {
			t.Fatalf("seed %d: a race-free program is refused: %v", seed, err)
		}
		W, inst := g.W, g.p.cfg.Instances
		size := uint64(W * propChunk)
		w, err := plan.NewHostWorld(pl, W, size, g.inPlace, plan.HostConfig{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if got := w.Resolved(0).ChunkBytes * uint64(inst); got != propChunk {
			t.Fatalf("seed %d: chunks of %d bytes, the simulation assumes %d", seed, got, propChunk)
		}
		in, out, _ := hostBuffers(w, plan.Int32, seed)
		sim := &simState{}
		for r := 0; r < W; r++ {
			o := bytes.Clone(out[r])
			i := bytes.Clone(in[r])
			if g.inPlace {
				i = o
			}
			sim.out, sim.in = append(sim.out, o), append(sim.in, i)
			sim.scratch = append(sim.scratch, make([]byte, propScratch*propChunk))
		}
		if err := w.Run(context.Background(), plan.Int32, in, out); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for _, f := range g.sim {
			f(sim)
		}
		for r := 0; r < W; r++ {
			if i := firstDiff(out[r], sim.out[r]); i >= 0 {
				t.Fatalf("seed %d (W %d, in place %v, %d instances, %d ops): rank %d output differs from the simulation at byte %d",
					seed, W, g.inPlace, inst, len(g.sim), r, i)
			}
			if i := firstDiff(in[r], sim.in[r]); i >= 0 {
				t.Fatalf("seed %d: rank %d input differs from the simulation at byte %d", seed, r, i)
			}
		}
	}
	if ops < 5*n {
		t.Fatalf("only %d data ops in %d programs: the generator admits too little", ops, n)
	}
}

// TestRandomRacesRefused: random race-free programs with two unordered
// writes of one chunk added at the end are refused, naming the chunk.
func TestRandomRacesRefused(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		g, err := genProgram(seed)
		if err != nil {
			t.Fatal(err)
		}
		// Two threadblocks of rank 0 write the same output chunk with no
		// barrier after the last round.
		g.p.Copy(0, 0, g.p.Output(0, 0, 1), g.p.Input(0, 1, 1))
		g.p.Copy(0, 1, g.p.Output(0, 0, 1), g.p.Input(0, 1, 1))
		if _, _, err := g.p.Compile(); err == nil || !strings.Contains(err.Error(), "race on rank 0 output chunk") {
			t.Fatalf("seed %d: want a race error, got %v", seed, err)
		}
	}
}
