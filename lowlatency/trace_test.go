package lowlatency_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/lowlatency"
)

// TestMain applies the measurement switches ($GOEP_LL_TRACE=1: the phase
// trace compiled in) before any kernel is compiled; the trace tests re-run
// this binary with it.
func TestMain(m *testing.M) {
	if err := kernelflags.ApplyEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if kernelflags.LLTrace() {
		fmt.Fprintln(os.Stderr, "lowlatency tests: "+kernelflags.EnvLLTrace+"=1 (phase trace compiled in)")
	}
	os.Exit(m.Run())
}

// The phase trace on the real kernels (CPU emulation). In the default build
// the trace region stays zero through dispatches and combines (Both and
// split); the test then runs this binary again with $GOEP_LL_TRACE=1, where
// every block that ran has a record of the right call (set, epoch, phases)
// with every event of its steps stamped in phase order, its work counts
// add up to the routing's, and a block a later, smaller grid did not run
// keeps its older record, which Latest leaves out.
func TestEmulatedTrace(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	traced := kernelflags.LLTrace()
	traceScenario(t, emuDevices(t, 3), 0, 6, 64, traced) // grids 6 and 5 over 4 experts: the second has blocks without an expert part
	if traced {
		t.Log("trace checked on every rank")
		return
	}
	s, err := kernelflags.RerunLLTrace("^TestEmulatedTrace$")
	require.NoError(t, err, "%s", s)
	require.Contains(t, s, "lowlatency tests: "+kernelflags.EnvLLTrace+"=1", "the child ran the traced build")
	require.Contains(t, s, "trace checked on every rank")
	require.Contains(t, s, "--- PASS: TestEmulatedTrace")
	require.NotContains(t, s, "--- SKIP")
}

// The same on GPUs (ranks spread over the GPUs present, grids within the
// spin budget): the default build's region stays zero, the traced child's
// records are checked.
func TestTraceGPU(t *testing.T) {
	devs, spin := gpuDevices(t, 4)
	if spin < 2 {
		t.Skipf("a spin budget of %d blocks: the scenario needs grids of 2", spin)
	}
	traced := kernelflags.LLTrace()
	traceScenario(t, devs, spin, min(8, spin), 128, traced)
	if traced {
		t.Log("trace checked on every rank")
		return
	}
	s, err := kernelflags.RerunLLTrace("^TestTraceGPU$")
	require.NoError(t, err, "%s", s)
	require.Contains(t, s, "trace checked on every rank")
	require.Contains(t, s, "--- PASS: TestTraceGPU")
	require.NotContains(t, s, "--- SKIP")
}

// traceScenario runs five calls (dispatch then combine) on every rank:
// sets 0, 1, 0 whole (Both), set 1 split (Send, Recv launches), then set 0
// whole on a grid one block smaller; after each it reads every rank's
// trace. blocks is the grid of the first four (at least 2); spin caps
// grids (ranks sharing a GPU; 0: none).
func traceScenario(t *testing.T, devs []device.Device, spin, blocks, threads int, traced bool) {
	const tokensMax, hidden, topk, le = 6, 128, 3, 4 // hidden 128: one 32-chunk round a row, so one slice a token
	ranks := len(devs)
	c := llCase{name: "trace", ranks: ranks, maxTokens: tokensMax, hidden: hidden, topk: topk, le: le, weights: true,
		minus1: 15, bad: 5, dups: 10, hot: -1, cold: -1}
	lc := c.config()
	g := newGroup(t, devs, lc, 60*time.Second, spin)
	ins := make([]lowlatency.RankInput, ranks)
	x, ids, w, out := make([]uintptr, ranks), make([]uintptr, ranks), make([]uintptr, ranks), make([]uintptr, ranks)
	tokens := make([]int, ranks)
	for i, r := range g.ranks {
		tokens[i] = []int{tokensMax, 0, 4, 1}[i%4] // a rank without tokens, too
		ins[i] = c.genInput(newRNG(11, uint64(i)), tokens[i])
		x[i], ids[i], w[i] = r.upload(t, bytesOf(ins[i].X)), r.upload(t, bytesOf(ins[i].TopK)), r.upload(t, bytesOf(ins[i].Weights))
		out[i] = r.upload(t, make([]byte, 2*tokensMax*hidden))
	}
	want := traceWork(lc, ins)
	type call struct {
		set   int
		split bool
		grid  int
	}
	epochs := [2]uint64{}
	for n, cl := range []call{{0, false, blocks}, {1, false, blocks}, {0, false, blocks}, {1, true, blocks}, {0, false, blocks - 1}} {
		cfg := lowlatency.LaunchConfig{NumSMs: cl.grid, Threads: threads}
		var steps []func(i int, r *rank) error
		for _, ph := range phasesOf(cl.split) {
			steps = append(steps, func(i int, r *rank) error {
				a := lowlatency.DispatchArgs{Set: cl.set, X: x[i], TopK: ids[i], IDs64: true, Weights: w[i], Tokens: tokens[i], Phase: ph}
				return r.ws.Dispatch(r.dev, r.stream, a, cfg)
			})
		}
		for _, ph := range phasesOf(cl.split) {
			steps = append(steps, func(i int, r *rank) error {
				// Y: the zero-copy buffer, whatever it holds (only the
				// trace is checked here).
				a := lowlatency.CombineArgs{Set: cl.set, Tokens: tokens[i], Y: r.ws.CombineBuffer(cl.set).X, Out: out[i], Phase: ph}
				return r.ws.Combine(r.dev, r.stream, a, cfg)
			})
		}
		g.steps(t, steps...)
		epochs[cl.set]++
		for i, r := range g.ranks {
			what := fmt.Sprintf("call %d (set %d, split %v, grid %d), rank %d", n, cl.set, cl.split, cl.grid, i)
			raw := down[byte](t, r, r.ws.TracePtr(), lowlatency.TraceBytes)
			tr, err := lowlatency.ParseTrace(raw)
			require.NoError(t, err, what)
			if !traced {
				for j, b := range raw {
					if b != 0 {
						t.Fatalf("%s: the default build wrote byte %d of the trace region (%#x)", what, j, b)
					}
				}
				require.Empty(t, tr.Dispatch.Blocks, what)
				require.Empty(t, tr.Combine.Blocks, what)
				continue
			}
			phases := lowlatency.Both
			if cl.split {
				phases = lowlatency.Recv // the record's tag is its last launch's
			}
			for _, k := range []struct {
				kt                 lowlatency.KernelTrace
				events             []string
				sendWork, recvWork int
			}{
				{tr.Dispatch, lowlatency.DispatchEvents, want[i].dispSend, want[i].dispRecv},
				{tr.Combine, lowlatency.CombineEvents, want[i].combSend, tokens[i]},
			} {
				kw := what + " " + k.kt.Kernel
				latest := k.kt.Latest()
				require.Len(t, latest, cl.grid, "%s: blocks with a record of the last launch", kw)
				sendWork, recvWork := 0, 0
				for b, bt := range latest {
					require.Equal(t, b, bt.Block, kw)
					require.Equal(t, epochs[cl.set], bt.Epoch, "%s block %d: epoch", kw, b)
					require.Equal(t, cl.set, bt.Set, "%s block %d: set", kw, b)
					require.Equal(t, phases, bt.Phases, "%s block %d: phases", kw, b)
					sendWork += bt.SendWork
					recvWork += bt.RecvWork
					var prev uint64
					for e, name := range k.events {
						s := bt.Stamps[e]
						if name == "recv_entry" && !cl.split {
							require.Zero(t, s, "%s block %d: a Both launch has no recv_entry", kw, b)
							continue
						}
						require.NotZero(t, s, "%s block %d: event %s not stamped", kw, b, name)
						require.GreaterOrEqual(t, s, prev, "%s block %d: event %s before the previous one", kw, b, name)
						prev = s
					}
				}
				require.Equal(t, k.sendWork, sendWork, "%s: send work over the blocks", kw)
				require.Equal(t, k.recvWork, recvWork, "%s: receive work over the blocks", kw)
				if cl.grid < blocks {
					// Block grid..blocks-1 keep the split call's records.
					require.Len(t, k.kt.Blocks, blocks, kw)
					for _, bt := range k.kt.Blocks[cl.grid:] {
						require.Equal(t, lowlatency.Recv, bt.Phases, "%s: stale block %d", kw, bt.Block)
						require.NotEqual(t, latest[0].Tag, bt.Tag, "%s: stale block %d", kw, bt.Block)
					}
				}
				sum := k.kt.Summary()
				require.NotEmpty(t, sum, kw)
				for _, s := range sum {
					require.Equal(t, cl.grid, s.Blocks, "%s: %s", kw, s.Event)
					require.True(t, 0 <= s.Min && s.Min <= s.Median && s.Median <= s.Max, "%s: %+v", kw, s)
				}
			}
		}
	}
}

// work is what one rank's blocks do in a call, in all (one slice a token,
// no mask, expert-major): the dispatch send's tokens that go anywhere,
// the rows this rank receives (one per top-k entry of its experts), the
// combine send's received tokens with a local entry.
type work struct{ dispSend, dispRecv, combSend int }

// traceWork counts the work from the routing alone.
func traceWork(c lowlatency.Config, ins []lowlatency.RankInput) []work {
	out := make([]work, c.Ranks)
	e := int64(c.Experts())
	for s, in := range ins {
		for t := 0; t < len(in.TopK)/c.TopK; t++ {
			var dst uint32
			for _, id := range in.TopK[t*c.TopK : (t+1)*c.TopK] {
				if id < 0 || id >= e {
					continue
				}
				d := int(id) / c.LocalExperts
				dst |= 1 << d
				out[d].dispRecv++
			}
			if dst != 0 {
				out[s].dispSend++
			}
			for d := range out {
				if dst>>d&1 != 0 {
					out[d].combSend++
				}
			}
		}
	}
	return out
}
