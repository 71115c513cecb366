package dsl

import (
	"errors"
	"fmt"
	"math"

	"github.com/goep-dev/goep/collectives/plan"
)

// Collective names, as the plan JSON and plan.Expected spell them.
const (
	AllReduce     = "allreduce"
	AllGather     = "allgather"
	ReduceScatter = "reducescatter"
	AllToAll      = "alltoall"
	SendRecv      = "sendrecv"
	Broadcast     = "broadcast"
)

// Protocols.
const (
	Simple = "Simple"
	LL     = "LL"
)

// Config describes a program.
type Config struct {
	Name       string
	Collective string // one of the constants above ("reduce-scatter" is accepted)
	Ranks      int
	Protocol   string // Simple (default) or LL; LL programs get a double scratch buffer
	// Instances replicates the program (default 1): threadblocks,
	// channels, semaphores and barriers are copied, and every buffer gets
	// Instances times as many chunks, instance j taking part j of every
	// op's range (chunks [i, i+s) become [i*n+j*s, i*n+(j+1)*s), MSCCL++'s
	// interleaved policy). Ops that use a chunk at two granularities (alone
	// and in a longer range) then overlap across instances; the dependency
	// check refuses such programs.
	Instances       int
	ThreadsPerBlock int // default 1024
	// MinMessageSize and MaxMessageSize bound the sizes the plan takes
	// (the input, the output for allgather); MaxMessageSize 0 is no bound.
	MinMessageSize, MaxMessageSize uint64
	InPlace                        bool
	// ChunkFactor cuts each rank's part into that many chunks (default 1):
	// allreduce and alltoall have Ranks*ChunkFactor input and output chunks,
	// allgather ChunkFactor input and Ranks*ChunkFactor output chunks,
	// reducescatter the reverse, sendrecv and broadcast ChunkFactor each.
	ChunkFactor int
	// InputChunks and OutputChunks, when nonzero, override the counts.
	InputChunks, OutputChunks int
	Alignment                 uint64        // buffer_alignment (default 16)
	Reduce                    plan.ReduceOp // of every reduction (default sum)
	// NoFusion keeps every operation separate (for comparisons).
	NoFusion bool
}

// BufKind names a buffer of a rank.
type BufKind uint8

const (
	Input BufKind = iota
	Output
	Scratch
)

func (b BufKind) String() string {
	switch b {
	case Input:
		return "input"
	case Output:
		return "output"
	case Scratch:
		return "scratch"
	}
	return fmt.Sprintf("buffer(%d)", uint8(b))
}

func (b BufKind) json() string { return [...]string{"i", "o", "s"}[b] }

// Chunk is chunks [Index, Index+Size) of a rank's buffer.
type Chunk struct {
	Rank        int
	Buf         BufKind
	Index, Size int
}

func (c Chunk) String() string {
	return fmt.Sprintf("rank %d %s[%d:%d]", c.Rank, c.Buf, c.Index, c.Index+c.Size)
}

// ChanType is a channel's kind.
type ChanType uint8

const (
	Memory ChanType = iota // peer memory access by GPU threads
	Port                   // copy engines through the CPU proxy
)

func (t ChanType) String() string {
	if int(t) >= 2 {
		return fmt.Sprintf("chantype(%d)", int(t))
	}
	return [...]string{"memory", "port"}[t]
}

// Channel is one end of a channel: From's access to To. Its partner is the
// channel of the same type from To to From with the same Tag (the Tag-th
// created between them in that direction); every channel needs one.
type Channel struct {
	p        *Program
	id       int
	Type     ChanType
	From, To int
	Tag      int
}

func (c *Channel) String() string {
	if c == nil {
		return "nil channel"
	}
	return fmt.Sprintf("%s channel %d->%d #%d", c.Type, c.From, c.To, c.Tag)
}

// Semaphore is an intra-rank counting semaphore between threadblocks.
type Semaphore struct {
	p    *Program
	Rank int
	id   int // index among the rank's semaphores
	Init int64
}

type opKind uint8

const (
	opNop opKind = iota
	opPut
	opGet
	opCopy
	opReduce
	opReadReduce
	opPutPackets
	opReadPutPackets
	opCopyPackets
	opUnpackPackets
	opReducePackets
	opSignal
	opWait
	opFlush
	opPutSignal
	opPutSignalFlush
	opBarrier
	opSemAcquire
	opSemRelease
	opPipeline
	// Fused forms (compile only).
	opReduceSend
	opReadReduceSend
	opReduceSendPackets
)

var opNames = map[opKind]string{
	opNop: "nop", opPut: "put", opGet: "get", opCopy: "copy", opReduce: "reduce", opReadReduce: "read-reduce",
	opPutPackets: "put-packets", opReadPutPackets: "read-put-packets", opCopyPackets: "copy-packets",
	opUnpackPackets: "unpack-packets", opReducePackets: "reduce-packets", opSignal: "signal", opWait: "wait",
	opFlush: "flush", opPutSignal: "put-with-signal", opPutSignalFlush: "put-with-signal-and-flush",
	opBarrier: "barrier", opSemAcquire: "semaphore-acquire", opSemRelease: "semaphore-release", opPipeline: "pipeline",
	opReduceSend: "reduce-send", opReadReduceSend: "read-reduce-send", opReduceSendPackets: "reduce-send-packets",
}

func (k opKind) String() string { return opNames[k] }

// ref is an operand: a chunk, reached through ch when it is another
// rank's.
type ref struct {
	c  Chunk
	ch *Channel
}

// op is one recorded operation of a threadblock.
type op struct {
	kind    opKind
	rank    int
	tb      int
	idx     int // position in its threadblock (or pipeline body)
	seq     int // creation order in the program
	relaxed bool
	src     []ref
	dst     []ref
	chans   []*Channel // signal, wait, flush, port data ops: thread i uses chans[i]
	barrier *barrierGroup
	sem     *Semaphore
	// Pipeline.
	unit      uint64
	numChunks int
	body      []*op
	parent    *op
	// After replication: the threadblock the program named, and the
	// instance (tb is then the plan's threadblock).
	userTB   int
	instance int
	copies   int
}

func (o *op) String() string {
	tb := fmt.Sprint(o.tb)
	if o.copies > 1 {
		tb = fmt.Sprintf("%d (instance %d: plan threadblock %d)", o.userTB, o.instance, o.tb)
	}
	s := fmt.Sprintf("rank %d tb %s op %d (%s", o.rank, tb, o.idx, o.kind)
	if o.parent != nil {
		s = fmt.Sprintf("rank %d tb %s op %d (pipeline) body op %d (%s", o.rank, tb, o.parent.idx, o.idx, o.kind)
	}
	if len(o.chans) == 1 {
		s += " on " + o.chans[0].String()
	}
	return s + ")"
}

type barrierGroup struct {
	rank int
	id   int
	tbs  []int
	ops  []*op
}

// Program records a collective's operations. Methods record; mistakes
// (ranks out of range, chunks out of bounds, foreign channels) are kept and
// reported by Compile, each naming the operation, so a program reads as a
// straight list of operations. A Program is not safe for concurrent use.
type Program struct {
	cfg       Config
	inChunks  int
	outChunks int
	channels  []*Channel
	tags      map[[3]int]int // (type, from, to) -> channels so far
	sems      [][]*Semaphore // per rank
	barriers  [][]*barrierGroup
	tbs       []map[int][]*op // per rank: tb -> ops
	seq       int
	pipe      *op // the pipeline being recorded, if any
	errs      []error
}

// Limits of what a program may use (the format's, divided among instances
// where replication multiplies them).
const (
	MaxScratchChunks = 1 << 16
	maxErrors        = 8
)

// New starts a program.
func New(cfg Config) (*Program, error) {
	if cfg.Collective == "reduce-scatter" || cfg.Collective == "reduce_scatter" {
		cfg.Collective = ReduceScatter
	}
	switch cfg.Collective {
	case AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv, Broadcast:
	default:
		return nil, fmt.Errorf("dsl: program %q: collective %q (want allreduce, allgather, reducescatter, alltoall, sendrecv or broadcast)", cfg.Name, cfg.Collective)
	}
	if cfg.Name == "" {
		return nil, errors.New("dsl: a program needs a name")
	}
	if cfg.Ranks < 1 || cfg.Ranks > plan.MaxWorld {
		return nil, fmt.Errorf("dsl: program %q: %d ranks (want 1..%d)", cfg.Name, cfg.Ranks, plan.MaxWorld)
	}
	if cfg.Protocol == "" {
		cfg.Protocol = Simple
	}
	if cfg.Protocol != Simple && cfg.Protocol != LL {
		return nil, fmt.Errorf("dsl: program %q: protocol %q (want Simple or LL)", cfg.Name, cfg.Protocol)
	}
	if cfg.Instances == 0 {
		cfg.Instances = 1
	}
	if cfg.Instances < 1 || cfg.Instances > 64 {
		return nil, fmt.Errorf("dsl: program %q: %d instances (want 1..64)", cfg.Name, cfg.Instances)
	}
	if cfg.ThreadsPerBlock == 0 {
		cfg.ThreadsPerBlock = 1024
	}
	if cfg.ThreadsPerBlock < 32 || cfg.ThreadsPerBlock > 1024 {
		return nil, fmt.Errorf("dsl: program %q: %d threads per block (want 32..1024)", cfg.Name, cfg.ThreadsPerBlock)
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = math.MaxUint64
	}
	if cfg.MinMessageSize > cfg.MaxMessageSize {
		return nil, fmt.Errorf("dsl: program %q: message sizes [%d, %d]", cfg.Name, cfg.MinMessageSize, cfg.MaxMessageSize)
	}
	if cfg.Alignment == 0 {
		cfg.Alignment = 16
	}
	if cfg.Alignment%8 != 0 || cfg.Alignment > 1<<20 {
		return nil, fmt.Errorf("dsl: program %q: alignment %d (want a multiple of 8, at most 1 MiB)", cfg.Name, cfg.Alignment)
	}
	if cfg.Reduce > plan.ReduceMax {
		return nil, fmt.Errorf("dsl: program %q: reduction %v", cfg.Name, cfg.Reduce)
	}
	if cfg.ChunkFactor == 0 {
		cfg.ChunkFactor = 1
	}
	f, W := cfg.ChunkFactor, cfg.Ranks
	if f < 1 || f*W > 1<<14 {
		return nil, fmt.Errorf("dsl: program %q: chunk factor %d for %d ranks", cfg.Name, f, W)
	}
	in, out := f, f
	switch cfg.Collective {
	case AllReduce, AllToAll:
		in, out = W*f, W*f
	case AllGather:
		out = W * f
	case ReduceScatter:
		in = W * f
	}
	if cfg.InputChunks != 0 {
		in = cfg.InputChunks
	}
	if cfg.OutputChunks != 0 {
		out = cfg.OutputChunks
	}
	if in < 0 || out < 0 || in > 1<<14 || out > 1<<14 || in == 0 && out == 0 {
		return nil, fmt.Errorf("dsl: program %q: %d input and %d output chunks", cfg.Name, in, out)
	}
	if in != 0 && out != 0 && max(in, out)%min(in, out) != 0 {
		return nil, fmt.Errorf("dsl: program %q: %d input and %d output chunks (one must divide the other)", cfg.Name, in, out)
	}
	if cfg.InPlace && in != 0 && out != 0 && in != out && max(in, out) != min(in, out)*W {
		return nil, fmt.Errorf("dsl: program %q: in place needs equal buffers or one %d times the other", cfg.Name, W)
	}
	p := &Program{cfg: cfg, inChunks: in, outChunks: out, tags: map[[3]int]int{}}
	p.sems = make([][]*Semaphore, W)
	p.barriers = make([][]*barrierGroup, W)
	p.tbs = make([]map[int][]*op, W)
	for r := range p.tbs {
		p.tbs[r] = map[int][]*op{}
	}
	return p, nil
}

// Config is the program's configuration, defaults filled in.
func (p *Program) Config() Config {
	if p == nil {
		return Config{}
	}
	return p.cfg
}

// Ranks is the program's world size.
func (p *Program) Ranks() int {
	if p == nil {
		return 0
	}
	return p.cfg.Ranks
}

// Chunks is the number of input and output chunks of every rank (before
// replication into instances).
func (p *Program) Chunks() (input, output int) {
	if p == nil {
		return 0, 0
	}
	return p.inChunks, p.outChunks
}

// Input is chunks [index, index+size) of rank's input.
func (p *Program) Input(rank, index, size int) Chunk { return Chunk{rank, Input, index, size} }

// Output is chunks [index, index+size) of rank's output.
func (p *Program) Output(rank, index, size int) Chunk { return Chunk{rank, Output, index, size} }

// Scratch is chunks [index, index+size) of rank's scratch; the scratch is
// as large as the highest chunk any rank uses.
func (p *Program) Scratch(rank, index, size int) Chunk { return Chunk{rank, Scratch, index, size} }

// MemoryChannel creates a memory channel from rank from to rank to.
func (p *Program) MemoryChannel(from, to int) *Channel { return p.channel(Memory, from, to) }

// PortChannel creates a port channel from rank from to rank to.
func (p *Program) PortChannel(from, to int) *Channel { return p.channel(Port, from, to) }

func (p *Program) channel(t ChanType, from, to int) *Channel {
	if p == nil {
		return nil
	}
	key := [3]int{int(t), from, to}
	c := &Channel{p: p, id: len(p.channels), Type: t, From: from, To: to, Tag: p.tags[key]}
	p.tags[key]++
	if err := p.rankErr(from); err != nil {
		p.fail(fmt.Errorf("%s: from: %w", c, err))
	} else if err := p.rankErr(to); err != nil {
		p.fail(fmt.Errorf("%s: to: %w", c, err))
	} else if from == to {
		p.fail(fmt.Errorf("%s: a channel connects two different ranks", c))
	}
	p.channels = append(p.channels, c)
	return c
}

// NewSemaphore creates a semaphore of rank with an initial value.
func (p *Program) NewSemaphore(rank int, init int64) *Semaphore {
	if p == nil {
		return nil
	}
	s := &Semaphore{p: p, Rank: rank, Init: init}
	if err := p.rankErr(rank); err != nil {
		p.fail(fmt.Errorf("semaphore: %w", err))
		return s
	}
	if init < 0 || init > 1<<20 {
		p.fail(fmt.Errorf("semaphore of rank %d: initial value %d", rank, init))
	}
	s.id = len(p.sems[rank])
	p.sems[rank] = append(p.sems[rank], s)
	return s
}

func (p *Program) fail(err error) {
	p.errs = append(p.errs, err)
}

// record adds an op to its threadblock (or the pipeline being recorded)
// after the checks of check.go.
// Methods that record do nothing on a nil Program (Compile reports it).
func (p *Program) record(o *op) {
	if p == nil {
		return
	}
	o.seq = p.seq
	p.seq++
	if p.rankErr(o.rank) == nil {
		if p.pipe != nil {
			o.parent = p.pipe
			o.idx = len(p.pipe.body)
			p.pipe.body = append(p.pipe.body, o)
		} else {
			o.idx = len(p.tbs[o.rank][o.tb])
			p.tbs[o.rank][o.tb] = append(p.tbs[o.rank][o.tb], o)
		}
	}
	if err := p.checkOp(o); err != nil {
		p.fail(fmt.Errorf("%s: %w", o, err))
	}
}

// Channel operations run on ch.From, by its threadblock tb. A nil channel
// or one of another program is an unknown channel: Compile refuses it.

// Put copies src (on ch.From) into dst (on ch.To). On a port channel the
// proxy copies later: a signal or flush on the channel orders it.
func (p *Program) Put(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opPut, tb, ch, src.Rank, []ref{{c: src}}, []ref{{c: dst, ch: ch}})
}

// PutWithSignal is Put then Signal on a port channel, as one operation.
func (p *Program) PutWithSignal(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opPutSignal, tb, ch, src.Rank, []ref{{c: src}}, []ref{{c: dst, ch: ch}})
}

// PutWithSignalAndFlush is PutWithSignal then Flush, as one operation.
func (p *Program) PutWithSignalAndFlush(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opPutSignalFlush, tb, ch, src.Rank, []ref{{c: src}}, []ref{{c: dst, ch: ch}})
}

// Get copies src (on ch.To) into dst (on ch.From); memory channels only.
func (p *Program) Get(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opGet, tb, ch, dst.Rank, []ref{{c: src, ch: ch}}, []ref{{c: dst}})
}

// PutPackets writes src (data on ch.From) as LL packets into dst, a chunk
// of ch.To's scratch; the reader waits for them, no signal is needed. On a
// port channel src must already be packets in ch.From's scratch.
func (p *Program) PutPackets(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opPutPackets, tb, ch, src.Rank, []ref{{c: src}}, []ref{{c: dst, ch: ch}})
}

// ReadPutPackets waits for the packets of src (ch.From's scratch) and
// forwards them into dst (ch.To's scratch).
func (p *Program) ReadPutPackets(tb int, ch *Channel, dst, src Chunk) {
	p.chanOp(opReadPutPackets, tb, ch, src.Rank, []ref{{c: src}}, []ref{{c: dst, ch: ch}})
}

// Signal bumps the partner channel's semaphore: ops of ch.From's tb before
// it happen before ops after the matching Wait on ch.To.
func (p *Program) Signal(tb int, ch *Channel) { p.syncOp(opSignal, tb, ch, false) }

// RelaxedSignal is Signal without ordering data on the GPU (handshakes).
func (p *Program) RelaxedSignal(tb int, ch *Channel) { p.syncOp(opSignal, tb, ch, true) }

// Wait waits for the partner channel's next signal.
func (p *Program) Wait(tb int, ch *Channel) { p.syncOp(opWait, tb, ch, false) }

// RelaxedWait is Wait for a relaxed signal.
func (p *Program) RelaxedWait(tb int, ch *Channel) { p.syncOp(opWait, tb, ch, true) }

// Flush waits until the proxy has done every put of tb on a port channel.
func (p *Program) Flush(tb int, ch *Channel) { p.syncOp(opFlush, tb, ch, false) }

func (p *Program) chanOp(k opKind, tb int, ch *Channel, rank int, src, dst []ref) {
	if ch != nil && ch.p == p {
		rank = ch.From
	}
	p.record(&op{kind: k, rank: rank, tb: tb, src: src, dst: dst, chans: []*Channel{ch}})
}

func (p *Program) syncOp(k opKind, tb int, ch *Channel, relaxed bool) {
	rank := -1
	if ch != nil && ch.p == p {
		rank = ch.From
	}
	p.record(&op{kind: k, rank: rank, tb: tb, relaxed: relaxed, chans: []*Channel{ch}})
}

// Remote is a chunk of another rank reached through a channel.
type Remote struct {
	Ch    *Channel
	Chunk Chunk
}

// Copy copies src into dst, both of rank's buffers.
func (p *Program) Copy(rank, tb int, dst, src Chunk) {
	p.record(&op{kind: opCopy, rank: rank, tb: tb, src: []ref{{c: src}}, dst: []ref{{c: dst}}})
}

// Reduce stores srcs[0] op srcs[1] op ... into dst, all of rank's buffers.
func (p *Program) Reduce(rank, tb int, dst Chunk, srcs ...Chunk) {
	o := &op{kind: opReduce, rank: rank, tb: tb, dst: []ref{{c: dst}}}
	for _, s := range srcs {
		o.src = append(o.src, ref{c: s})
	}
	p.record(o)
}

// ReadReduce stores local op every remote chunk (read through its memory
// channel) into dst.
func (p *Program) ReadReduce(rank, tb int, dst, local Chunk, remotes ...Remote) {
	o := &op{kind: opReadReduce, rank: rank, tb: tb, dst: []ref{{c: dst}}, src: []ref{{c: local}}}
	for _, r := range remotes {
		o.src = append(o.src, ref{c: r.Chunk, ch: r.Ch})
	}
	p.record(o)
}

// CopyPackets writes src as LL packets into dst (rank's buffers).
func (p *Program) CopyPackets(rank, tb int, dst, src Chunk) {
	p.record(&op{kind: opCopyPackets, rank: rank, tb: tb, src: []ref{{c: src}}, dst: []ref{{c: dst}}})
}

// UnpackPackets waits for the packets of src (rank's scratch) and stores
// their data into dst.
func (p *Program) UnpackPackets(rank, tb int, dst, src Chunk) {
	p.record(&op{kind: opUnpackPackets, rank: rank, tb: tb, src: []ref{{c: src}}, dst: []ref{{c: dst}}})
}

// ReducePackets stores local op the data of every packet chunk (rank's
// scratch, waited for) into dst.
func (p *Program) ReducePackets(rank, tb int, dst, local Chunk, packets ...Chunk) {
	o := &op{kind: opReducePackets, rank: rank, tb: tb, dst: []ref{{c: dst}}, src: []ref{{c: local}}}
	for _, c := range packets {
		o.src = append(o.src, ref{c: c})
	}
	p.record(o)
}

// Barrier makes threadblocks tbs of rank wait for each other: everything
// before it in any of them happens before everything after it in all.
func (p *Program) Barrier(rank int, tbs ...int) {
	if p == nil {
		return
	}
	if err := p.rankErr(rank); err != nil {
		p.fail(fmt.Errorf("barrier: %w", err))
		return
	}
	g := &barrierGroup{rank: rank, id: len(p.barriers[rank]), tbs: tbs}
	p.barriers[rank] = append(p.barriers[rank], g)
	seen := map[int]bool{}
	for _, tb := range tbs {
		if seen[tb] {
			p.fail(fmt.Errorf("barrier %d of rank %d: threadblock %d listed twice", g.id, rank, tb))
			return
		}
		seen[tb] = true
	}
	if p.pipe != nil {
		p.fail(fmt.Errorf("barrier %d of rank %d: barriers cannot be inside a pipeline", g.id, rank))
		return
	}
	for _, tb := range tbs {
		o := &op{kind: opBarrier, rank: rank, tb: tb, barrier: g}
		g.ops = append(g.ops, o)
		p.record(o)
	}
	if len(tbs) == 0 {
		p.fail(fmt.Errorf("barrier %d of rank %d: no threadblocks", g.id, rank))
	}
}

// Acquire waits until sem is positive and decrements it (on sem's rank).
func (p *Program) Acquire(tb int, sem *Semaphore) {
	p.record(&op{kind: opSemAcquire, rank: semRank(p, sem), tb: tb, sem: sem})
}

// Release increments sem (on sem's rank).
func (p *Program) Release(tb int, sem *Semaphore) {
	p.record(&op{kind: opSemRelease, rank: semRank(p, sem), tb: tb, sem: sem})
}

func semRank(p *Program, s *Semaphore) int {
	if s == nil || s.p != p {
		return -1
	}
	return s.Rank
}

// Pipeline records the ops body adds (all on rank's threadblock tb) as a
// loop: each iteration moves unitBytes of every non-packet operand, over
// numChunks chunks in all (iter_context of the format). Pipelines do not
// nest.
func (p *Program) Pipeline(rank, tb int, unitBytes uint64, numChunks int, body func()) {
	if p == nil {
		return
	}
	o := &op{kind: opPipeline, rank: rank, tb: tb, unit: unitBytes, numChunks: numChunks}
	if p.pipe != nil {
		p.fail(fmt.Errorf("%s: pipelines do not nest", o))
		return
	}
	p.record(o)
	p.pipe = o
	body()
	p.pipe = nil
	if len(o.body) == 0 {
		p.fail(fmt.Errorf("%s: empty body", o))
	}
	for _, b := range o.body {
		if b.rank != rank || b.tb != tb {
			p.fail(fmt.Errorf("%s: body op on rank %d tb %d, the pipeline is on rank %d tb %d", b, b.rank, b.tb, rank, tb))
		}
	}
}
