package dsl

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/goep-dev/goep/collectives/plan"
)

// Compile checks the program, replicates it into its instances, checks its
// dependencies, fuses adjacent operations, inserts block barriers and
// writes the plan JSON. It returns the plan, loaded and validated by
// plan.Parse, and the JSON.
func (p *Program) Compile() (*plan.Plan, []byte, error) {
	if p == nil {
		return nil, nil, errors.New("dsl: nil program")
	}
	if len(p.errs) > 0 {
		errs := p.errs
		if len(errs) > maxErrors {
			errs = append(errs[:maxErrors:maxErrors], fmt.Errorf("and %d more errors", len(p.errs)-maxErrors))
		}
		return nil, nil, fmt.Errorf("dsl: program %q: %w", p.cfg.Name, errors.Join(errs...))
	}
	if err := p.checkPartners(); err != nil {
		return nil, nil, fmt.Errorf("dsl: program %q: %w", p.cfg.Name, err)
	}
	x := p.replicate()
	if err := p.checkDeps(x.tbs, x.chans, x.in, x.out); err != nil {
		return nil, nil, fmt.Errorf("dsl: program %q: %w", p.cfg.Name, err)
	}
	js, err := p.emit(x)
	if err != nil {
		return nil, nil, fmt.Errorf("dsl: program %q: %w", p.cfg.Name, err)
	}
	pl, err := plan.Parse(js)
	if err != nil {
		return nil, nil, fmt.Errorf("dsl: program %q: the compiled plan does not load: %w", p.cfg.Name, err)
	}
	return pl, js, nil
}

// checkPartners refuses channels without a channel back: the executors
// pair the t-th channel from A to B with the t-th from B to A.
func (p *Program) checkPartners() error {
	for _, c := range p.channels {
		if p.tags[[3]int{int(c.Type), c.To, c.From}] <= c.Tag {
			user := ""
			if o := p.firstUse(c); o != nil {
				user = fmt.Sprintf(" (used by %s)", o)
			}
			return fmt.Errorf("%s has no partner%s: create %s channel number %d from rank %d to rank %d too",
				c, user, c.Type, c.Tag, c.To, c.From)
		}
	}
	return nil
}

func (p *Program) firstUse(c *Channel) *op {
	var first *op
	visit := func(o *op) {
		for _, ch := range o.chans {
			if ch == c && (first == nil || o.seq < first.seq) {
				first = o
			}
		}
	}
	for r := range p.tbs {
		for _, ops := range p.tbs[r] {
			for _, o := range ops {
				visit(o)
				for _, b := range o.body {
					visit(b)
				}
			}
		}
	}
	return first
}

// expanded is the program after replication into instances.
type expanded struct {
	tbs     []map[int][]*op
	chans   []*Channel // by id
	sems    [][]*Semaphore
	in, out int
	nBar    []int // barriers per rank
}

// replicate copies the program Instances times: instance j runs threadblock
// t as t*n+j, uses channel c's j-th copy (tag t*n+j: copies pair up as
// the originals do) and works on part j of every chunk range: chunks
// [i, i+s) become [i*n+j*s, i*n+(j+1)*s) of n times as many.
func (p *Program) replicate() *expanded {
	n := p.cfg.Instances
	x := &expanded{tbs: make([]map[int][]*op, p.cfg.Ranks), in: p.inChunks * n, out: p.outChunks * n,
		sems: make([][]*Semaphore, p.cfg.Ranks), nBar: make([]int, p.cfg.Ranks)}
	chans := map[*Channel][]*Channel{}
	for _, c := range p.channels {
		for j := 0; j < n; j++ {
			nc := &Channel{p: p, id: c.id*n + j, Type: c.Type, From: c.From, To: c.To, Tag: c.Tag*n + j}
			chans[c] = append(chans[c], nc)
			x.chans = append(x.chans, nc)
		}
	}
	sems := map[*Semaphore][]*Semaphore{}
	for r, list := range p.sems {
		for _, s := range list {
			for j := 0; j < n; j++ {
				ns := &Semaphore{p: p, Rank: r, id: s.id*n + j, Init: s.Init}
				sems[s] = append(sems[s], ns)
				x.sems[r] = append(x.sems[r], ns)
			}
		}
	}
	bars := map[*barrierGroup][]*barrierGroup{}
	for r, list := range p.barriers {
		x.nBar[r] = len(list) * n
		for _, g := range list {
			for j := 0; j < n; j++ {
				ng := &barrierGroup{rank: r, id: g.id*n + j}
				for _, tb := range g.tbs {
					ng.tbs = append(ng.tbs, tb*n+j)
				}
				bars[g] = append(bars[g], ng)
			}
		}
	}
	var cp func(o *op, j int, parent *op) *op
	cp = func(o *op, j int, parent *op) *op {
		c := *o
		c.tb, c.parent = o.tb*n+j, parent
		c.userTB, c.instance, c.copies = o.tb, j, n
		mapRefs := func(list []ref) []ref {
			out := make([]ref, len(list))
			for i, r := range list {
				out[i] = ref{c: Chunk{r.c.Rank, r.c.Buf, r.c.Index*n + j*r.c.Size, r.c.Size}}
				if r.ch != nil {
					out[i].ch = chans[r.ch][j]
				}
			}
			return out
		}
		c.src, c.dst = mapRefs(o.src), mapRefs(o.dst)
		c.chans = nil
		for _, ch := range o.chans {
			c.chans = append(c.chans, chans[ch][j])
		}
		if o.sem != nil {
			c.sem = sems[o.sem][j]
		}
		if o.barrier != nil {
			c.barrier = bars[o.barrier][j]
			c.barrier.ops = append(c.barrier.ops, &c)
		}
		c.body = nil
		for _, b := range o.body {
			c.body = append(c.body, cp(b, j, &c))
		}
		return &c
	}
	// Acquires keep the program's recording order within each instance.
	for r := range p.tbs {
		x.tbs[r] = map[int][]*op{}
		for _, tb := range sortedTBs(p.tbs[r]) {
			for j := 0; j < n; j++ {
				for _, o := range p.tbs[r][tb] {
					x.tbs[r][tb*n+j] = append(x.tbs[r][tb*n+j], cp(o, j, nil))
				}
			}
		}
	}
	return x
}

// layout names aliased chunks once (in place, the smaller of input and
// output lies in the larger at the rank's part, or is it).
type layout struct {
	inPlace bool
	in, out int
}

func (l layout) canon(rank int, b BufKind, i int) (BufKind, int) {
	if !l.inPlace || b == Scratch || l.in == 0 || l.out == 0 {
		return b, i
	}
	switch {
	case l.in == l.out:
		return Output, i
	case l.in < l.out && b == Input:
		return Output, rank*l.in + i
	case l.out < l.in && b == Output:
		return Input, rank*l.out + i
	}
	return b, i
}

// ---------------------------------------------------------------------------
// Fusion and block barriers.

func isData(k opKind) bool {
	switch k {
	case opNop, opSignal, opWait, opFlush, opBarrier, opSemAcquire, opSemRelease, opPipeline:
		return false
	}
	return true
}

func memoryOnly(o *op) bool {
	for _, c := range o.chans {
		if c.Type != Memory {
			return false
		}
	}
	return len(o.chans) > 0
}

func sameChans(a, b []*Channel) bool {
	return len(a) == 1 && len(b) == 1 && a[0] == b[0]
}

func overlapChans(a, b []*Channel) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// fuse merges adjacent ops the format can express as one: signals, waits
// and flushes on several channels; a port put and the signal (and flush)
// after it on its channel; memory puts of one source to several peers; a
// reduction and the puts of its result (res, rres, respkt).
func fuse(list []*op) []*op {
	var out []*op
	for _, o := range list {
		if o.kind == opPipeline {
			c := *o
			c.body = fuse(o.body)
			o = &c
		}
		if len(out) > 0 {
			if m := merge(out[len(out)-1], o); m != nil {
				out[len(out)-1] = m
				continue
			}
		}
		out = append(out, o)
	}
	return out
}

func merge(a, b *op) *op {
	cat := func(x, y []ref) []ref { return append(append([]ref(nil), x...), y...) }
	catc := func(x, y []*Channel) []*Channel { return append(append([]*Channel(nil), x...), y...) }
	switch {
	case (a.kind == opSignal || a.kind == opWait || a.kind == opFlush) && b.kind == a.kind && a.relaxed == b.relaxed &&
		a.chans[0].Type == b.chans[0].Type && len(a.chans)+len(b.chans) <= plan.MaxChannelsPerOp && !overlapChans(a.chans, b.chans):
		c := *a
		c.chans = catc(a.chans, b.chans)
		return &c
	case a.kind == opPut && b.kind == opSignal && !b.relaxed && a.chans[0].Type == Port && sameChans(a.chans, b.chans):
		c := *a
		c.kind = opPutSignal
		return &c
	case a.kind == opPutSignal && b.kind == opFlush && sameChans(a.chans, b.chans):
		c := *a
		c.kind = opPutSignalFlush
		return &c
	case (a.kind == opPut || a.kind == opPutPackets) && b.kind == a.kind && memoryOnly(a) && memoryOnly(b) &&
		a.src[0].c == b.src[0].c && len(a.dst)+len(b.dst) <= plan.MaxOperands-2:
		c := *a
		c.dst, c.chans = cat(a.dst, b.dst), catc(a.chans, b.chans)
		return &c
	case b.kind == opPut && memoryOnly(b) && len(a.dst) > 0 && b.src[0].c == a.dst[0].c && len(a.dst) < plan.MaxOperands-1:
		send := map[opKind]opKind{opReduce: opReduceSend, opReduceSend: opReduceSend, opReadReduce: opReadReduceSend, opReadReduceSend: opReadReduceSend}
		k, ok := send[a.kind]
		if !ok {
			return nil
		}
		c := *a
		c.kind, c.dst, c.chans = k, cat(a.dst, b.dst), catc(a.chans, b.chans)
		return &c
	case b.kind == opPutPackets && memoryOnly(b) && len(a.dst) > 0 && (a.kind == opReducePackets || a.kind == opReduceSendPackets) &&
		b.src[0].c == a.dst[0].c && len(a.dst) < plan.MaxOperands-1:
		c := *a
		c.kind, c.dst, c.chans = opReduceSendPackets, cat(a.dst, b.dst), catc(a.chans, b.chans)
		return &c
	}
	return nil
}

// needSync says whether a block barrier (nop) must separate a from b: all
// threads of a block share data ops, thread i alone does signal i or waits
// on channel i, so data must be complete before a signal, and a wait before
// the data it guards. Data ops on disjoint chunks need none.
func (l layout) needSync(a, b *op) bool {
	switch {
	case a == nil || b == nil:
		return false
	case a.kind == opNop || b.kind == opNop || a.kind == opBarrier || b.kind == opBarrier:
		return false // a grid barrier synchronises the block itself
	case a.kind == opSignal:
		return false // a signal neither reads nor writes data
	case a.kind == opWait && b.kind == opWait:
		return false
	case isData(a.kind) && isData(b.kind):
		return l.conflict(a, b)
	}
	return true
}

// conflict: a and b touch a common chunk and one of them writes it.
func (l layout) conflict(a, b *op) bool {
	type span struct {
		rank   int
		buf    BufKind
		lo, hi int
		write  bool
	}
	spans := func(o *op) []span {
		var out []span
		for i, list := range [][]ref{o.src, o.dst} {
			for _, r := range list {
				buf, lo := l.canon(r.c.Rank, r.c.Buf, r.c.Index)
				out = append(out, span{r.c.Rank, buf, lo, lo + r.c.Size, i == 1})
			}
		}
		return out
	}
	for _, x := range spans(a) {
		for _, y := range spans(b) {
			if x.rank == y.rank && x.buf == y.buf && x.lo < y.hi && y.lo < x.hi && (x.write || y.write) {
				return true
			}
		}
	}
	return false
}

func firstOf(o *op) *op {
	if o.kind == opPipeline && len(o.body) > 0 {
		return o.body[0]
	}
	return o
}

func lastOf(o *op) *op {
	if o.kind == opPipeline && len(o.body) > 0 {
		return o.body[len(o.body)-1]
	}
	return o
}

// withNops inserts block barriers where needSync says, in pipeline bodies
// too, with one at the end of a body whose last op must finish before its
// first runs again.
func (l layout) withNops(list []*op) []*op {
	var out []*op
	for _, o := range list {
		if o.kind == opPipeline {
			c := *o
			c.body = l.withNops(o.body)
			if l.needSync(lastOf(&c), firstOf(&c)) {
				c.body = append(c.body, &op{kind: opNop, rank: o.rank, tb: o.tb})
			}
			o = &c
		}
		if len(out) > 0 && l.needSync(lastOf(out[len(out)-1]), firstOf(o)) {
			out = append(out, &op{kind: opNop, rank: o.rank, tb: o.tb})
		}
		out = append(out, o)
	}
	return out
}

// ---------------------------------------------------------------------------
// JSON, in the MSCCL++ execution-plan format.

var jsonNames = map[opKind]string{
	opNop: "nop", opPut: "put", opGet: "get", opCopy: "copy", opReduce: "re", opReduceSend: "res", opReadReduce: "rre",
	opReadReduceSend: "rres", opPutPackets: "ppkt", opReadPutPackets: "rppkt", opCopyPackets: "cpkt",
	opUnpackPackets: "upkt", opReducePackets: "repkt", opReduceSendPackets: "respkt", opFlush: "flush",
	opPutSignal: "pws", opPutSignalFlush: "pwsf", opBarrier: "barrier", opSemAcquire: "sem_acquire",
	opSemRelease: "sem_release", opPipeline: "pipeline",
}

// gpuTables numbers one rank's channels and remote buffers as the format
// wants them: channels by position among the rank's channels of their
// type, remote buffers by first use.
type gpuTables struct {
	chanIdx map[*Channel]int
	remote  map[[2]int]int // (owner, buffer) -> index
	remotes []plan.RemoteBuffer
}

// numbering gives values indices in the order they are first seen.
type numbering struct {
	list []int
	pos  map[int]int
}

func (n *numbering) index(v int) int {
	if n.pos == nil {
		n.pos = map[int]int{}
	}
	i, ok := n.pos[v]
	if !ok {
		i = len(n.list)
		n.pos[v] = i
		n.list = append(n.list, v)
	}
	return i
}

// tbTables numbers a threadblock's channels and remote buffers per type
// (GPU-level indices in the order the block first uses them).
type tbTables struct {
	chans [2]numbering
	rbs   [2]numbering
}

func (t *tbTables) channel(g *gpuTables, c *Channel) int {
	return t.chans[c.Type].index(g.chanIdx[c])
}

func (t *tbTables) remoteBuf(g *gpuTables, c *Channel, owner int, b BufKind) int {
	key := [2]int{owner, int(b)}
	gi, ok := g.remote[key]
	if !ok {
		gi = len(g.remotes)
		g.remote[key] = gi
		g.remotes = append(g.remotes, plan.RemoteBuffer{Rank: owner, Type: b.json()})
	}
	ct := c.Type.String()
	if !containsStr(g.remotes[gi].AccessChannelTypes, ct) {
		g.remotes[gi].AccessChannelTypes = append(g.remotes[gi].AccessChannelTypes, ct)
	}
	return t.rbs[c.Type].index(gi)
}

func containsChan(list []*Channel, c *Channel) bool {
	for _, x := range list {
		if x == c {
			return true
		}
	}
	return false
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (p *Program) emit(x *expanded) ([]byte, error) {
	l := layout{inPlace: p.cfg.InPlace, in: x.in, out: x.out}
	scratch := 0
	for r := range x.tbs {
		for _, ops := range x.tbs[r] {
			for _, o := range ops {
				for _, b := range append([]*op{o}, o.body...) {
					for _, list := range [][]ref{b.src, b.dst} {
						for _, rf := range list {
							if rf.c.Buf == Scratch {
								scratch = max(scratch, rf.c.Index+rf.c.Size)
							}
						}
					}
				}
			}
		}
	}
	out := plan.Plan{
		Name: p.cfg.Name, Collective: p.cfg.Collective, Protocol: p.cfg.Protocol, InPlace: p.cfg.InPlace,
		UseDoubleScratchBuffer: p.cfg.Protocol == LL, BufferAlignment: p.cfg.Alignment,
		NumThreadsPerBlock: p.cfg.ThreadsPerBlock, MinMessageSize: p.cfg.MinMessageSize, MaxMessageSize: p.cfg.MaxMessageSize,
	}
	for r := range x.tbs {
		if len(x.sems[r]) > plan.MaxSemaphores {
			return nil, fmt.Errorf("rank %d has %d semaphores after replication (at most %d)", r, len(x.sems[r]), plan.MaxSemaphores)
		}
		if x.nBar[r] > plan.MaxBarriers {
			return nil, fmt.Errorf("rank %d has %d barriers after replication (at most %d)", r, x.nBar[r], plan.MaxBarriers)
		}
		g := &gpuTables{chanIdx: map[*Channel]int{}, remote: map[[2]int]int{}}
		gpu := plan.GPU{ID: r, InputChunks: x.in, OutputChunks: x.out, ScratchChunks: scratch,
			Channels: []plan.GPUChannel{}, RemoteBuffers: []plan.RemoteBuffer{}, Semaphores: []plan.SemaphoreInit{}}
		var per [2][]int
		for _, c := range x.chans {
			if c.From == r {
				g.chanIdx[c] = len(per[c.Type])
				per[c.Type] = append(per[c.Type], c.To)
			}
		}
		for t, to := range per {
			if len(to) > 0 {
				gpu.Channels = append(gpu.Channels, plan.GPUChannel{ChannelType: ChanType(t).String(), ConnectedTo: to})
			}
		}
		for _, s := range x.sems[r] {
			gpu.Semaphores = append(gpu.Semaphores, plan.SemaphoreInit{InitValue: s.Init})
		}
		nTB := 1
		for tb := range x.tbs[r] {
			nTB = max(nTB, tb+1)
		}
		for tb := 0; tb < nTB; tb++ {
			ops := x.tbs[r][tb]
			if !p.cfg.NoFusion {
				ops = fuse(ops)
			}
			ops = l.withNops(ops)
			tt := &tbTables{}
			jtb := plan.Threadblock{ID: tb, Ops: []plan.Op{}, Channels: []plan.TBChannels{}, RemoteBufferRefs: []plan.RemoteBufRef{}}
			for _, o := range ops {
				jtb.Ops = append(jtb.Ops, p.jsonOp(o, g, tt))
			}
			for t := range tt.chans {
				if len(tt.chans[t].list) > plan.MaxChannelsPerBlock {
					return nil, fmt.Errorf("rank %d threadblock %d uses %d %s channels (at most %d)", r, tb, len(tt.chans[t].list), ChanType(t), plan.MaxChannelsPerBlock)
				}
				if len(tt.rbs[t].list) > plan.MaxChannelsPerBlock {
					return nil, fmt.Errorf("rank %d threadblock %d reaches %d remote buffers through %s channels (at most %d)", r, tb, len(tt.rbs[t].list), ChanType(t), plan.MaxChannelsPerBlock)
				}
				if len(tt.chans[t].list) > 0 {
					jtb.Channels = append(jtb.Channels, plan.TBChannels{ChannelType: ChanType(t).String(), ChannelIDs: tt.chans[t].list})
				}
				if len(tt.rbs[t].list) > 0 {
					jtb.RemoteBufferRefs = append(jtb.RemoteBufferRefs, plan.RemoteBufRef{AccessChannelType: ChanType(t).String(), RemoteBufferIDs: tt.rbs[t].list})
				}
			}
			if n := flatCount(jtb.Ops); n > plan.MaxOpsPerBlock {
				return nil, fmt.Errorf("rank %d threadblock %d has %d operations with block barriers and pipelines flattened (at most %d): use more threadblocks", r, tb, n, plan.MaxOpsPerBlock)
			}
			gpu.Threadblocks = append(gpu.Threadblocks, jtb)
		}
		gpu.RemoteBuffers = append(gpu.RemoteBuffers, g.remotes...)
		out.GPUs = append(out.GPUs, gpu)
	}
	return json.MarshalIndent(out, "", " ")
}

func flatCount(ops []plan.Op) int {
	n := 0
	for _, o := range ops {
		n += 1 + len(o.Ops)
	}
	return n
}

func (p *Program) jsonOp(o *op, g *gpuTables, t *tbTables) plan.Op {
	j := plan.Op{Name: jsonNames[o.kind]}
	switch o.kind {
	case opSignal:
		j.Name = map[bool]string{true: "rlxsignal", false: "signal"}[o.relaxed]
	case opWait:
		j.Name = map[bool]string{true: "rlxwait", false: "wait"}[o.relaxed]
	case opBarrier:
		id, n := o.barrier.id, len(o.barrier.tbs)
		j.BarrierID, j.NumTBs = &id, &n
	case opSemAcquire, opSemRelease:
		j.SemaphoreIDs = []int{o.sem.id}
	case opPipeline:
		j.IterContext = &plan.IterContext{UnitSize: o.unit, NumChunks: o.numChunks}
		for _, b := range o.body {
			j.Ops = append(j.Ops, p.jsonOp(b, g, t))
		}
		return j
	}
	chans := o.chans
	for _, list := range [][]ref{o.src, o.dst} {
		for _, r := range list {
			if r.ch != nil && !containsChan(chans, r.ch) {
				chans = append(chans, r.ch)
			}
		}
	}
	if len(chans) > 0 {
		j.ChannelType = chans[0].Type.String()
		for _, c := range chans {
			t.channel(g, c)
		}
		// Memory data ops reach peers through remote buffers; the block
		// still lists the channels (as upstream's DSL does). Ops that act
		// on channels name them, thread i using channel i.
		if len(o.chans) > 0 && (!isData(o.kind) || o.chans[0].Type == Port) {
			for _, c := range o.chans {
				j.ChannelIDs = append(j.ChannelIDs, t.channel(g, c))
			}
		}
	}
	conv := func(list []ref) []plan.BufRef {
		var out []plan.BufRef
		for _, r := range list {
			if r.ch == nil {
				out = append(out, plan.BufRef{Type: r.c.Buf.json(), Index: r.c.Index, Size: r.c.Size})
				continue
			}
			id := t.remoteBuf(g, r.ch, r.c.Rank, r.c.Buf)
			out = append(out, plan.BufRef{BufferID: &id, Index: r.c.Index, Size: r.c.Size})
		}
		return out
	}
	j.Src, j.Dst = conv(o.src), conv(o.dst)
	switch o.kind {
	case opReduce, opReduceSend, opReadReduce, opReadReduceSend, opReducePackets, opReduceSendPackets:
		j.ReduceOp = p.cfg.Reduce.String()
	}
	return j
}
