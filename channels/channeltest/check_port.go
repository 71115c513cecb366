package channeltest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// The data the port kernels generate (port_kernels.cu: goep_port_seed,
// goep_port_byte, goep_port_add_value), computed here from the kernel's
// definitions rather than taken from the host twins (package channels),
// which these checks judge.
func portWantSeed(seed, rank, i uint32) uint32 {
	return seed ^ 0x27d4eb2f ^ rank*0x9e3779b9 ^ i*0x85ebca6b
}

func portWantByte(s uint32, j uint64) byte {
	var w [4]byte
	binary.LittleEndian.PutUint32(w[:], kernels.PatternValue(j/4, s))
	return w[j%4]
}

func portWantAdd(s uint32, i uint64) uint64 {
	var w [8]byte
	binary.LittleEndian.PutUint32(w[:], kernels.PatternValue(2*i, s))
	binary.LittleEndian.PutUint32(w[4:], kernels.PatternValue(2*i+1, s))
	return binary.LittleEndian.Uint64(w[:])
}

// portTag pairs the port channel meshes of the checks, apart from the
// memory channel mesh (tag 0).
const portTag = 1 << 20

// EnsurePort builds, once, this rank's proxy and a port channel to every
// other rank over the data buffer (handles uploaded in rank order, this
// rank's slot zero), and starts the proxy. Collective.
func (r *Rank) EnsurePort(ctx context.Context) error {
	return r.EnsurePortWith(ctx, channels.ProxyConfig{})
}

// EnsurePortWith is EnsurePort with the proxy built from cfg (when this
// call builds it).
func (r *Rank) EnsurePortWith(ctx context.Context, cfg channels.ProxyConfig) error {
	if r.Proxy != nil || r.n < 2 {
		return nil
	}
	p, err := r.Comm.NewProxy(cfg)
	if err != nil {
		return err
	}
	r.Proxy = p
	if r.PortMesh, err = p.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: portTag, Local: r.Mem}); err != nil {
		return err
	}
	r.PortByRank = r.PortMesh.ByRank(r.n)
	if r.PortHandles, err = r.Comm.UploadPortChannels(r.PortByRank); err != nil {
		return err
	}
	return p.Start()
}

// portRound is one round of CheckPortStream, the same on every rank.
type portRound struct {
	size, srcOff, dstOff, flavour uint32
}

// portPlan draws rounds sizes log-uniformly in [1, maxBytes], offsets in
// [0, maxOffset) and one of the four put/signal/flush flavours.
func portPlan(seed uint64, rounds, maxBytes int) []portRound {
	rng := rand.New(rand.NewPCG(seed, 0x706f7274))
	out := make([]portRound, rounds)
	for i := range out {
		size := int(math.Exp(rng.Float64() * math.Log(float64(maxBytes))))
		out[i] = portRound{size: uint32(min(max(size, 1), maxBytes)), srcOff: uint32(rng.IntN(maxOffset)),
			dstOff: uint32(rng.IntN(maxOffset)), flavour: uint32(rng.IntN(4))}
	}
	return out
}

// CheckPortStream sends rounds transfers of random sizes (1 B..maxBytes,
// random offsets) over a ring of port channels, in one kernel per rank:
// each round the block writes a pattern unique to (sender, round), thread 0
// puts it to the next rank with one of put_with_signal, put + signal,
// put_with_signal_and_flush or two puts + signal, and waits for the
// previous rank's signal; the block checks every byte the previous rank
// sent (a signal that overtook its data shows as wrong bytes), then the
// ranks acknowledge each other before buffers are reused. Afterwards the
// host compares the last round's bytes with the pattern computed in Go, and
// every signal that arrived was consumed exactly once.
func (r *Rank) CheckPortStream(ctx context.Context, seed uint64, rounds, maxBytes int) error {
	if r.n < 2 {
		return nil
	}
	if maxBytes+maxOffset > r.Layout.Region {
		return r.errorf("port stream of up to %d bytes does not fit the %d-byte region", maxBytes, r.Layout.Region)
	}
	if err := r.EnsurePort(ctx); err != nil {
		return err
	}
	plan := portPlan(seed, rounds, maxBytes)
	words := make([]byte, 16*len(plan))
	for i, p := range plan {
		for k, v := range []uint32{p.size, p.srcOff, p.dstOff, p.flavour} {
			binary.LittleEndian.PutUint32(words[16*i+4*k:], v)
		}
	}
	pb, err := r.Dev.Alloc(len(words))
	if err != nil {
		return err
	}
	defer r.Dev.Free(pb)
	if err := r.Dev.CopyIn(pb.Ptr, words); err != nil {
		return err
	}
	if err := r.clearOut(4); err != nil {
		return err
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	to, from := r.ring(1)
	pseed := uint32(seed)
	args := device.NewArgs(12).Ptr(r.PortHandles.Ptr()).U32(uint32(to)).U32(uint32(from)).U32(uint32(r.me)).
		Ptr(r.Buf.Ptr).Ptr(pb.Ptr).U32(uint32(rounds)).U32(pseed).U64(0).U64(uint64(r.Layout.dst())).U32(12).Ptr(r.out.Ptr)
	if err := r.launch(devapi.KernelPortStream, 1, 1024, args); err != nil {
		return err
	}
	if err := r.sync(); err != nil {
		return r.errorf("port stream: %w", err)
	}
	out, err := r.readOut(4)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("port stream rank %d -> rank %d -> rank %d", from, r.me, to)
	if out[0] != 0 || out[1] != uint64(rounds) || out[2] != 0 {
		return r.errorf("%s: %d wrong bytes, %d of %d rounds, gave up %d", what, out[0], out[1], rounds, out[2])
	}
	last := plan[len(plan)-1]
	got := make([]byte, last.size)
	if err := r.Dev.CopyOut(got, r.Buf.Ptr+uintptr(r.Layout.dst())+uintptr(last.dstOff)); err != nil {
		return err
	}
	theirs := portWantSeed(pseed, uint32(from), uint32(len(plan)-1))
	for j, b := range got {
		if want := portWantByte(theirs, uint64(j)); b != want {
			return r.errorf("%s: last round, byte %d of %d is %#02x, want %#02x", what, j, len(got), b, want)
		}
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	for _, p := range []int{to, from} {
		if err := r.portBalanced(p); err != nil {
			return err
		}
	}
	return r.barrier(ctx)
}

// portBalanced checks that every signal that reached this rank on its port
// channel to peer was consumed exactly once.
func (r *Rank) portBalanced(peer int) error {
	sem := r.PortByRank[peer].Semaphore()
	in, err := sem.Inbound()
	if err != nil {
		return err
	}
	exp, err := sem.Expected()
	if err != nil {
		return err
	}
	if in != exp {
		return r.errorf("port channel from rank %d: %d signals arrived but %d were consumed", peer, in, exp)
	}
	return nil
}

// portCounters is how many counters CheckPortAtomics spreads adds over.
const portCounters = 4

// CheckPortAtomics has every thread of a grid on every rank push atomic
// adds (adds per rank in all, random 64-bit values, spread round-robin
// over the other ranks and over portCounters counters each), then flushes
// every channel; each rank then compares its counters with the sums
// computed in Go from every sender's values.
func (r *Rank) CheckPortAtomics(ctx context.Context, seed uint64, adds, grid int) error {
	if r.n < 2 {
		return nil
	}
	if err := r.EnsurePort(ctx); err != nil {
		return err
	}
	ctrOff := r.Layout.dst()
	if err := r.Dev.CopyIn(r.Buf.Ptr+uintptr(ctrOff), make([]byte, 8*portCounters)); err != nil {
		return err
	}
	if err := r.clearOut(2); err != nil {
		return err
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	pseed := uint32(seed >> 32)
	args := device.NewArgs(9).Ptr(r.PortHandles.Ptr()).U32(uint32(r.n)).U32(uint32(r.me)).U64(uint64(adds)).
		U64(uint64(ctrOff)).U32(portCounters).U32(pseed).U32(13).Ptr(r.out.Ptr)
	if err := r.launch(devapi.KernelPortAtomicStorm, r.spinGrid(grid), 256, args); err != nil {
		return err
	}
	// Stream order: the flushes are pushed after every add.
	flush := device.NewArgs(4).Ptr(r.PortHandles.Ptr()).U32(uint32(r.n)).U32(14).Ptr(r.out.Ptr + 8)
	if err := r.launch(devapi.KernelPortFlushAll, 1, max(32, (r.n+31)/32*32), flush); err != nil {
		return err
	}
	if err := r.sync(); err != nil {
		return r.errorf("atomic adds: %w", err)
	}
	out, err := r.readOut(2)
	if err != nil {
		return err
	}
	if out[0] != 0 || out[1] != 0 {
		return r.errorf("atomic adds: %d threads gave up pushing, %d flushes gave up", out[0], out[1])
	}
	// Every rank's adds have landed once every rank's flushes returned.
	if err := r.barrier(ctx); err != nil {
		return err
	}
	want := make([]uint64, portCounters)
	for s := 0; s < r.n; s++ {
		if s == r.me {
			continue
		}
		ss := portWantSeed(pseed, uint32(s), 0)
		for i := uint64(0); i < uint64(adds); i++ {
			if (s+1+int(i%uint64(r.n-1)))%r.n == r.me {
				want[(i/uint64(r.n-1))%portCounters] += portWantAdd(ss, i)
			}
		}
	}
	b := make([]byte, 8*portCounters)
	if err := r.Dev.CopyOut(b, r.Buf.Ptr+uintptr(ctrOff)); err != nil {
		return err
	}
	for k := range want {
		if got := binary.LittleEndian.Uint64(b[8*k:]); got != want[k] {
			return r.errorf("atomic adds: counter %d is %#x, want %#x (the sum of %d ranks' adds)", k, got, want[k], r.n-1)
		}
	}
	return r.barrier(ctx)
}
