package collectives_test

// Mismatched calls across ranks: the call fingerprint that travels with the
// native kernels' signals (kernels/coll_common.cuh) turns each into
// collectives.ErrMismatch on every rank, naming the peer and the field,
// instead of wrong data reported as success or a hang; the communicator
// then refuses calls. Runs on the host backend's twins
// (TestMismatchedCalls/host-3), the real kernels in the CPU emulation
// (TestEmulatedMismatchedCalls, in emu_test.go before the coverage check)
// and, with GPUs, on CUDA
// (TestMismatchedCalls/cuda-N: 2, 4 and 8 ranks on the GPUs present,
// several to a GPU when there are fewer).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// mmCall is one call of a mismatch case.
type mmCall struct {
	kind   collectives.Kind
	count  int
	dt     ref.DataType
	op     ref.Op
	algo   string
	blocks int
}

func (x mmCall) issue(ctx context.Context, c *collectives.Communicator, b *colltest.Buffers, s device.Stream) (*collectives.Work, error) {
	var opts []collectives.CallOption
	if x.algo != "" {
		opts = append(opts, collectives.WithAlgorithm(x.algo))
	}
	if x.blocks > 0 {
		opts = append(opts, collectives.WithBlocks(x.blocks))
	}
	switch x.kind {
	case collectives.AllGather:
		return c.AllGather(ctx, s, b.Send.Ptr, b.Recv.Ptr, x.count, x.dt, opts...)
	case collectives.ReduceScatter:
		return c.ReduceScatter(ctx, s, b.Send.Ptr, b.Recv.Ptr, x.count, x.dt, x.op, opts...)
	}
	return c.AllReduce(ctx, s, b.Send.Ptr, b.Recv.Ptr, x.count, x.dt, x.op, opts...)
}

// mmCase: every rank makes one matched call of base, then calls(rank,
// world); call number bad (of those) is the first whose ranks disagree, and
// every rank's error must name field.
type mmCase struct {
	name  string
	calls func(r, w int, base mmCall) []mmCall
	bad   int
	field string
	graph bool // the matched part also runs as a captured graph replayed 3 times
	// queue: every call is issued before any is synchronised (on a GPU the
	// launches after the mismatched one are already queued: they must leave
	// without pairing with anything); the error may then come at any call.
	queue bool
}

// mmCases are the cases for base's algorithm. The deviant rank is
// min(1, w-1) unless a case says otherwise.
func mmCases(algo string) []mmCase {
	dev := func(r, w int) bool { return r == min(1, w-1) }
	one := func(f func(x mmCall) mmCall) func(r, w int, base mmCall) []mmCall {
		return func(r, w int, base mmCall) []mmCall {
			if dev(r, w) {
				return []mmCall{f(base)}
			}
			return []mmCall{base}
		}
	}
	// Allgather has no ll2: the same family's ll.
	agAlgo := algo
	if algo == collectives.AlgoLL2 {
		agAlgo = collectives.AlgoLL
	}
	cases := []mmCase{
		{name: "dtype", calls: one(func(x mmCall) mmCall { x.dt = ref.FP32; return x }), field: "dtype"},
		{name: "count", calls: one(func(x mmCall) mmCall { x.count *= 2; return x }), field: "count"},
		{name: "op", calls: one(func(x mmCall) mmCall { x.op = ref.Max; return x }), field: "op"},
		{name: "kind", calls: one(func(x mmCall) mmCall { x.kind, x.algo = collectives.AllGather, agAlgo; return x }),
			field: "collective"},
		{name: "count0", calls: one(func(x mmCall) mmCall { x.count = 0; return x }), field: "count"},
		{name: "order", field: "collective", calls: func(r, w int, base mmCall) []mmCall {
			ag := base
			ag.kind, ag.algo = collectives.AllGather, agAlgo
			if r == 0 {
				return []mmCall{base, ag}
			}
			return []mmCall{ag, base}
		}},
		{name: "queued", queue: true, field: "count", calls: func(r, w int, base mmCall) []mmCall {
			x := base
			if dev(r, w) {
				x.count++
			}
			return []mmCall{x, base, base}
		}},
		{name: "after-graph", graph: true, bad: 1, field: "count", calls: func(r, w int, base mmCall) []mmCall {
			x := base
			if dev(r, w) {
				x.count += 3
			}
			return []mmCall{base, x}
		}},
	}
	if algo == collectives.AlgoLL2 {
		// One word in all: the pieces of ranks 1.. are empty, so those ranks
		// exchange no data packet (only their presence packets, one a round,
		// which must carry the call's tag too): a matched tiny call, then
		// count 1 against 2 (still one word) on the deviant rank. (With one
		// presence packet a pair, read last, the matched call could lose one
		// under load and the mismatched call then ended in a 2-minute
		// timeout instead of ErrMismatch; kernels/coll_ll.cu.)
		cases = append(cases, mmCase{name: "tiny-count", bad: 1, field: "count", calls: func(r, w int, base mmCall) []mmCall {
			x := base
			x.count = 1
			y := x
			if dev(r, w) {
				y.count = 2
			}
			return []mmCall{x, y}
		}})
	}
	switch algo {
	case collectives.AlgoScratch:
		cases = append(cases, mmCase{name: "grid", field: "grid", calls: func(r, w int, base mmCall) []mmCall {
			x := base
			x.blocks = 2
			if dev(r, w) {
				x.blocks = 1
			}
			return []mmCall{x}
		}})
		fallthrough
	case collectives.AlgoZC, collectives.AlgoLL2:
		// Another algorithm family on one rank (counts that make ranks
		// choose differently end the same way).
		cases = append(cases, mmCase{name: "algorithm", calls: one(func(x mmCall) mmCall { x.algo = collectives.AlgoLL; return x }),
			field: "algorithm"})
	}
	return cases
}

// runMismatch runs case cs with base's algorithm on ranks built by runAll
// and checks every rank's error.
func runMismatch(t *testing.T, ranks int, runAll func(fn func(ctx context.Context, c *collectives.Communicator) error), cs mmCase, base mmCall) {
	t.Helper()
	errs := make([]error, ranks)
	at := make([]int, ranks)
	runAll(func(ctx context.Context, c *collectives.Communicator) error {
		r, w := c.Rank(), c.Size()
		b, err := colltest.NewBuffers(ctx, c, 1<<20, true)
		if err != nil {
			return err
		}
		defer b.Free()
		s := c.Device().DefaultStream()
		// A matched call first: sequence numbers past the first launch.
		work, err := base.issue(ctx, c, b, s)
		if err == nil {
			err = work.Sync(ctx)
		}
		if err != nil {
			return fmt.Errorf("matched call: %w", err)
		}
		if cs.graph {
			g, err := b.Dev.Capture(s, func() error {
				_, err := base.issue(ctx, c, b, s)
				return err
			})
			if err != nil {
				return fmt.Errorf("capture: %w", err)
			}
			for i := 0; i < 3 && err == nil; i++ {
				err = g.Launch(s)
			}
			if err == nil {
				err = s.Synchronize()
			}
			err = errors.Join(err, g.Close(), c.Check())
			if err != nil {
				return fmt.Errorf("graph replays of a matched call: %w", err)
			}
		}
		at[r] = -1
		var works []*collectives.Work
		for i, x := range cs.calls(r, w, base) {
			work, err := x.issue(ctx, c, b, s)
			if err == nil && !cs.queue {
				err = work.Sync(ctx)
			}
			if err != nil {
				errs[r], at[r] = err, i
				break
			}
			works = append(works, work)
		}
		for i, work := range works {
			if err := work.Sync(ctx); err != nil && errs[r] == nil {
				errs[r], at[r] = err, i
			}
		}
		if errs[r] != nil {
			// The communicator refuses calls from now on, with the same error.
			if _, err := base.issue(ctx, c, b, s); !errors.Is(err, collectives.ErrMismatch) {
				return fmt.Errorf("a call after the mismatch: %v, want ErrMismatch", err)
			}
		}
		return c.Barrier(ctx)
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d: the mismatched calls succeeded", r)
		if !cs.queue {
			require.Equal(t, cs.bad, at[r], "rank %d: the error came at another call: %v", r, err)
		}
		require.ErrorIs(t, err, collectives.ErrMismatch, "rank %d", r)
		require.NotErrorIs(t, err, channels.ErrTimeout, "rank %d: a mismatch is not a timeout", r)
		var me *collectives.MismatchError
		require.ErrorAs(t, err, &me, "rank %d", r)
		require.Equal(t, r, me.Rank)
		require.NotEqual(t, r, me.Peer, "rank %d names itself", r)
		require.Contains(t, err.Error(), fmt.Sprintf("rank %d made a different call", me.Peer))
		named := false
		for _, f := range me.Fields {
			named = named || strings.HasPrefix(f, cs.field+":")
		}
		require.True(t, named, "rank %d: %v does not name %q", r, err, cs.field)
		t.Logf("rank %d: %v", r, err)
	}
}

// mmConfig is w's configuration without NCCL (every case forces a native
// algorithm; an NCCL communicator per case would only cost setup time).
func mmConfig(w world) collectives.Config {
	cfg := configFor(w)
	cfg.NCCL = collectives.NCCLOff
	return cfg
}

// fullCaseSet: every case runs on the host world and the largest GPU world;
// the smaller GPU worlds (each a new set of ranks on the GPUs, seconds of
// setup a case) run the cases whose kernels paths differ by world size: a
// count that changes the per-rank split, calls queued past the mismatch,
// and a mismatch after graph replays. The CPU emulation runs every case on
// 3 ranks (TestEmulatedMismatchedCalls).
func fullCaseSet(w world, name string) bool {
	if !w.gpu() || w.ranks >= 8 {
		return true
	}
	switch name {
	case "count", "queued", "after-graph":
		return true
	}
	return false
}

func TestMismatchedCalls(t *testing.T) {
	worlds := []world{{device.Host, 3}}
	worlds = append(worlds, gpuWorlds(t)...)
	for _, w := range worlds {
		for _, algo := range []string{collectives.AlgoLL, collectives.AlgoLL2, collectives.AlgoScratch, collectives.AlgoZC} {
			base := mmCall{kind: collectives.AllReduce, count: 1000, dt: ref.BF16, op: ref.Sum, algo: algo}
			for _, cs := range mmCases(algo) {
				if !fullCaseSet(w, cs.name) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", w, algo, cs.name), func(t *testing.T) {
					runMismatch(t, w.ranks, func(fn func(ctx context.Context, c *collectives.Communicator) error) {
						run(t, w, mmConfig(w), fn)
					}, cs, base)
				})
			}
		}
	}
	// Reduce-scatter's kernels too (the cases above are allreduce first).
	for _, w := range worlds {
		for _, algo := range []string{collectives.AlgoLL, collectives.AlgoScratch, collectives.AlgoZC} {
			base := mmCall{kind: collectives.ReduceScatter, count: 300, dt: ref.FP16, op: ref.Min, algo: algo}
			cs := mmCases(algo)[1] // count
			t.Run(fmt.Sprintf("%s/reducescatter-%s/%s", w, algo, cs.name), func(t *testing.T) {
				runMismatch(t, w.ranks, func(fn func(ctx context.Context, c *collectives.Communicator) error) {
					run(t, w, mmConfig(w), fn)
				}, cs, base)
			})
		}
	}
}
