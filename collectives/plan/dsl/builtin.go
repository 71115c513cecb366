package dsl

import (
	"fmt"
	"sort"
)

// Options shape a builtin program.
type Options struct {
	Ranks     int
	Instances int // 0: the builtin's DefaultInstances
	InPlace   bool
}

// Builtin is one of the library's programs.
type Builtin struct {
	Name       string
	Collective string
	Protocol   string
	// Instances is the default replication: enough threadblocks per rank
	// for large messages, and at most about 16 per rank so that 8 ranks
	// sharing one GPU keep every block resident (blocks spin on each
	// other). A negative value -k means k blocks per rank in all: k/(W-1)
	// instances of a program with one block per peer. Alltoall keeps 1:
	// its blocks must stay whole chunks, so more instances would raise the
	// size granularity.
	Instances int
	Doc       string
	build     func(p *Program)
}

var builtins = []Builtin{
	{"allreduce-allpairs-packet", AllReduce, LL, 1,
		"one shot: every rank writes its whole input as LL packets into every peer's scratch and reduces all of it locally; no signals (small messages)",
		buildAllReducePackets},
	{"allreduce-packet-rs-ag", AllReduce, LL, 4,
		"two steps in LL packets: every rank sends chunk q to rank q's scratch, rank r reduces chunk r and sends the result back as packets (reduce-send-packets), then unpacks the others",
		buildAllReducePacketsRSAG},
	{"allreduce-rs-ag", AllReduce, Simple, 8,
		"two steps in one op per rank: rank r reads chunk r of every peer, reduces, and writes the result into every peer (read-reduce-send)",
		buildAllReduceRSAG},
	{"allreduce-ring", AllReduce, Simple, 4,
		"ring: Ranks-1 reduce-scatter steps through the next rank's scratch, then Ranks-1 allgather steps; two threadblocks joined by a semaphore",
		buildAllReduceRing},
	{"allgather-fullmesh", AllGather, Simple, -16,
		"every rank puts its input into every peer's output, one threadblock per peer",
		buildAllGather},
	{"reducescatter-allpairs", ReduceScatter, Simple, 8,
		"rank r reads chunk r of every peer's input and reduces it into its output (read-reduce)",
		buildReduceScatter},
	{"alltoall-fullmesh", AllToAll, Simple, 1,
		"every rank puts block q of its input into rank q's output (in place: through the peer's scratch), one threadblock per peer",
		buildAllToAll},
	{"broadcast-fullmesh", Broadcast, Simple, -16,
		"rank 0 puts its input into every peer's output, one threadblock per peer",
		buildBroadcast},
	{"sendrecv-ring", SendRecv, Simple, 1,
		"rank r sends its input to rank r+1 through a port channel (put with signal and flush; in place: through scratch)",
		buildSendRecv},
}

// Builtins lists the library's programs.
func Builtins() []Builtin { return append([]Builtin(nil), builtins...) }

// BuiltinNames lists the builtins' names, sorted.
func BuiltinNames() []string {
	var out []string
	for _, b := range builtins {
		out = append(out, b.Name)
	}
	sort.Strings(out)
	return out
}

// Build records builtin name for o.
func Build(name string, o Options) (*Program, error) {
	for _, b := range builtins {
		if b.Name == name {
			return b.Program(o)
		}
	}
	return nil, fmt.Errorf("dsl: no builtin program %q (have %v)", name, BuiltinNames())
}

// DefaultInstances is the builtin's replication for ranks ranks.
func (b Builtin) DefaultInstances(ranks int) int {
	if b.Instances >= 0 {
		return max(b.Instances, 1)
	}
	return min(8, max(1, -b.Instances/max(ranks-1, 1)))
}

// Program records the builtin for o.
func (b Builtin) Program(o Options) (*Program, error) {
	if o.Ranks < 2 {
		return nil, fmt.Errorf("dsl: %s: %d ranks (want at least 2)", b.Name, o.Ranks)
	}
	if o.Instances == 0 {
		o.Instances = b.DefaultInstances(o.Ranks)
	}
	p, err := New(Config{Name: b.Name, Collective: b.Collective, Ranks: o.Ranks, Protocol: b.Protocol,
		Instances: o.Instances, InPlace: o.InPlace})
	if err != nil {
		return nil, err
	}
	b.build(p)
	return p, nil
}

// pairChannels creates a channel from a to b and its partner from b to a
// (created together, they get the same tag and so pair up).
func (p *Program) pairChannels(t ChanType, a, b int) (ab, ba *Channel) {
	return p.channel(t, a, b), p.channel(t, b, a)
}

// mesh creates one channel pair of type t between every two ranks:
// ch[r][q] leads from r to q.
func (p *Program) mesh(t ChanType) [][]*Channel {
	W := p.Ranks()
	ch := make([][]*Channel, W)
	for r := range ch {
		ch[r] = make([]*Channel, W)
	}
	for r := 0; r < W; r++ {
		for q := r + 1; q < W; q++ {
			ch[r][q], ch[q][r] = p.pairChannels(t, r, q)
		}
	}
	return ch
}

// peerIndex numbers rank q among r's peers (0..W-2).
func peerIndex(r, q int) int {
	if q < r {
		return q
	}
	return q - 1
}

func peers(W, r int) []int {
	var out []int
	for q := 0; q < W; q++ {
		if q != r {
			out = append(out, q)
		}
	}
	return out
}

// handshake: rank r tells every peer it has started (its buffers may be
// written and read) and waits for them to say the same, on threadblock tb.
func (p *Program) handshake(tb, r int, chans ...*Channel) {
	for _, c := range chans {
		p.RelaxedSignal(tb, c)
	}
	for _, c := range chans {
		p.RelaxedWait(tb, c)
	}
}

// finish: rank r signals every peer it is done with their buffers and
// waits for them, so that no rank returns while a peer still reads or
// writes its buffers.
func (p *Program) finish(tb, r int, chans ...*Channel) {
	for _, c := range chans {
		p.Signal(tb, c)
	}
	for _, c := range chans {
		p.Wait(tb, c)
	}
}

func buildAllReducePackets(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	// Rank q's packets of chunk k land in r's scratch chunk
	// peerIndex(r, q)*W + k.
	slot := func(r, q, k int) int { return peerIndex(r, q)*W + k }
	for r := 0; r < W; r++ {
		for k := 0; k < W; k++ {
			for _, q := range peers(W, r) {
				p.PutPackets(k, ch[r][q], p.Scratch(q, slot(q, r, k), 1), p.Input(r, k, 1))
			}
			var pk []Chunk
			for _, q := range peers(W, r) {
				pk = append(pk, p.Scratch(r, slot(r, q, k), 1))
			}
			p.ReducePackets(r, k, p.Output(r, k, 1), p.Input(r, k, 1), pk...)
		}
	}
}

func buildAllReducePacketsRSAG(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	// Scratch of rank r: chunk peerIndex(r, q) holds q's part of chunk r;
	// chunk W-1+peerIndex(r, q) holds chunk q reduced by q.
	for r := 0; r < W; r++ {
		for _, q := range peers(W, r) {
			p.PutPackets(0, ch[r][q], p.Scratch(q, peerIndex(q, r), 1), p.Input(r, q, 1))
		}
		var pk []Chunk
		for _, q := range peers(W, r) {
			pk = append(pk, p.Scratch(r, peerIndex(r, q), 1))
		}
		p.ReducePackets(r, 0, p.Output(r, r, 1), p.Input(r, r, 1), pk...)
		for _, q := range peers(W, r) {
			p.PutPackets(0, ch[r][q], p.Scratch(q, W-1+peerIndex(q, r), 1), p.Output(r, r, 1))
		}
		for _, q := range peers(W, r) {
			p.UnpackPackets(r, 0, p.Output(r, q, 1), p.Scratch(r, W-1+peerIndex(r, q), 1))
		}
	}
}

func buildAllReduceRSAG(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	for r := 0; r < W; r++ {
		var mine []*Channel
		for _, q := range peers(W, r) {
			mine = append(mine, ch[r][q])
		}
		p.handshake(0, r, mine...)
		var remote []Remote
		for _, q := range peers(W, r) {
			remote = append(remote, Remote{ch[r][q], p.Input(q, r, 1)})
		}
		p.ReadReduce(r, 0, p.Output(r, r, 1), p.Input(r, r, 1), remote...)
		for _, q := range peers(W, r) {
			p.Put(0, ch[r][q], p.Output(q, r, 1), p.Output(r, r, 1))
		}
		p.finish(0, r, mine...)
	}
}

func buildAllReduceRing(p *Program) {
	W := p.Ranks()
	mod := func(x int) int { return ((x % W) + W) % W }
	// send[i][r] leads from r to r+1; recv[i][r] from r to r-1 is the
	// partner of send[i][r-1]: r waits on it for r-1's signals. Set 0 is
	// for the reduce-scatter (threadblock 0), set 1 for the allgather
	// (threadblock 1).
	var send, recv [2][]*Channel
	for i := range send {
		send[i], recv[i] = make([]*Channel, W), make([]*Channel, W)
		for r := 0; r < W; r++ {
			send[i][r], recv[i][mod(r+1)] = p.pairChannels(Memory, r, mod(r+1))
		}
	}
	for r := 0; r < W; r++ {
		n := mod(r + 1)
		sem := p.NewSemaphore(r, 0)
		// Reduce-scatter: at step s, r sends chunk r-s (its input, then
		// its partial sum) into n's scratch chunk s and adds what r-1 sent
		// (chunk r-1-s) to its own input, into its output.
		p.Put(0, send[0][r], p.Scratch(n, 0, 1), p.Input(r, r, 1))
		p.Signal(0, send[0][r])
		for s := 0; s < W-1; s++ {
			k := mod(r - 1 - s)
			p.Wait(0, recv[0][r])
			p.Reduce(r, 0, p.Output(r, k, 1), p.Input(r, k, 1), p.Scratch(r, s, 1))
			if s < W-2 {
				p.Put(0, send[0][r], p.Scratch(n, s+1, 1), p.Output(r, k, 1))
				p.Signal(0, send[0][r])
			}
		}
		// r now holds chunk r+1 reduced. Allgather: at step s it forwards
		// chunk r+1-s into n's output.
		p.Release(0, sem)
		p.Acquire(1, sem)
		for s := 0; s < W-1; s++ {
			k := mod(r + 1 - s)
			if s > 0 {
				p.Wait(1, recv[1][r])
			}
			p.Put(1, send[1][r], p.Output(n, k, 1), p.Output(r, k, 1))
			p.Signal(1, send[1][r])
		}
		p.Wait(1, recv[1][r])
	}
}

func buildAllGather(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	for r := 0; r < W; r++ {
		for _, q := range peers(W, r) {
			tb := peerIndex(r, q)
			p.handshake(tb, r, ch[r][q])
			p.Put(tb, ch[r][q], p.Output(q, r, 1), p.Input(r, 0, 1))
			p.finish(tb, r, ch[r][q])
		}
		if !p.cfg.InPlace {
			p.Copy(r, 0, p.Output(r, r, 1), p.Input(r, 0, 1))
		}
	}
}

func buildReduceScatter(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	for r := 0; r < W; r++ {
		var mine []*Channel
		var remote []Remote
		for _, q := range peers(W, r) {
			mine = append(mine, ch[r][q])
			remote = append(remote, Remote{ch[r][q], p.Input(q, r, 1)})
		}
		p.handshake(0, r, mine...)
		p.ReadReduce(r, 0, p.Output(r, 0, 1), p.Input(r, r, 1), remote...)
		p.finish(0, r, mine...)
	}
}

func buildAllToAll(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	for r := 0; r < W; r++ {
		for _, q := range peers(W, r) {
			tb := peerIndex(r, q)
			p.handshake(tb, r, ch[r][q])
			if p.cfg.InPlace {
				// q's block r cannot go straight into q's buffer: q is
				// still sending from it. It waits in q's scratch.
				p.Put(tb, ch[r][q], p.Scratch(q, peerIndex(q, r), 1), p.Input(r, q, 1))
				p.Signal(tb, ch[r][q])
				p.Wait(tb, ch[r][q])
				p.Copy(r, tb, p.Output(r, q, 1), p.Scratch(r, peerIndex(r, q), 1))
				continue
			}
			p.Put(tb, ch[r][q], p.Output(q, r, 1), p.Input(r, q, 1))
			p.finish(tb, r, ch[r][q])
		}
		if !p.cfg.InPlace {
			p.Copy(r, 0, p.Output(r, r, 1), p.Input(r, r, 1))
		}
	}
}

func buildSendRecv(p *Program) {
	W := p.Ranks()
	mod := func(x int) int { return ((x % W) + W) % W }
	send, recv := make([]*Channel, W), make([]*Channel, W)
	for r := 0; r < W; r++ {
		send[r], recv[mod(r+1)] = p.pairChannels(Port, r, mod(r+1))
	}
	for r := 0; r < W; r++ {
		n := mod(r + 1)
		p.Signal(0, recv[r]) // ready to receive from r-1
		p.Wait(0, send[r])   // r+1 is ready
		if p.cfg.InPlace {
			p.PutWithSignalAndFlush(0, send[r], p.Scratch(n, 0, 1), p.Input(r, 0, 1))
			p.Wait(0, recv[r])
			p.Copy(r, 0, p.Output(r, 0, 1), p.Scratch(r, 0, 1))
			continue
		}
		p.PutWithSignalAndFlush(0, send[r], p.Output(n, 0, 1), p.Input(r, 0, 1))
		p.Wait(0, recv[r])
	}
}

func buildBroadcast(p *Program) {
	W := p.Ranks()
	ch := p.mesh(Memory)
	for _, q := range peers(W, 0) {
		tb := peerIndex(0, q)
		p.handshake(tb, 0, ch[0][q])
		p.Put(tb, ch[0][q], p.Output(q, 0, 1), p.Input(0, 0, 1))
		p.finish(tb, 0, ch[0][q])
		// The peer's side: the same handshake, then it waits for the data.
		p.handshake(0, q, ch[q][0])
		p.finish(0, q, ch[q][0])
	}
	if !p.cfg.InPlace {
		p.Copy(0, 0, p.Output(0, 0, 1), p.Input(0, 0, 1))
	}
}
