package internode_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/kernels"
)

// Combine's data path (Notify.Combine) on the host backend: goroutine
// ranks in 2 virtual nodes, partials over port channels on TCP, every
// rank's result compared bit for bit with ReferenceCombine.

// bf16s draws n finite BF16 values of magnitudes 2^-24..4 (empty,
// non-nil for n = 0): sums of such values are rarely exact in fp32, so a
// different order of additions, or a rounding more or less, shows.
func bf16s(rng *rand.Rand, n int) []uint16 {
	v := make([]uint16, n)
	for j := range v {
		v[j] = kernels.Float32ToBF16(float32(math.Ldexp(rng.Float64()*8-4, -rng.Intn(25))))
	}
	return v
}

func TestCombineOverTCP(t *testing.T) {
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) { checkCombineRounds(t, hostBackend, topo, int64(200+topo.World())) })
	}
	// The rows for other nodes in host memory (channels.RegisterHostMemory),
	// with the TCP transport staging device memory as on GPUs: the puts
	// from host memory go out unstaged, interleaved with staged ones.
	t.Run("send=host/staged", func(t *testing.T) {
		withSendMemory(t, internode.SendHost)
		t.Setenv("GOEP_TCP_STAGE", "always")
		checkCombineRounds(t, hostBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 205)
	})
}

func checkCombineRounds(t *testing.T, b backend, topo internode.Topology, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 64 * topo.RanksPerNode, TopK: 1 + rng.Intn(6), Experts: w * (1 + rng.Intn(3))}
	if testHidden > 0 {
		s.Hidden = testHidden
	}
	// Rounds: dispatch format, combine weights, biases, partial format.
	type round struct {
		fp8, weights bool
		biases       int
		partial      internode.Partial
	}
	rounds := []round{
		{false, true, 2, internode.PartialBF16},
		{true, false, 1, internode.PartialFP32},
		{false, false, 0, internode.PartialBF16},
		{true, true, 2, internode.PartialFP32},
	}
	in := make([][]internode.RankInput, len(rounds))
	maxTokens := 1
	for e := range in {
		in[e] = make([]internode.RankInput, w)
		zero := rng.Intn(w)
		for r := range in[e] {
			in[e][r] = dispatchInput(rng, s, notifyIDs(rng, s, r, zero), rounds[e].fp8, rounds[e].weights)
			maxTokens = max(maxTokens, len(in[e][r].TopK)/s.TopK)
		}
	}
	// Combine inputs follow the reference's dispatch (its receive order is
	// Dispatch's, checked by the dispatch test and again here).
	disp := make([][]internode.RankOutput, len(rounds))
	cin := make([][]internode.CombineInput, len(rounds))
	tokens := make([][]int, len(rounds))
	for e, rd := range rounds {
		var err error
		disp[e], err = internode.ReferenceDispatch(s, in[e], 0)
		require.NoError(t, err)
		cin[e] = make([]internode.CombineInput, w)
		tokens[e] = make([]int, w)
		for r := range cin[e] {
			n, tk := disp[e][r].Received(), len(in[e][r].TopK)/s.TopK
			tokens[e][r] = tk
			c := internode.CombineInput{Y: bf16s(rng, n*s.Hidden)}
			if rd.weights {
				c.Weights = make([]float32, n*s.TopK)
				for j := range c.Weights {
					c.Weights[j] = rng.Float32()
				}
			}
			if rd.biases >= 1 {
				c.Bias0 = bf16s(rng, tk*s.Hidden)
			}
			if rd.biases >= 2 {
				c.Bias1 = bf16s(rng, tk*s.Hidden)
			}
			cin[e][r] = c
		}
	}
	got := make([][]*internode.CombineOutput, len(rounds))
	gotDisp := make([][]*internode.RankOutput, len(rounds))
	for e := range got {
		got[e] = make([]*internode.CombineOutput, w)
		gotDisp[e] = make([]*internode.RankOutput, w)
	}
	errs := runNotifyRanksOn(t, b, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 41, MaxTokens: maxTokens, PutBytes: testPutBytes, PutGroups: putGroups(), ProxyMaxPending: testProxyPending, Threads: testThreads, Split: splitOf(c.Rank()), ReduceSMs: testReduceSMs, ReduceUnits: reduceUnits(), SendMemory: testSendMemory, Forward: forward()})
		if err != nil {
			return nil, err
		}
		me := c.Rank()
		for e, rd := range rounds {
			if _, err := nt.Run(in[e][me].TopK); err != nil {
				return nt, err
			}
			if gotDisp[e][me], err = nt.Dispatch(in[e][me]); err != nil {
				return nt, err
			}
			if got[e][me], err = nt.Combine(cin[e][me], internode.CombineOptions{Partial: rd.partial}); err != nil {
				return nt, err
			}
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	for e, rd := range rounds {
		want, err := internode.ReferenceCombine(s, tokens[e], disp[e], cin[e], internode.CombineOptions{Partial: rd.partial})
		require.NoError(t, err)
		var network, nvlink int
		for _, o := range want {
			network += o.Traffic.NetworkRecv.Tokens
			nvlink += o.Traffic.NVLinkRecv.Tokens
		}
		require.Positive(t, network, "round %d: no partial crosses the network", e+1)
		require.Positive(t, nvlink, "round %d: no row is reduced from another rank", e+1)
		for r := range want {
			require.NotNil(t, got[e][r])
			require.Equal(t, comparable(disp[e][r]), comparable(*gotDisp[e][r]), "round %d rank %d: dispatch", e+1, r)
			assert.Equal(t, len(want[r].X), len(got[e][r].X), "round %d rank %d", e+1, r)
			assert.Equal(t, want[r].X, got[e][r].X, "round %d (%+v) rank %d", e+1, rd, r)
			if rd.weights {
				assert.Equal(t, want[r].Weights, got[e][r].Weights, "round %d rank %d: weights", e+1, r)
			} else {
				assert.Nil(t, got[e][r].Weights, "round %d rank %d: weights", e+1, r)
			}
		}
	}
}

// Combine's call errors: before dispatch, wrong sizes, a bad partial
// format, twice per round, nil. None moves data, so every rank then
// combines the round.
func TestCombineBadInput(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 8}
	ids := []int64{0, 7, 3, -1}
	errs := runNotifyRanks(t, topo, 10*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		me := c.Rank()
		check := func(what string, err error, want string) error {
			if err == nil || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("rank %d: %s: %v, want an error containing %q", me, what, err, want)
			}
			return nil
		}
		var nilNotify *internode.Notify
		if _, err := nilNotify.Combine(internode.CombineInput{}, internode.CombineOptions{}); err == nil {
			return nil, fmt.Errorf("nil notify combined")
		}
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 45, MaxTokens: 2})
		if err != nil {
			return nil, err
		}
		if _, err := nt.Run(ids); err != nil {
			return nt, err
		}
		_, err = nt.Combine(internode.CombineInput{}, internode.CombineOptions{})
		if err := check("before dispatch", err, "and its dispatch first"); err != nil {
			return nt, err
		}
		out, err := nt.Dispatch(internode.RankInput{X: make([]uint16, 2*s.Hidden), TopK: ids})
		if err != nil {
			return nt, err
		}
		y := make([]uint16, out.Received()*s.Hidden)
		_, err = nt.Combine(internode.CombineInput{Y: append(y, 1)}, internode.CombineOptions{})
		if err := check("long y", err, "output values"); err != nil {
			return nt, err
		}
		_, err = nt.Combine(internode.CombineInput{Y: y, Weights: make([]float32, 1)}, internode.CombineOptions{})
		if err := check("short weights", err, "weights for"); err != nil {
			return nt, err
		}
		_, err = nt.Combine(internode.CombineInput{Y: y, Bias0: make([]uint16, 1)}, internode.CombineOptions{})
		if err := check("short bias", err, "bias of 1"); err != nil {
			return nt, err
		}
		_, err = nt.Combine(internode.CombineInput{Y: y}, internode.CombineOptions{Partial: 7})
		if err := check("partial format", err, "partial format 7"); err != nil {
			return nt, err
		}
		if _, err := nt.Combine(internode.CombineInput{Y: y}, internode.CombineOptions{}); err != nil {
			return nt, err
		}
		_, err = nt.Combine(internode.CombineInput{Y: y}, internode.CombineOptions{})
		if err := check("twice", err, "one combine per round"); err != nil {
			return nt, err
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
}

// A rank that dispatches but never combines: rank 2 (its node peer) names
// it waiting for its outputs, rank 1 (whose forwarder on node 1 it is)
// waiting for its partials, rank 0 names forwarder 2, stuck on it; later
// calls are refused.
func TestCombinePeerNeverArrives(t *testing.T) {
	checkCombinePeerNeverArrives(t, hostBackend, 300*time.Millisecond)
}

func checkCombinePeerNeverArrives(t *testing.T, b backend, wait time.Duration) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 8, TopK: 2, Experts: 8}
	const absent = 3
	ids := []int64{0, 7, 2, 5, -1, 3}
	x := internode.RankInput{X: make([]uint16, 3*s.Hidden), TopK: ids}
	got := make([]error, topo.World())
	errs := runNotifyRanksOn(t, b, topo, wait, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 47, MaxTokens: 3})
		if err != nil {
			return nil, err
		}
		if _, err := nt.Run(ids); err != nil {
			return nt, err
		}
		out, err := nt.Dispatch(x)
		if err != nil || c.Rank() == absent {
			return nt, err
		}
		_, got[c.Rank()] = nt.Combine(internode.CombineInput{Y: make([]uint16, out.Received()*s.Hidden)}, internode.CombineOptions{})
		if _, again := nt.Run(ids); again == nil || !strings.Contains(again.Error(), "timed out") {
			return nt, fmt.Errorf("rank %d: a round after the timeout gave %v, want the timeout again", c.Rank(), again)
		}
		return nt, nil
	})
	ranktest.NoErrors(t, errs)
	for r, peer := range map[int]int{0: 2, 1: absent, 2: absent} {
		var te *channels.TimeoutError
		require.True(t, errors.As(got[r], &te), "rank %d: %v", r, got[r])
		assert.Equal(t, peer, te.Peer, "rank %d: %v", r, got[r])
		assert.Contains(t, got[r].Error(), fmt.Sprintf("rank %d", peer), "rank %d", r)
		assert.Contains(t, got[r].Error(), fmt.Sprintf("internode: rank %d: combine after notify round 1", r))
	}
}
