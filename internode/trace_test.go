package internode_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// TestMain applies the measurement switches ($GOEP_INN_TRACE=1: the phase
// trace compiled in) before any kernel is compiled; the trace tests re-run
// this binary with it.
func TestMain(m *testing.M) {
	if err := kernelflags.ApplyEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if kernelflags.InnTrace() {
		fmt.Fprintln(os.Stderr, "internode tests: "+kernelflags.EnvInnTrace+"=1 (phase trace compiled in)")
	}
	os.Exit(m.Run())
}

// The phase trace on the real kernels (CPU emulation, 2 x 2 ranks, a role
// split and the shared grid). In the default build the trace region stays
// zero; the test then runs this binary again with $GOEP_INN_TRACE=1, where
// every block of both kernels has a record of the last round, entry and
// exit stamped, every stamp between them, and every event reached by some
// block (the rounds cross the network and forward to other ranks).
func TestEmulatedKernelTrace(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	traced := kernelflags.InnTrace()
	for _, sp := range []internode.Split{{Senders: 1, Forwarders: 2, Receivers: 1}, {Shared: true}} {
		t.Run(fmt.Sprintf("%+v", sp), func(t *testing.T) { traceRounds(t, sp, traced) })
	}
	if traced {
		t.Log("trace checked on every rank")
		return
	}
	s, err := kernelflags.RerunInnTrace("^TestEmulatedKernelTrace$")
	require.NoError(t, err, "%s", s)
	require.Contains(t, s, "internode tests: "+kernelflags.EnvInnTrace+"=1", "the child ran the traced build")
	require.Contains(t, s, "trace checked on every rank")
	require.Contains(t, s, "--- PASS: TestEmulatedKernelTrace")
	require.NotContains(t, s, "--- SKIP")
}

// traceRounds runs two rounds of notify, dispatch and combine on 2 x 2
// emulated ranks with split sp, then checks every rank's trace region.
func traceRounds(t *testing.T, sp internode.Split, traced bool) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	rng := rand.New(rand.NewSource(77))
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 3, Experts: 2 * w}
	const rounds = 2
	in := make([][]internode.RankInput, rounds)
	cin := make([][]internode.CombineInput, rounds)
	maxTokens := 1
	for e := range in {
		in[e] = make([]internode.RankInput, w)
		for r := range in[e] {
			in[e][r] = dispatchInput(rng, s, notifyIDs(rng, s, r, -1), false, true)
			maxTokens = max(maxTokens, len(in[e][r].TopK)/s.TopK)
		}
		disp, err := internode.ReferenceDispatch(s, in[e], 0)
		require.NoError(t, err)
		cin[e] = make([]internode.CombineInput, w)
		for r := range cin[e] {
			cin[e][r] = internode.CombineInput{Y: bf16s(rng, disp[r].Received()*s.Hidden)}
		}
	}
	raws := make([][]byte, w)
	blocks := make([]int, w)
	errs := runNotifyRanksOn(t, emuBackend, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 43, MaxTokens: maxTokens, Split: sp, PutBytes: 1000})
		if err != nil {
			return nil, err
		}
		me := c.Rank()
		for e := range rounds {
			if _, err := nt.Run(in[e][me].TopK); err != nil {
				return nt, err
			}
			if _, err := nt.Dispatch(in[e][me]); err != nil {
				return nt, err
			}
			if _, err := nt.Combine(cin[e][me], internode.CombineOptions{}); err != nil {
				return nt, err
			}
		}
		blocks[me], _ = nt.Launch()
		raws[me], err = nt.KernelTrace()
		return nt, err
	})
	ranktest.NoErrors(t, errs)
	for r, raw := range raws {
		d, c, err := internode.ParseKernelTrace(raw)
		require.NoError(t, err, "rank %d", r)
		if !traced {
			for j, b := range raw {
				if b != 0 {
					t.Fatalf("rank %d: the default build wrote byte %d of the trace region (%#x)", r, j, b)
				}
			}
			require.Empty(t, d.Blocks)
			require.Empty(t, c.Blocks)
			continue
		}
		for _, kt := range []internode.KernelTrace{d, c} {
			what := fmt.Sprintf("rank %d %s", r, kt.Kernel)
			require.Len(t, kt.Blocks, blocks[r], what)
			reached := make([]bool, len(kt.Events))
			for _, b := range kt.Blocks {
				require.Equal(t, uint64(rounds), b.Round, "%s block %d", what, b.Block)
				entry, exit := b.Stamps[0], b.Stamps[len(b.Stamps)-1]
				require.NotZero(t, entry, "%s block %d: entry", what, b.Block)
				require.NotZero(t, exit, "%s block %d: exit", what, b.Block)
				for e, st := range b.Stamps {
					if st != 0 {
						reached[e] = true
						require.True(t, st >= entry && st <= exit, "%s block %d: %s at %d outside [%d, %d]", what, b.Block, kt.Events[e], st, entry, exit)
					}
				}
			}
			for e, ok := range reached {
				require.True(t, ok, "%s: no block reached %s", what, kt.Events[e])
			}
			require.Contains(t, kt.Summary(), kt.Events[len(kt.Events)-1], what)
		}
	}
}
