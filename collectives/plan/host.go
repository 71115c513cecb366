package plan

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PacketType is the LL packet layout of a launch (upstream's execute()
// argument). On the host both lay out payload words the same way
// ({data u32, flag u32} pairs; LL16 is two of them in 16 bytes), so the
// choice changes only how many words a reader checks together.
type PacketType uint8

const (
	LL16 PacketType = iota
	LL8
)

func (t PacketType) String() string {
	if t == LL8 {
		return "LL8"
	}
	return "LL16"
}

// HostConfig tunes the host interpreter.
type HostConfig struct {
	// Timeout bounds every wait (signal, packet, barrier, semaphore,
	// flush, FIFO slot, rendezvous); 0 means 30s. On expiry the launch
	// fails with an error naming rank, threadblock, op and what it waited
	// for, and every other block of the launch stops.
	Timeout time.Duration
	Packet  PacketType
}

// HostWorld runs one plan for one message size and in-place mode on host
// memory: every rank's threadblocks run as goroutines, concurrently, each
// doing its ops in order; memory channels are direct access to the peers'
// buffers; port channels go through one proxy goroutine per rank that
// takes 16-byte-trigger-like requests from a bounded FIFO in order;
// semaphores are monotonic counters. Scratch buffers, the launch counter
// (the LL flag) and nothing else persist across launches.
//
// It is a reference: it follows the plan's synchronization exactly (a
// missing signal is a timeout, stale packets are never mistaken for fresh
// ones) but not the GPU memory model; a plan that races on data gives
// wrong results here (and the race detector says so) rather than an error.
type HostWorld struct {
	plan  *Plan
	cfg   HostConfig
	res   []*Resolved
	ranks []*hostRank
	pairs [][2][]int // [rank][memory, port][channel] -> peer's channel index, -1 when unpaired

	runMu  sync.Mutex // one launch at a time
	launch uint32     // launches so far; the LL flag of launch n is n

	rv rendezvous
}

// NewHostWorld resolves every rank of p for msgBytes (see Plan.SizesFor)
// and allocates the scratch buffers. world must be the plan's world size.
func NewHostWorld(p *Plan, world int, msgBytes uint64, inPlace bool, cfg HostConfig) (*HostWorld, error) {
	if p == nil {
		return nil, errors.New("plan: NewHostWorld: nil plan")
	}
	if err := p.CheckWorld(world); err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	w := &HostWorld{plan: p, cfg: cfg}
	for r := 0; r < world; r++ {
		res, err := Resolve(p, r, msgBytes, inPlace)
		if err != nil {
			return nil, err
		}
		if err := refuseSwitch(p, res); err != nil {
			return nil, err
		}
		w.res = append(w.res, res)
		w.ranks = append(w.ranks, newHostRank(res))
	}
	w.pairs = make([][2][]int, world)
	for r, res := range w.res {
		for t, list := range [2][]Channel{res.MemoryChannels, res.PortChannels} {
			w.pairs[r][t] = make([]int, len(list))
			for i, c := range list {
				w.pairs[r][t][i] = findPair(w.res[c.Peer], t, r, c.Tag)
			}
		}
	}
	w.rv.init(world)
	return w, nil
}

// refuseSwitch rejects plans that need NVLink multicast.
func refuseSwitch(p *Plan, r *Resolved) error {
	if len(r.SwitchChannels) > 0 {
		return fmt.Errorf("%s: gpu %d has switch (NVLS multicast) channels: multicast plans are refused here", p.label(), r.Rank)
	}
	for _, b := range r.Blocks {
		for _, in := range b.Instrs {
			for _, x := range append([]Instr{in}, in.Body...) {
				if x.Code.Switch() {
					return fmt.Errorf("%s: gpu %d: threadblock %d: op %d (%s) needs NVLS multicast, which is refused here", p.label(), r.Rank, b.ID, x.OpIndex, x.Code)
				}
			}
		}
	}
	return nil
}

// findPair is the index, in peer's list of type t (0 memory, 1 port), of
// the tag-th channel to rank; -1 when there is none.
func findPair(peer *Resolved, t, rank, tag int) int {
	list := peer.MemoryChannels
	if t == 1 {
		list = peer.PortChannels
	}
	for i, c := range list {
		if c.Peer == rank && c.Tag == tag {
			return i
		}
	}
	return -1
}

// Resolved is rank's resolved plan.
func (w *HostWorld) Resolved(rank int) *Resolved {
	if w == nil || rank < 0 || rank >= len(w.res) {
		return nil
	}
	return w.res[rank]
}

// World is the number of ranks.
func (w *HostWorld) World() int {
	if w == nil {
		return 0
	}
	return len(w.res)
}

// Plan is the plan the world runs.
func (w *HostWorld) Plan() *Plan {
	if w == nil {
		return nil
	}
	return w.plan
}

// Run runs one launch on every rank: inputs[r] and outputs[r] are rank r's
// send and recv buffers (Resolved(r).InputBytes and OutputBytes long; in
// place, the input aliases the output as InPlaceInput says). dt is the
// element type of reductions.
func (w *HostWorld) Run(ctx context.Context, dt DataType, inputs, outputs [][]byte) error {
	if w == nil {
		return errNilWorld
	}
	if ctx == nil {
		return fmt.Errorf("%s: nil context", w.plan.label())
	}
	// A finished context launches nothing.
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("%s: not launched: %w", w.plan.label(), err)
	}
	if len(inputs) != len(w.res) || len(outputs) != len(w.res) {
		return fmt.Errorf("%s: %d inputs and %d outputs for %d ranks", w.plan.label(), len(inputs), len(outputs), len(w.res))
	}
	for r, res := range w.res {
		if uint64(len(inputs[r])) != res.InputBytes || uint64(len(outputs[r])) != res.OutputBytes {
			return fmt.Errorf("%s: rank %d: buffers of %d and %d bytes, the plan wants %d and %d", w.plan.label(), r,
				len(inputs[r]), len(outputs[r]), res.InputBytes, res.OutputBytes)
		}
	}
	w.runMu.Lock()
	defer w.runMu.Unlock()
	w.launch++
	l := &hostLaunch{w: w, dt: dt, flag: w.launch, in: inputs, out: outputs}
	return l.run(ctx)
}

// RunRank is Run for one rank, for callers that drive ranks from their own
// goroutines (a collectives.Communicator per rank): every rank calls it
// with its buffers, the last one to arrive runs the launch, and all get its
// result. A rank that does not arrive within the timeout fails the others.
func (w *HostWorld) RunRank(ctx context.Context, rank int, dt DataType, input, output []byte) error {
	if w == nil {
		return errNilWorld
	}
	if ctx == nil {
		return fmt.Errorf("%s: rank %d: nil context", w.plan.label(), rank)
	}
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("%s: rank %d: not launched: %w", w.plan.label(), rank, err)
	}
	return w.rv.join(ctx, w, rank, dt, input, output)
}

// InPlaceInput is the part of rank's output that is its input in an
// in-place call: the whole buffer when sizes match, else rank's piece.
func InPlaceInput(r *Resolved, output []byte) []byte {
	if r.InputBytes == r.OutputBytes {
		return output
	}
	if r.InputBytes < r.OutputBytes {
		at := uint64(r.Rank) * r.InputBytes
		return output[at : at+r.InputBytes]
	}
	return nil // reduce-scatter-like: the output lies in the input (InPlaceOutput)
}

// InPlaceOutput is the part of rank's input that is its output when the
// output is the smaller one (reduce-scatter in place).
func InPlaceOutput(r *Resolved, input []byte) []byte {
	if r.OutputBytes >= r.InputBytes {
		return input
	}
	at := uint64(r.Rank) * r.OutputBytes
	return input[at : at+r.OutputBytes]
}

var errNilWorld = errors.New("plan: nil HostWorld")

// rendezvous gathers the ranks of a RunRank launch.
type rendezvous struct {
	mu    sync.Mutex
	n     int
	cur   *gathering
	world int
}

type gathering struct {
	dt      DataType
	in, out [][]byte
	arrived int
	done    chan struct{}
	err     error
}

func (rv *rendezvous) init(world int) { rv.world = world }

func (rv *rendezvous) join(ctx context.Context, w *HostWorld, rank int, dt DataType, in, out []byte) error {
	if rank < 0 || rank >= rv.world {
		return fmt.Errorf("%s: rank %d out of range", w.plan.label(), rank)
	}
	rv.mu.Lock()
	g := rv.cur
	if g == nil {
		g = &gathering{dt: dt, in: make([][]byte, rv.world), out: make([][]byte, rv.world), done: make(chan struct{})}
		rv.cur = g
	}
	if g.out[rank] != nil {
		rv.mu.Unlock()
		return fmt.Errorf("%s: rank %d joined the same launch twice", w.plan.label(), rank)
	}
	g.in[rank], g.out[rank] = in, out
	if g.dt != dt {
		g.err = fmt.Errorf("%s: ranks disagree on the data type (%s, %s)", w.plan.label(), g.dt, dt)
	}
	g.arrived++
	last := g.arrived == rv.world
	if last {
		rv.cur = nil
	}
	rv.mu.Unlock()
	if last {
		if g.err == nil {
			g.err = w.Run(ctx, dt, g.in, g.out)
		}
		close(g.done)
		return g.err
	}
	t := time.NewTimer(w.cfg.Timeout)
	defer t.Stop()
	select {
	case <-g.done:
		return g.err
	case <-ctx.Done():
		// This rank leaves the gathering: the launch can no longer start
		// with it, and the others time out naming it.
		rv.mu.Lock()
		if rv.cur == g && g.out[rank] != nil {
			g.in[rank], g.out[rank] = nil, nil
			g.arrived--
		}
		rv.mu.Unlock()
		return fmt.Errorf("%s: rank %d: %w", w.plan.label(), rank, context.Cause(ctx))
	case <-t.C:
		rv.mu.Lock()
		defer rv.mu.Unlock()
		var missing []int
		for r, b := range g.out {
			if b == nil {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			if rv.cur == g {
				rv.cur = nil
			}
			return fmt.Errorf("%s: rank %d waited %s for ranks %v to start the launch: %w", w.plan.label(), rank, w.cfg.Timeout, missing, ErrTimeout)
		}
		rv.mu.Unlock()
		<-g.done // every rank is in: the launch itself is bounded
		rv.mu.Lock()
		return g.err
	}
}
