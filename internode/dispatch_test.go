package internode_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// Dispatch's data path (Notify.Dispatch) on the host backend: goroutine
// ranks in 2 virtual nodes, cross-node rows over port channels on TCP,
// every rank's rows compared with ReferenceDispatch.

// dispatchInput draws one rank's input for ids: BF16 bits or FP8 bytes
// with scales, weights or none (empty, non-nil for a rank without tokens).
func dispatchInput(rng *rand.Rand, s internode.Shape, ids []int64, fp8, weights bool) internode.RankInput {
	t := len(ids) / s.TopK
	in := internode.RankInput{TopK: ids}
	if fp8 {
		in.XFP8 = make([]uint8, t*s.Hidden)
		rng.Read(in.XFP8)
		in.Scales = make([]float32, t*s.Hidden/internode.FP8Block)
		for j := range in.Scales {
			in.Scales[j] = rng.Float32()*8 - 4
		}
	} else {
		in.X = make([]uint16, t*s.Hidden)
		for j := range in.X {
			in.X[j] = uint16(rng.Intn(1 << 16))
		}
	}
	if weights {
		in.Weights = make([]float32, len(ids))
		for j := range in.Weights {
			in.Weights[j] = rng.Float32()
		}
	}
	return in
}

// comparable drops what Dispatch does not produce (Traffic) and treats
// empty slices as nil, so that a rank receiving nothing compares equal.
func comparable(o internode.RankOutput) internode.RankOutput {
	o.Traffic = internode.Traffic{}
	if len(o.RecvX) == 0 {
		o.RecvX = nil
	}
	if len(o.RecvXFP8) == 0 {
		o.RecvXFP8 = nil
	}
	if len(o.RecvScales) == 0 {
		o.RecvScales = nil
	}
	if len(o.RecvTopK) == 0 {
		o.RecvTopK = nil
	}
	if len(o.RecvWeights) == 0 {
		o.RecvWeights = nil
	}
	if len(o.RecvSrcRank) == 0 {
		o.RecvSrcRank = nil
	}
	if len(o.RecvSrcToken) == 0 {
		o.RecvSrcToken = nil
	}
	if len(o.Relayed) == 0 {
		o.Relayed = nil
	}
	return o
}

// Rounds on one setup, 2 virtual nodes x 2 and x 4 ranks: random routings
// (-1 and out-of-range ids, T = 0 on one rank each round), BF16 and FP8
// with scales, with and without weights, the counters and regions reused
// round after round.
func TestDispatchOverTCP(t *testing.T) {
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkDispatchRounds(t, hostBackend, topo, int64(100+topo.World())) })
	}
}

func checkDispatchRounds(t *testing.T, b backend, topo internode.Topology, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	w := topo.World()
	// Hidden 128 on 2 x 2, 256 on 2 x 4: rows of two widths.
	s := internode.Shape{Topology: topo, Hidden: 64 * topo.RanksPerNode, TopK: 1 + rng.Intn(6), Experts: w * (1 + rng.Intn(3))}
	if testHidden > 0 {
		s.Hidden = testHidden
	}
	align := []int{0, 4}[rng.Intn(2)]
	// Round formats: BF16 with weights, FP8 without, FP8 with, BF16
	// without.
	formats := []struct{ fp8, weights bool }{{false, true}, {true, false}, {true, true}, {false, false}}
	rounds := len(formats)
	in := make([][]internode.RankInput, rounds)
	for e := range in {
		in[e] = make([]internode.RankInput, w)
		zero := rng.Intn(w)
		for r := range in[e] {
			in[e][r] = dispatchInput(rng, s, notifyIDs(rng, s, r, zero), formats[e].fp8, formats[e].weights)
		}
	}
	// Buffers exactly as large as the most tokens of any rank and round:
	// a full relay or receive region must not spill into the next one.
	maxTokens := 1
	for e := range in {
		for _, x := range in[e] {
			maxTokens = max(maxTokens, len(x.TopK)/s.TopK)
		}
	}
	got := make([][]*internode.RankOutput, rounds)
	for e := range got {
		got[e] = make([]*internode.RankOutput, w)
	}
	errs := runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 11, Alignment: align, MaxTokens: maxTokens, PutBytes: testPutBytes, PutGroups: putGroups(), ProxyMaxPending: testProxyPending, Threads: testThreads, Split: splitOf(c.Rank()), SendMemory: testSendMemory, Forward: forward()})
		if err != nil {
			return nil, err
		}
		me := c.Rank()
		if peers, tr := nt.NetworkPeers(); len(peers) != topo.Nodes-1 || len(tr) != len(peers) || slices.ContainsFunc(tr, func(x channels.Transport) bool { return x != wantNetTransport(b) }) {
			return nt, fmt.Errorf("rank %d: network peers %v over %v, want %d over %v", me, peers, tr, topo.Nodes-1, wantNetTransport(b))
		}
		for e := 0; e < rounds; e++ {
			if _, err := nt.Run(in[e][me].TopK); err != nil {
				return nt, err
			}
			if got[e][me], err = nt.Dispatch(in[e][me]); err != nil {
				return nt, err
			}
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	for e := 0; e < rounds; e++ {
		want, err := internode.ReferenceDispatch(s, in[e], align)
		require.NoError(t, err)
		// The routing must exercise both hops, or the comparison proves
		// little.
		var network, nvlink int
		for _, o := range want {
			network += o.Traffic.NetworkRecv.Tokens
			nvlink += o.Traffic.NVLinkRecv.Tokens
		}
		require.Positive(t, network, "round %d: no row crosses the network", e+1)
		require.Positive(t, nvlink, "round %d: no row is forwarded to another rank", e+1)
		for r := range want {
			require.NotNil(t, got[e][r])
			assert.Equal(t, comparable(want[r]), comparable(*got[e][r]), "round %d (%+v) rank %d", e+1, formats[e], r)
		}
	}
}

// Dispatch's call errors: no dispatch buffers, no notify round yet, ids
// other than the round's, a second dispatch of one round, too many tokens
// for the buffers, nil and after Close. None of them moves data, so every
// rank goes on to a good round afterwards.
func TestDispatchBadInput(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 8}
	errs := runNotifyRanks(t, topo, 10*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		me := c.Rank()
		check := func(what string, err error, want string) error {
			if err == nil || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("rank %d: %s: %v, want an error containing %q", me, what, err, want)
			}
			return nil
		}
		var nilNotify *internode.Notify
		if _, err := nilNotify.Dispatch(internode.RankInput{}); err == nil {
			return nil, fmt.Errorf("nil notify dispatched")
		}
		plain, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 21})
		if err != nil {
			return nil, err
		}
		ids := []int64{0, 7, 3, -1}
		x := internode.RankInput{X: make([]uint16, 2*s.Hidden), TopK: ids}
		_, err = plain.Dispatch(x)
		if err := errors.Join(check("no buffers", err, "MaxTokens"), plain.Close()); err != nil {
			return nil, err
		}
		if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: -1}); err == nil {
			return nil, fmt.Errorf("rank %d: negative max tokens accepted", me)
		}
		for _, pp := range []int{-1, internode.MaxProxyPending + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, ProxyMaxPending: pp}); err == nil || !strings.Contains(err.Error(), "proxy max pending") {
				return nil, fmt.Errorf("rank %d: proxy max pending %d: %v, want a refusal naming it", me, pp, err)
			}
		}
		for _, rs := range []int{-2, internode.MaxReduceSMs + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, ReduceSMs: rs}); err == nil || !strings.Contains(err.Error(), "reduce SMs") {
				return nil, fmt.Errorf("rank %d: reduce SMs %d: %v, want a refusal naming it", me, rs, err)
			}
		}
		for _, sm := range []internode.SendMemory{-1, internode.SendHost + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, SendMemory: sm}); err == nil || !strings.Contains(err.Error(), "SendMemory(") {
				return nil, fmt.Errorf("rank %d: send memory %d: %v, want a refusal naming it", me, int(sm), err)
			}
		}
		for _, n := range []int{-1, internode.MaxLayouts + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, Layouts: n}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("layouts %d", n)) {
				return nil, fmt.Errorf("rank %d: layouts %d: %v, want a refusal naming them", me, n, err)
			}
		}
		for _, pg := range []int{-1, internode.MaxPutGroups + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, PutGroups: pg}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("put groups %d: want 0..1024", pg)) {
				return nil, fmt.Errorf("rank %d: put groups %d: %v, want a refusal naming it", me, pg, err)
			}
		}
		for _, pb := range []int{-1, internode.MaxPutBytes + 1} {
			if _, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 23, MaxTokens: 2, PutBytes: pb}); err == nil || !strings.Contains(err.Error(), "put bytes") {
				return nil, fmt.Errorf("rank %d: put bytes %d: %v, want a refusal naming them", me, pb, err)
			}
		}
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 25, MaxTokens: 2})
		if err != nil {
			return nil, err
		}
		_, err = nt.Dispatch(x)
		if err := check("before a round", err, "run a notify round first"); err != nil {
			return nt, err
		}
		big := []int64{0, 1, 2, 3, 4, 5}
		if _, err := nt.Run(big); err != nil {
			return nt, err
		}
		_, err = nt.Dispatch(internode.RankInput{X: make([]uint16, 3*s.Hidden), TopK: big})
		if err := check("3 tokens in buffers of 2", err, "more than the 2"); err != nil {
			return nt, err
		}
		if _, err := nt.Run(ids); err != nil {
			return nt, err
		}
		other := internode.RankInput{X: x.X, TopK: []int64{0, 7, 3, 2}}
		_, err = nt.Dispatch(other)
		if err := check("other ids", err, "the notify round had"); err != nil {
			return nt, err
		}
		if _, err := nt.Dispatch(x); err != nil {
			return nt, err
		}
		_, err = nt.Dispatch(x)
		if err := check("twice", err, "one dispatch per round"); err != nil {
			return nt, err
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
}

// A rank that runs the notify round but never its dispatch: the ranks
// waiting on it give up within the (short) timeout with an error naming
// it (rank 1: its rows over the network; rank 2: its receive bases), rank
// 0 naming forwarder 1, stuck on it; later calls are refused.
func TestDispatchPeerNeverArrives(t *testing.T) {
	checkDispatchPeerNeverArrives(t, hostBackend, 300*time.Millisecond)
}

func checkDispatchPeerNeverArrives(t *testing.T, b backend, wait time.Duration) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 8}
	const absent = 3
	ids := []int64{0, 7, 2, 5, -1, 3}
	x := internode.RankInput{X: make([]uint16, 3*s.Hidden), TopK: ids}
	got := make([]error, topo.World())
	errs := runNotifyRanksOn(t, b, topo, wait, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 31, MaxTokens: 3})
		if err != nil {
			return nil, err
		}
		if _, err := nt.Run(ids); err != nil || c.Rank() == absent {
			return nt, err
		}
		_, got[c.Rank()] = nt.Dispatch(x)
		if _, again := nt.Run(ids); again == nil || !strings.Contains(again.Error(), "timed out") {
			return nt, fmt.Errorf("rank %d: a round after the timeout gave %v, want the timeout again", c.Rank(), again)
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	for r, peer := range map[int]int{0: 1, 1: absent, 2: absent} {
		var te *channels.TimeoutError
		require.True(t, errors.As(got[r], &te), "rank %d: %v", r, got[r])
		assert.Equal(t, peer, te.Peer, "rank %d: %v", r, got[r])
		assert.Contains(t, got[r].Error(), fmt.Sprintf("rank %d", peer), "rank %d", r)
		assert.Contains(t, got[r].Error(), fmt.Sprintf("internode: rank %d: dispatch after notify round 1", r))
	}
}
