package dsl

import (
	"fmt"
	"sort"
	"strings"
)

// The dependency check: a happens-before graph of every operation of every
// rank (semantics in doc.go), then every pair of accesses to one chunk of
// which one writes must be ordered by it. Threads of the graph are the
// threadblocks and, for port channels, one proxy per (threadblock,
// channel): the proxy carries out the threadblock's puts in order, later
// than the threadblock issues them.

type access struct {
	rank   int
	buf    BufKind // canonical: in place, the aliased buffer is named once
	lo, hi int     // chunk range
	write  bool
	packet bool
	node   int
}

type node struct {
	thread int // -1: a join (barrier)
	pos    int // 1-based position on its thread
	preds  []int
	op     *op
	what   string // for errors: what the node does when it is not the op itself
}

type depGraph struct {
	layout
	p       *Program
	chans   []*Channel
	nodes   []node
	threads map[[3]int]int // (rank, tb, channel id or -1) -> thread
	last    []int          // thread -> last node, -1
	acc     []access
	signals map[*Channel][]int // signal-source nodes per channel
	waits   map[*Channel][]int
	sigTB   map[*Channel]int // the threadblock that signals (or waits on) a channel: one only
	waitTB  map[*Channel]int
	sems    map[*Semaphore][]int // release nodes
	acqs    []struct {
		sem  *Semaphore
		node int
	}
	groups map[*barrierGroup][2][]int // arrivals, departures
}

func (g *depGraph) thread(rank, tb, ch int) int {
	k := [3]int{rank, tb, ch}
	t, ok := g.threads[k]
	if !ok {
		t = len(g.last)
		g.threads[k] = t
		g.last = append(g.last, -1)
	}
	return t
}

// add appends a node on thread t after t's last node and extra preds.
func (g *depGraph) add(t int, o *op, what string, preds ...int) int {
	n := node{thread: t, op: o, what: what}
	if t >= 0 {
		if l := g.last[t]; l >= 0 {
			n.preds = append(n.preds, l)
			n.pos = g.nodes[l].pos + 1
		} else {
			n.pos = 1
		}
		g.last[t] = len(g.nodes)
	}
	for _, p := range preds {
		if p >= 0 {
			n.preds = append(n.preds, p)
		}
	}
	g.nodes = append(g.nodes, n)
	return len(g.nodes) - 1
}

func (g *depGraph) access(n int, r ref, write, packet bool) {
	buf, lo := g.canon(r.c.Rank, r.c.Buf, r.c.Index)
	g.acc = append(g.acc, access{rank: r.c.Rank, buf: buf, lo: lo, hi: lo + r.c.Size, write: write, packet: packet, node: n})
}

// checkDeps checks the replicated program (tbs: per rank, tb -> ops).
func (p *Program) checkDeps(tbs []map[int][]*op, chans []*Channel, in, out int) error {
	g := &depGraph{layout: layout{p.cfg.InPlace, in, out}, chans: chans, threads: map[[3]int]int{}, signals: map[*Channel][]int{}, waits: map[*Channel][]int{},
		sigTB: map[*Channel]int{}, waitTB: map[*Channel]int{}, sems: map[*Semaphore][]int{}, groups: map[*barrierGroup][2][]int{}}
	for r := range tbs {
		for _, tb := range sortedTBs(tbs[r]) {
			for _, o := range tbs[r][tb] {
				if o.kind == opPipeline {
					for _, b := range o.body {
						if err := g.build(b); err != nil {
							return err
						}
					}
					continue
				}
				if err := g.build(o); err != nil {
					return err
				}
			}
		}
	}
	if err := g.pair(); err != nil {
		return err
	}
	if err := g.packetEdges(); err != nil {
		return err
	}
	order, err := g.topo()
	if err != nil {
		return err
	}
	return g.races(order)
}

func sortedTBs(m map[int][]*op) []int {
	out := make([]int, 0, len(m))
	for tb := range m {
		out = append(out, tb)
	}
	sort.Ints(out)
	return out
}

// build adds an op's nodes and accesses.
func (g *depGraph) build(o *op) error {
	t := g.thread(o.rank, o.tb, -1)
	var ch *Channel
	if len(o.chans) > 0 {
		ch = o.chans[0]
	}
	oneTB := func(m map[*Channel]int, verb string) error {
		if tb, ok := m[ch]; ok && tb != o.tb {
			return fmt.Errorf("%s: %s is %s from threadblocks %d and %d of rank %d: the signals of a channel must come from one threadblock and its waits happen in one", o, ch, verb, tb, o.tb, o.rank)
		}
		m[ch] = o.tb
		return nil
	}
	switch o.kind {
	case opSignal:
		if err := oneTB(g.sigTB, "signalled"); err != nil {
			return err
		}
		n := g.add(t, o, "")
		if ch.Type == Port {
			n = g.add(g.thread(o.rank, o.tb, ch.id), o, "the proxy's signal", n)
		}
		g.signals[ch] = append(g.signals[ch], n)
	case opWait:
		if err := oneTB(g.waitTB, "waited on"); err != nil {
			return err
		}
		g.waits[ch] = append(g.waits[ch], g.add(t, o, ""))
	case opFlush:
		g.add(t, o, "", g.last[g.thread(o.rank, o.tb, ch.id)])
	case opBarrier:
		a := g.add(t, o, "")
		d := g.add(t, o, "")
		e := g.groups[o.barrier]
		e[0], e[1] = append(e[0], a), append(e[1], d)
		g.groups[o.barrier] = e
	case opSemRelease:
		g.sems[o.sem] = append(g.sems[o.sem], g.add(t, o, ""))
	case opSemAcquire:
		g.acqs = append(g.acqs, struct {
			sem  *Semaphore
			node int
		}{o.sem, g.add(t, o, "")})
	case opPut, opPutSignal, opPutSignalFlush, opPutPackets, opReadPutPackets:
		// Only rppkt waits for its source packets; ppkt's port form copies
		// the packet bytes as they are, so they must be complete before:
		// a plain read.
		packetIn := o.kind == opReadPutPackets
		packetOut := o.kind == opPutPackets || o.kind == opReadPutPackets
		issue := g.add(t, o, "")
		if ch.Type == Memory {
			g.access(issue, o.src[0], false, packetIn)
			g.access(issue, o.dst[0], true, packetOut)
			return nil
		}
		if o.kind == opReadPutPackets {
			g.access(issue, o.src[0], false, true) // the block waits for them
		}
		if o.kind == opPutSignal || o.kind == opPutSignalFlush {
			if err := oneTB(g.sigTB, "signalled"); err != nil {
				return err
			}
		}
		px := g.add(g.thread(o.rank, o.tb, ch.id), o, "the proxy's copy", issue)
		g.access(px, o.src[0], false, packetIn)
		g.access(px, o.dst[0], true, packetOut)
		if o.kind != opPut && o.kind != opPutPackets && o.kind != opReadPutPackets {
			g.signals[ch] = append(g.signals[ch], px)
		}
		if o.kind == opPutSignalFlush {
			g.add(t, o, "its flush", px)
		}
	default: // local or memory-channel data ops
		n := g.add(t, o, "")
		for i, r := range o.src {
			packet := o.kind == opUnpackPackets || o.kind == opReducePackets && i > 0
			g.access(n, r, false, packet)
		}
		for _, r := range o.dst {
			g.access(n, r, true, o.kind == opCopyPackets)
		}
	}
	return nil
}

func (g *depGraph) desc(n int) string {
	nd := &g.nodes[n]
	if nd.what != "" {
		return fmt.Sprintf("%s (%s)", nd.op, nd.what)
	}
	return nd.op.String()
}

// pair adds the signal -> wait, barrier and semaphore edges.
func (g *depGraph) pair() error {
	partner := map[[4]int]*Channel{}
	for _, ch := range g.chans {
		partner[[4]int{int(ch.Type), ch.From, ch.To, ch.Tag}] = ch
	}
	for _, ch := range g.chans {
		back := partner[[4]int{int(ch.Type), ch.To, ch.From, ch.Tag}]
		sigs, waits := g.signals[back], g.waits[ch]
		if back == nil {
			continue // refused earlier (unpaired channel)
		}
		if len(sigs) != len(waits) {
			var ex int
			if len(waits) > len(sigs) {
				ex = waits[len(sigs)]
			} else {
				ex = sigs[len(waits)]
			}
			return fmt.Errorf("%s: rank %d signals %s %d times, rank %d waits on %s %d times (each wait takes one signal, and a signal left over would let the next launch's wait pass early)",
				g.desc(ex), back.From, back, len(sigs), ch.From, ch, len(waits))
		}
		for i, w := range waits {
			// A relaxed signal takes its place in the count but publishes
			// no data: it orders nothing.
			if !g.nodes[sigs[i]].op.relaxed {
				g.nodes[w].preds = append(g.nodes[w].preds, sigs[i])
			}
		}
	}
	for grp, e := range g.groups {
		j := len(g.nodes)
		g.nodes = append(g.nodes, node{thread: -1, preds: append([]int(nil), e[0]...), op: grp.ops[0], what: "barrier"})
		for _, d := range e[1] {
			g.nodes[d].preds = append(g.nodes[d].preds, j)
		}
	}
	// Releases and acquires pair in recording order (instances, which
	// share it, by threadblock).
	bySeq := func(list []int) {
		sort.SliceStable(list, func(i, j int) bool {
			a, b := g.nodes[list[i]].op, g.nodes[list[j]].op
			return a.seq < b.seq || a.seq == b.seq && a.tb < b.tb
		})
	}
	for _, rel := range g.sems {
		bySeq(rel)
	}
	sort.SliceStable(g.acqs, func(i, j int) bool {
		a, b := g.nodes[g.acqs[i].node].op, g.nodes[g.acqs[j].node].op
		return a.seq < b.seq || a.seq == b.seq && a.tb < b.tb
	})
	used := map[*Semaphore]int{}
	for _, a := range g.acqs {
		k := used[a.sem]
		used[a.sem]++
		rel := g.sems[a.sem]
		switch {
		case int64(k) < a.sem.Init:
		case k-int(a.sem.Init) < len(rel):
			g.nodes[a.node].preds = append(g.nodes[a.node].preds, rel[k-int(a.sem.Init)])
		default:
			return fmt.Errorf("%s: acquire %d of semaphore %d of rank %d, which starts at %d and is released %d times: it would wait forever",
				g.desc(a.node), k+1, a.sem.id, a.sem.Rank, a.sem.Init, len(rel))
		}
	}
	return nil
}

type cellKey struct {
	rank int
	buf  BufKind
	i    int
}

// packetEdges orders packet reads after the packet write of their chunk.
func (g *depGraph) packetEdges() error {
	writer := map[cellKey]int{} // -> access index
	for ai, a := range g.acc {
		if !a.packet || !a.write {
			continue
		}
		for i := a.lo; i < a.hi; i++ {
			k := cellKey{a.rank, a.buf, i}
			if prev, ok := writer[k]; ok && g.acc[prev].node != a.node {
				return fmt.Errorf("%s and %s both write packets to rank %d %s chunk %d: a reader cannot tell them apart (packets of one launch carry one flag)",
					g.desc(g.acc[prev].node), g.desc(a.node), a.rank, a.buf, i)
			}
			writer[k] = ai
		}
	}
	for _, a := range g.acc {
		if !a.packet || a.write {
			continue
		}
		for i := a.lo; i < a.hi; i++ {
			w, ok := writer[cellKey{a.rank, a.buf, i}]
			if !ok {
				return fmt.Errorf("%s reads packets of rank %d %s chunk %d that no op writes: it would wait forever", g.desc(a.node), a.rank, a.buf, i)
			}
			g.nodes[a.node].preds = append(g.nodes[a.node].preds, g.acc[w].node)
		}
	}
	return nil
}

// topo orders the nodes; a cycle is a deadlock.
func (g *depGraph) topo() ([]int, error) {
	n := len(g.nodes)
	indeg := make([]int, n)
	succ := make([][]int, n)
	for i := range g.nodes {
		for _, p := range g.nodes[i].preds {
			succ[p] = append(succ[p], i)
			indeg[i]++
		}
	}
	var order, queue []int
	for i := range indeg {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		order = append(order, x)
		for _, s := range succ[x] {
			if indeg[s]--; indeg[s] == 0 {
				queue = append(queue, s)
			}
		}
	}
	if len(order) < n {
		var stuck []string
		for i := range indeg {
			if indeg[i] > 0 && g.nodes[i].thread >= 0 && len(stuck) < 4 {
				stuck = append(stuck, g.desc(i))
			}
		}
		return nil, fmt.Errorf("deadlock: these ops wait for each other in a cycle: %s", strings.Join(stuck, "; "))
	}
	return order, nil
}

// races finds pairs of accesses to one chunk, one a write, that no path of
// the graph orders.
func (g *depGraph) races(order []int) error {
	T := len(g.last)
	if int64(len(g.nodes))*int64(T) > 1<<26 {
		return fmt.Errorf("program too large to check: %d operations on %d threads", len(g.nodes), T)
	}
	vc := make([]int32, len(g.nodes)*T)
	for _, x := range order {
		row := vc[x*T : (x+1)*T]
		for _, p := range g.nodes[x].preds {
			prow := vc[p*T : (p+1)*T]
			for i := range row {
				row[i] = max(row[i], prow[i])
			}
		}
		if t := g.nodes[x].thread; t >= 0 {
			row[t] = int32(g.nodes[x].pos)
		}
	}
	hb := func(a, b int) bool {
		na := &g.nodes[a]
		return vc[b*T+na.thread] >= int32(na.pos)
	}
	cells := map[cellKey][]int{}
	for ai, a := range g.acc {
		for i := a.lo; i < a.hi; i++ {
			k := cellKey{a.rank, a.buf, i}
			cells[k] = append(cells[k], ai)
		}
	}
	keys := make([]cellKey, 0, len(cells))
	for k := range cells {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.rank != b.rank {
			return a.rank < b.rank
		}
		if a.buf != b.buf {
			return a.buf < b.buf
		}
		return a.i < b.i
	})
	for _, k := range keys {
		list := cells[k]
		for x := 0; x < len(list); x++ {
			a := &g.acc[list[x]]
			for y := x + 1; y < len(list); y++ {
				b := &g.acc[list[y]]
				if a.node == b.node || !a.write && !b.write {
					continue
				}
				if a.packet && b.packet && a.write != b.write {
					continue // ordered by the packets' flags
				}
				if hb(a.node, b.node) || hb(b.node, a.node) {
					continue
				}
				verb := func(x *access) string { return map[bool]string{true: "writes", false: "reads"}[x.write] }
				return fmt.Errorf("race on rank %d %s chunk %d: %s %s it and %s %s it with no synchronisation between",
					k.rank, k.buf, k.i, g.desc(a.node), verb(a), g.desc(b.node), verb(b))
			}
		}
	}
	return nil
}
