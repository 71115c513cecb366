package internode_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// Notify (the count exchange) on the host backend: goroutine ranks split
// into virtual nodes, so every cross-node count travels over port channels
// on the TCP transport, checked against ReferenceLayout and
// ReferenceDispatch.

// runNotifyRanks runs fn on the world of t's ranks, each with a
// communicator whose nodes are t's virtual nodes, and returns each rank's
// error. fn hands back what to close; no rank closes anything until every
// fn has returned (a peer's late write may still land in its memory).
func runNotifyRanks(t *testing.T, topo internode.Topology, wait time.Duration, fn func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error)) []error {
	t.Helper()
	return runNotifyRanksOn(t, hostBackend, topo, wait, fn)
}

// backend selects what runs a test's ranks: the host backend (Go twins),
// the CPU emulation of the real kernels, or CUDA GPUs (ranks spread over
// the GPUs present, several to a GPU when there are fewer GPUs).
type backend int

const (
	hostBackend backend = iota
	emuBackend
	cudaBackend
)

func (b backend) String() string { return [...]string{"host", "emu", "cuda"}[b] }

// wantNetTransport is the transport of the connections between virtual
// nodes on backend b: TCP, or with $GOEP_NET_TRANSPORT=ipc (the port over
// CUDA IPC, withPortOverIPC) the backend's own intra-host transport.
func wantNetTransport(b backend) channels.Transport {
	if t, err := channels.ParseTransport(os.Getenv(channels.NetTransportEnv)); err != nil || t != channels.TransportCudaIPC {
		return channels.TransportEthernet
	}
	if b == cudaBackend {
		return channels.TransportCudaIPC
	}
	return channels.TransportHostMemory // the CPU emulation's devices are host memory
}

// withPortOverIPC makes the rest of t run its virtual nodes over the port
// over CUDA IPC (host memory on the host backend) instead of TCP.
func withPortOverIPC(t *testing.T) {
	t.Helper()
	t.Setenv(channels.NetTransportEnv, "ipc")
}

// runLocal runs fn on w goroutine ranks of backend b, each with its own
// in-process bootstrap and device.
func runLocal(ctx context.Context, b backend, w int, fn func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error) []error {
	cfg := bootstrap.Config{Timeout: time.Minute}
	switch b {
	case emuBackend:
		return bootstrap.RunInProcess(ctx, w, cfg, func(ctx context.Context, bs bootstrap.Bootstrap) error {
			dev, err := cpuemu.Open(bs.Rank(), cpuemu.Options{SMs: 2, WaitLimit: time.Minute})
			if err != nil {
				return err
			}
			return errors.Join(fn(ctx, bs, dev), dev.Close())
		})
	case cudaBackend:
		return channeltest.RunLocal(ctx, device.CUDA, w, cfg, fn)
	}
	return channeltest.RunLocal(ctx, device.Host, w, cfg, fn)
}

func runNotifyRanksOn(t *testing.T, b backend, topo internode.Topology, wait time.Duration, fn func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error)) []error {
	t.Helper()
	return runNotifyRanksFree(t, b, topo, wait, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, func() error, error) {
		nt, err := fn(ctx, c)
		return nt, nil, err
	})
}

// runNotifyRanksFree is runNotifyRanksOn for a fn that also hands back a
// free of its own device memory (nil: none), run once every rank's fn has
// returned and before the Notify closes. Freeing earlier, inside fn, is
// freeing while a peer's kernel may still spin: CUDA may hold launches
// issued after a free (or a stream's destruction) behind the kernels
// already running in the context (ARCHITECTURE.md, "No allocation or free
// while a peer spins"), among them the proxy's atomic add that kernel
// waits for, which then lands only once its wait has timed out.
func runNotifyRanksFree(t *testing.T, b backend, topo internode.Topology, wait time.Duration, fn func(ctx context.Context, c *channels.Communicator) (*internode.Notify, func() error, error)) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := topo.World()
	var done, closed sync.WaitGroup
	done.Add(w)
	closed.Add(w)
	return runLocal(ctx, b, w,
		func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: wait},
				Network: channels.NetworkConfig{VirtualNodes: topo.Nodes, Sockets: 2, ChunkBytes: 16 << 10}})
			var nt *internode.Notify
			var free func() error
			if err == nil {
				nt, free, err = fn(ctx, c)
			}
			done.Done()
			done.Wait()
			if free != nil {
				err = errors.Join(err, free())
			}
			if nt != nil {
				err = errors.Join(err, nt.Close())
			}
			closed.Done()
			closed.Wait() // the proxies' drains need the peers' connections
			if c != nil {
				err = errors.Join(err, c.Close())
			}
			return err
		})
}

// maxNotifyTokens bounds notifyIDs' tokens per rank.
const maxNotifyTokens = 39

// notifyIDs draws one rank's top-k ids: valid experts, -1 and ids outside
// [-1, E) mixed in; rank zeroRank gets no tokens.
func notifyIDs(rng *rand.Rand, s internode.Shape, rank, zeroRank int) []int64 {
	t := rng.Intn(maxNotifyTokens + 1)
	if rank == zeroRank {
		t = 0
	}
	ids := make([]int64, t*s.TopK)
	for j := range ids {
		switch x := rng.Intn(20); {
		case x == 0:
			ids[j] = -1
		case x == 1:
			ids[j] = int64(s.Experts + rng.Intn(5))
		case x == 2:
			ids[j] = -2 - int64(rng.Intn(5))
		default:
			ids[j] = int64(rng.Intn(s.Experts))
		}
	}
	return ids
}

// wantNotify derives every rank's notify result from the reference
// (independent of notify's code path): receive counts and bases from
// ReferenceDispatch's rows, relays from its relay buffers, the own layout
// from ReferenceLayout.
func wantNotify(t *testing.T, s internode.Shape, ids [][]int64, alignment int) []internode.NotifyResult {
	t.Helper()
	w := s.World()
	in := make([]internode.RankInput, w)
	for r := range in {
		in[r] = internode.RankInput{X: make([]uint16, len(ids[r])/s.TopK*s.Hidden), TopK: ids[r]}
	}
	out, err := internode.ReferenceDispatch(s, in, alignment)
	require.NoError(t, err)
	want := make([]internode.NotifyResult, w)
	for d, o := range out {
		ly, err := internode.ReferenceLayout(s, ids[d])
		require.NoError(t, err)
		ly.IsTokenInRank, ly.IsTokenInNode = nil, nil
		r := internode.NotifyResult{Layout: *ly, FromRank: make([]int32, w), ViaForwarder: make([]int32, s.RanksPerNode),
			Relay: make([]int32, s.Nodes), RelayPrefix: make([]int32, s.Nodes), RelayTargets: make([]int32, s.Nodes*s.RanksPerNode),
			RankPrefix: o.RankPrefix, NodePrefix: o.NodePrefix, TokensPerLocalExpert: o.TokensPerLocalExpert, Received: o.Received()}
		for _, src := range o.RecvSrcRank {
			r.FromRank[src]++
			r.ViaForwarder[s.Local(int(src))]++
		}
		for _, rl := range o.Relayed {
			a := s.Node(int(rl.SrcRank))
			r.Relay[a]++
			for l := 0; l < s.RanksPerNode; l++ {
				r.RelayTargets[a*s.RanksPerNode+l] += int32(rl.Targets >> l & 1)
			}
		}
		var sum int32
		for n, c := range r.Relay {
			sum += c
			r.RelayPrefix[n] = sum
		}
		want[d] = r
	}
	return want
}

// Every rank's counts after each of 4 rounds on one setup, 2 virtual
// nodes of 2 and of 4 ranks.
func TestNotifyCountsOverTCP(t *testing.T) {
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkNotifyRounds(t, hostBackend, topo, 4, int64(topo.World())) })
	}
}

// Readers that dawdle: in each round one rank sleeps between its waits and
// its reads (network counts as a forwarder, then its own counts), while
// the others run ahead into the next round. Their next round's writes must
// not overwrite what it still reads (two parities of every buffer); with
// one parity this fails.
func TestNotifySlowReaders(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	internode.SetNotifyTestHook(func(rank int, round uint64, stage int) {
		if uint64(rank) == round%uint64(topo.World()) {
			time.Sleep(20 * time.Millisecond)
		}
	})
	defer internode.SetNotifyTestHook(nil)
	checkNotifyRounds(t, hostBackend, topo, 6, 77)
}

// checkNotifyRounds runs rounds notify rounds on one setup (counters
// advance by round; both staging parities are reused): random routings
// (one rank with T = 0 each), the last round with no tokens anywhere, and
// compares every rank's result with the reference's.
func checkNotifyRounds(t *testing.T, b backend, topo internode.Topology, rounds int, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 1 + rng.Intn(6), Experts: w * (1 + rng.Intn(3))}
	align := []int{0, 4}[rng.Intn(2)]
	ids := make([][][]int64, rounds)
	for e := range ids {
		ids[e] = make([][]int64, w)
		zero := rng.Intn(w) // T = 0 on one rank each round
		for r := range ids[e] {
			if ids[e][r] = notifyIDs(rng, s, r, zero); e == rounds-1 {
				ids[e][r] = nil
			}
		}
	}
	got := make([][]*internode.NotifyResult, rounds)
	for e := range got {
		got[e] = make([]*internode.NotifyResult, w)
	}
	cfg := internode.NotifyConfig{Tag: 5, Alignment: align}
	if b != hostBackend {
		cfg.MaxTokens = maxNotifyTokens // the kernels stage the ids in memory sized by it
	}
	errs := runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, cfg)
		if err != nil {
			return nil, err
		}
		peers, tr := nt.NetworkPeers()
		me := c.Rank()
		if want := []int{topo.Forwarder(me, 1-topo.Node(me))}; fmt.Sprint(peers) != fmt.Sprint(want) ||
			len(tr) != 1 || tr[0] != wantNetTransport(b) {
			return nt, fmt.Errorf("rank %d: network peers %v over %v, want %v over %v", me, peers, tr, want, wantNetTransport(b))
		}
		for e := 0; e < rounds; e++ {
			if got[e][me], err = nt.Run(ids[e][me]); err != nil {
				return nt, err
			}
		}
		if nt.Rounds() != uint64(rounds) {
			return nt, fmt.Errorf("rank %d: %d rounds, want %d", me, nt.Rounds(), rounds)
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	for e := 0; e < rounds; e++ {
		want := wantNotify(t, s, ids[e], align)
		for r := range want {
			require.NotNil(t, got[e][r])
			assert.Equal(t, want[r], *got[e][r], "round %d rank %d", e+1, r)
		}
	}
}

// A rank that never runs its round: the ranks waiting on it give up within
// the (short) timeout with an error naming it, the others with a timeout
// naming the rank they waited on, and the Notify refuses further rounds.
func TestNotifyPeerNeverArrives(t *testing.T) {
	checkNotifyPeerNeverArrives(t, hostBackend, 300*time.Millisecond)
}

func checkNotifyPeerNeverArrives(t *testing.T, b backend, wait time.Duration) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 8}
	const absent = 3
	ids := []int64{0, 7, 2, 5, -1, 3}
	var mu sync.Mutex
	got := map[int]error{}
	start := time.Now()
	cfg := internode.NotifyConfig{Tag: 9}
	if b != hostBackend {
		cfg.MaxTokens = 4
	}
	errs := runNotifyRanksOn(t, b, topo, wait, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, cfg)
		if err != nil || c.Rank() == absent {
			return nt, err
		}
		_, err = nt.Run(ids)
		_, again := nt.Run(ids)
		mu.Lock()
		got[c.Rank()] = err
		mu.Unlock()
		if again == nil || !strings.Contains(again.Error(), "timed out") {
			return nt, fmt.Errorf("rank %d: a round after the timeout gave %v, want the timeout again", c.Rank(), again)
		}
		return nt, nil
	})
	took := time.Since(start)
	ranktest.NoErrors(t, errs)
	require.Less(t, took, time.Minute, "the waits are bounded")
	// Rank 1 waits for rank 3's counts over the network, rank 2 for
	// forwarder 3's counts inside node 1; rank 0 for forwarder 1, which is
	// stuck on rank 3.
	for r, peer := range map[int]int{0: 1, 1: absent, 2: absent} {
		var te *channels.TimeoutError
		require.True(t, errors.As(got[r], &te), "rank %d: %v", r, got[r])
		assert.Equal(t, peer, te.Peer, "rank %d: %v", r, got[r])
		assert.Contains(t, got[r].Error(), fmt.Sprintf("rank %d", peer), "rank %d", r)
		assert.Contains(t, got[r].Error(), fmt.Sprintf("internode: rank %d: notify round 1", r))
	}
}

// Setup and call errors: a shape whose nodes differ from the
// communicator's, a shape that differs between ranks, a negative alignment,
// ids that are not whole tokens, calls after Close and on nil.
func TestNotifyBadInput(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	errs := runNotifyRanks(t, topo, 10*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		return nil, badNotifyInput(ctx, c, topo)
	})
	ranktest.NoErrors(t, errs)
}

func badNotifyInput(ctx context.Context, c *channels.Communicator, topo internode.Topology) error {
	wrong := internode.Shape{Topology: internode.Topology{Nodes: 1, RanksPerNode: 4}, Hidden: 8, TopK: 2, Experts: 4}
	if _, err := internode.NewNotify(ctx, c, wrong, internode.NotifyConfig{}); err == nil ||
		!strings.Contains(err.Error(), "the communicator's nodes are 2 nodes x 2 ranks") {
		return fmt.Errorf("rank %d: wrong topology: %v", c.Rank(), err)
	}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 4}
	differs := s
	if c.Rank() == 2 {
		differs.TopK = 3
	}
	if _, err := internode.NewNotify(ctx, c, differs, internode.NotifyConfig{}); err == nil ||
		!strings.Contains(err.Error(), "another shape or config") {
		return fmt.Errorf("rank %d: top-k differing on rank 2: %v", c.Rank(), err)
	}
	if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Alignment: -1}); err == nil {
		return fmt.Errorf("rank %d: negative alignment accepted", c.Rank())
	}
	nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 3})
	if err != nil {
		return err
	}
	if _, err := nt.Run([]int64{1, 2, 3}); err == nil || !strings.Contains(err.Error(), "multiple of top-k 2") {
		return fmt.Errorf("rank %d: 3 ids of top-2: %v", c.Rank(), err)
	}
	if nt.Rounds() != 0 {
		return fmt.Errorf("rank %d: a refused call counted as a round", c.Rank())
	}
	if err := nt.Close(); err != nil {
		return err
	}
	if _, err := nt.Run(nil); !errors.Is(err, channels.ErrClosed) {
		return fmt.Errorf("rank %d: run after close: %v", c.Rank(), err)
	}
	if _, err := nt.Combine(internode.CombineInput{}, internode.CombineOptions{}); !errors.Is(err, channels.ErrClosed) {
		return fmt.Errorf("rank %d: combine after close: %v", c.Rank(), err)
	}
	var nilNotify *internode.Notify
	if _, err := nilNotify.Run(nil); err == nil {
		return fmt.Errorf("nil notify ran")
	}
	return nil
}
