package intranode_test

// Notify, dispatch (BF16 and FP8, non-cached and cached) and combine on every
// backend this machine has: goroutine ranks on the host backend always (the
// Go twins, small shapes), and on GPUs when there are enough of them (one
// rank per GPU over peer access, DeepEP-sized shapes). Results are compared
// with intranode.ReferenceDispatch / ReferenceCombine: dispatch byte for
// byte, combine bit for bit (same summation order). Every output is poisoned
// before every launch.

import (
	"context"
	"errors"
	"fmt"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

func fill(r, n int) []int {
	t := make([]int, r)
	for i := range t {
		t[i] = n
	}
	return t
}

// hostSpecs keep the host backend quick on two cores.
func hostSpecs() []spec {
	return []spec{
		{name: "basic", ranks: 2, tokens: []int{5, 7}, hidden: 128, topk: 2, experts: 4, weights: true, bias: 2, iters: 2},
		{name: "fp8", ranks: 4, tokens: []int{33, 0, 17, 40}, hidden: 384, topk: 4, experts: 16, fp8: true, weights: true,
			gen: routing.GenOptions{Masked: 9}},
		{name: "top8-masked", ranks: 8, tokens: []int{24, 3, 17, 0, 31, 8, 1, 20}, hidden: 128, topk: 8, experts: 64,
			weights: true, bias: 1, align: 4, gen: routing.GenOptions{Masked: 30}, iters: 3},
		{name: "fp8-8", ranks: 8, tokens: fill(8, 12), hidden: 256, topk: 8, experts: 256, fp8: true,
			gen: routing.GenOptions{Seed: 3}},
		{name: "one-expert", ranks: 4, tokens: fill(4, 16), hidden: 128, topk: 1, experts: 16, weights: true,
			gen: routing.GenOptions{Always: []int{5}}},
		{name: "empty-rank", ranks: 4, tokens: []int{20, 9, 13, 0}, hidden: 384, topk: 3, experts: 12, weights: true,
			bias: 2, gen: routing.GenOptions{EmptyRanks: []int{2}}},
		{name: "top9-t1", ranks: 4, tokens: fill(4, 1), hidden: 128, topk: 9, experts: 36, weights: true, align: 3},
		{name: "no-tokens", ranks: 2, tokens: []int{0, 0}, hidden: 128, topk: 2, experts: 4, weights: true, bias: 1, iters: 2},
		{name: "one-rank", ranks: 1, tokens: []int{9}, hidden: 256, topk: 3, experts: 8, weights: true},
		{name: "specials", ranks: 4, tokens: fill(4, 10), hidden: 128, topk: 4, experts: 8, weights: true, bias: 2,
			specialY: true},
		{name: "y-is-recv", ranks: 4, tokens: []int{7, 11, 0, 5}, hidden: 128, topk: 4, experts: 32, yIsRecv: true},
		{name: "small-grid", ranks: 8, tokens: fill(8, 40), maxTokens: 64, hidden: 128, topk: 8, experts: 64,
			weights: true, cfg: intranode.LaunchConfig{NumSMs: 3, Threads: 64}, iters: 2},
		{name: "one-block", ranks: 4, tokens: []int{20, 30, 10, 5}, hidden: 128, topk: 5, experts: 20,
			cfg: intranode.LaunchConfig{NumSMs: 1, Threads: 32}},
		// Combine inputs in the combine input region, staged with the host
		// count, and a different placement on every rank.
		{name: "y-in-cinput", ranks: 4, tokens: []int{9, 0, 13, 6}, hidden: 256, topk: 4, experts: 16, weights: true,
			bias: 1, ymode: "cinput", iters: 2},
		{name: "y-rows", ranks: 2, tokens: []int{11, 4}, hidden: 128, topk: 2, experts: 8, weights: true, ymode: "rows"},
		{name: "y-mixed", ranks: 8, tokens: []int{10, 3, 0, 12, 7, 7, 1, 9}, hidden: 128, topk: 6, experts: 64,
			weights: true, bias: 2, ymode: "mixed", iters: 2},
		{name: "y-recv-weights", ranks: 4, tokens: []int{8, 8, 8, 8}, hidden: 128, topk: 3, experts: 12, weights: true,
			ymode: "recv", iters: 2},
		// The other copy paths and notify+dispatch in one call.
		{name: "wide-nd", ranks: 4, tokens: []int{12, 5, 9, 0}, hidden: 256, topk: 4, experts: 16, weights: true,
			notifyDispatch: true, cfg: intranode.LaunchConfig{Copy: intranode.CopyWide}, iters: 3},
		{name: "tma-fp8", ranks: 4, tokens: []int{12, 5, 9, 1}, hidden: 384, topk: 4, experts: 16, fp8: true,
			notifyDispatch: true, cfg: intranode.LaunchConfig{Copy: intranode.CopyTMA}, iters: 2},
	}
}

// gpuSpecs are the shapes the GPUs check, for ranks (2, 4 or 8).
func gpuSpecs(ranks int) []spec {
	e := 32 * ranks
	all := []spec{
		{name: "deepep", ranks: ranks, tokens: fill(ranks, 4096), hidden: 7168, topk: 8, experts: e, weights: true,
			gen: routing.GenOptions{Masked: 40}, ymode: "cinput"},
		{name: "deepep-y-is-recv", ranks: ranks, tokens: fill(ranks, 2048), hidden: 7168, topk: 8, experts: e,
			weights: true, yIsRecv: true},
		{name: "y-mixed", ranks: ranks, tokens: fill(ranks, 1500), hidden: 4096, topk: 8, experts: e, weights: true,
			bias: 2, ymode: "mixed", iters: 2},
		{name: "wide-nd", ranks: ranks, tokens: fill(ranks, 2048), hidden: 7168, topk: 8, experts: e, weights: true,
			notifyDispatch: true, cfg: intranode.LaunchConfig{Copy: intranode.CopyWide}, iters: 2},
		{name: "tma", ranks: ranks, tokens: fill(ranks, 2048), hidden: 7168, topk: 8, experts: e, weights: true,
			notifyDispatch: true, cfg: intranode.LaunchConfig{Copy: intranode.CopyTMA}, ymode: "cinput", iters: 2},
		{name: "tma-fp8", ranks: ranks, tokens: fill(ranks, 2048), hidden: 7168, topk: 8, experts: e, fp8: true,
			weights: true, cfg: intranode.LaunchConfig{Copy: intranode.CopyTMA}, iters: 2},
		{name: "tma-odd", ranks: ranks, tokens: append([]int{37}, fill(ranks-1, 300)...), hidden: 2176, topk: 6,
			experts: 8 * ranks, weights: true, gen: routing.GenOptions{Masked: 5},
			cfg: intranode.LaunchConfig{Copy: intranode.CopyTMA, NumSMs: 16, Threads: 256}, iters: 2},
		{name: "fp8", ranks: ranks, tokens: fill(ranks, 1024), hidden: 2048, topk: 8, experts: e, fp8: true,
			weights: true, iters: 2},
		{name: "fp8-7168", ranks: ranks, tokens: fill(ranks, 4096), hidden: 7168, topk: 8, experts: e, fp8: true},
		{name: "odd-hidden", ranks: ranks, tokens: fill(ranks, 512), hidden: 2176, topk: 6, experts: 8 * ranks,
			weights: true, bias: 2, align: 128, gen: routing.GenOptions{Masked: 100}, iters: 3},
		{name: "h8192-top9", ranks: ranks, tokens: fill(ranks, 256), hidden: 8192, topk: 9, experts: 9 * ranks,
			weights: true, specialY: true},
		{name: "h5120-empty", ranks: ranks, tokens: append([]int{0}, fill(ranks-1, 700)...), hidden: 5120, topk: 4,
			experts: 4 * ranks, weights: true, gen: routing.GenOptions{EmptyRanks: []int{ranks - 1}}},
		{name: "one-expert", ranks: ranks, tokens: fill(ranks, 1000), hidden: 3072, topk: 1, experts: e,
			gen: routing.GenOptions{Always: []int{e - 1}}},
		{name: "t1", ranks: ranks, tokens: fill(ranks, 1), hidden: 7168, topk: 8, experts: e, weights: true, bias: 1},
		{name: "t0", ranks: ranks, tokens: fill(ranks, 0), maxTokens: 16, hidden: 2048, topk: 8, experts: e, weights: true},
		{name: "one-block", ranks: ranks, tokens: fill(ranks, 300), hidden: 2048, topk: 8, experts: e, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 1, Threads: 128}},
		{name: "132-sms", ranks: ranks, tokens: fill(ranks, 3000), hidden: 4096, topk: 8, experts: e, weights: true,
			cfg: intranode.LaunchConfig{NumSMs: 132}},
	}
	if ranks == 8 {
		return all
	}
	// Fewer ranks: the shapes that differ in kind, not only in size.
	var some []spec
	for _, s := range all {
		switch s.name {
		case "deepep", "fp8", "odd-hidden", "h5120-empty", "t0", "y-mixed", "tma", "tma-fp8", "wide-nd":
			if ranks == 2 && s.name == "h5120-empty" {
				s.gen.EmptyRanks = nil // two ranks: an empty one leaves too few experts for top-4
			}
			some = append(some, s)
		}
	}
	return some
}

func TestDispatchCombineMatchReferenceHost(t *testing.T) {
	for _, s := range hostSpecs() {
		t.Run(s.String(), func(t *testing.T) {
			g := newGroup(t, device.Host, s.layout(), 20*time.Second)
			runSpec(t, g, newStreams(t, g), s)
		})
	}
}

func TestDispatchCombineMatchReferenceGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no CUDA GPU")
	}
	// 2, 4 and 8 ranks on the GPUs present, several to a GPU when fewer.
	for _, ranks := range []int{2, 4, 8} {
		for _, s := range gpuSpecs(ranks) {
			t.Run(s.String(), func(t *testing.T) {
				g := newGroup(t, device.CUDA, s.layout(), 20*time.Second)
				runSpec(t, g, newStreams(t, g), s)
			})
		}
	}
}

// runSpec runs s.iters rounds of: notify + dispatch (new handle), cached
// dispatch of new x, combine; each checked against the reference.
func runSpec(t *testing.T, g *intranodetest.Group, streams []device.Stream, s spec) {
	shape := intranode.Shape{Hidden: s.hidden, TopK: s.topk, Experts: s.experts, Ranks: s.ranks}
	data := make([]*rankData, s.ranks)
	ins := make([]intranode.RankInput, s.ranks)
	for r := range data {
		gen := s.gen
		gen.Seed = s.gen.Seed*1000 + uint64(r)
		rt, err := routing.Generate(routing.Shape{Tokens: s.tokens[r], K: s.topk, Experts: s.experts, Ranks: s.ranks}, gen)
		require.NoError(t, err)
		rd := &rankData{in: newInputs(t, s, r, rt.Idx, 1), handle: g.Ranks[r].WS.DefaultHandle(s.tokens[r])}
		rd.topk = upload(t, g.Ranks[r].Dev, rt.Idx)
		rd.uploadX(t, g.Ranks[r].Dev, s)
		data[r], ins[r] = rd, rd.in
	}
	for it := 0; it < max(1, s.iters); it++ {
		// Non-cached: notify builds the handle, dispatch uses it.
		for _, r := range g.Ranks {
			poison(t, r, true)
		}
		run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
			if s.notifyDispatch && (i%2 == 0 || it%2 == 1) { // odd ranks mix both forms
				return r.NotifyDispatch(st, data[i].topk.Ptr, data[i].handle, s.align, data[i].dispatchArgs(s), s.cfg)
			}
			if err := r.Notify(st, data[i].topk.Ptr, data[i].handle, s.align); err != nil {
				return err
			}
			return r.WS.Dispatch(r.Dev, st, data[i].dispatchArgs(s), s.cfg)
		})
		want, err := intranode.ReferenceDispatch(shape, ins, s.align)
		require.NoError(t, err)
		for i, r := range g.Ranks {
			what := fmt.Sprintf("iter %d non-cached", it)
			require.Equal(t, want[i].Received(), r.RecvCountNow(), "%s: rank %d mapped recv count", what, i)
			require.Equal(t, want[i].TokensPerLocalExpert, r.ExpertCountsNow(), "%s: rank %d expert counts", what, i)
			checkDispatch(t, s, r, data[i], want[i], what)
		}

		// Cached: new x and weights, same routing and handle.
		for i, r := range g.Ranks {
			data[i].in = newInputs(t, s, i, data[i].in.TopK, uint64(100+it))
			data[i].uploadX(t, r.Dev, s)
			ins[i] = data[i].in
			poison(t, r, false)
		}
		run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
			return r.WS.Dispatch(r.Dev, st, data[i].dispatchArgs(s), s.cfg)
		})
		want, err = intranode.ReferenceDispatch(shape, ins, s.align)
		require.NoError(t, err)
		for i, r := range g.Ranks {
			checkDispatch(t, s, r, data[i], want[i], fmt.Sprintf("iter %d cached", it))
		}

		runCombine(t, g, streams, s, shape, data, want, uint64(it))
	}
}

func runCombine(t *testing.T, g *intranodetest.Group, streams []device.Stream, s spec, shape intranode.Shape,
	data []*rankData, dispatched []intranode.RankOutput, seed uint64) {
	cins := make([]intranode.CombineInput, s.ranks)
	args := make([]intranode.CombineArgs, s.ranks)
	var bufs [][]device.Buffer
	for i, r := range g.Ranks {
		rng := rand.New(rand.NewPCG(seed, uint64(i)+50))
		d := r.Dev
		n, tok := dispatched[i].Received(), s.tokens[i]
		var b []device.Buffer
		a := intranode.CombineArgs{Handle: data[i].handle}
		mode := s.combineInput(i)
		l := r.WS.Layout
		// Poison the outputs and the combine input region, not the received
		// rows (which y may be).
		for _, reg := range []intranode.Region{l.CombineX, l.CombineWeights} {
			require.NoError(t, d.MemsetAsync(r.WS.Base+uintptr(reg.Offset), 0xEE, reg.Size, nil))
		}
		require.NoError(t, d.DefaultStream().Synchronize())
		switch mode {
		case "recv":
			cins[i].Y = dispatched[i].RecvX
			a.Y = r.WS.Recv().X
			if s.weights {
				cins[i].Weights = dispatched[i].RecvWeights
				a.Weights = r.WS.Recv().Weights
			}
		case "cinput":
			cins[i].Y = intranodetest.RandBF16(rng, n*s.hidden, s.specialY)
			a.Y = r.WS.CombineInput().X
			require.NoError(t, d.CopyIn(a.Y, bytesOf(cins[i].Y)))
			if s.weights {
				cins[i].Weights = randF32(rng, n*s.topk)
				a.Weights = r.WS.CombineInput().Weights
				require.NoError(t, d.CopyIn(a.Weights, bytesOf(cins[i].Weights)))
			}
		case "copy", "rows":
			cins[i].Y = intranodetest.RandBF16(rng, n*s.hidden, s.specialY)
			y := upload(t, d, cins[i].Y)
			a.Y = y.Ptr
			b = append(b, y)
			if s.weights {
				cins[i].Weights = randF32(rng, n*s.topk)
				w := upload(t, d, cins[i].Weights)
				a.Weights = w.Ptr
				b = append(b, w)
			}
			if mode == "rows" {
				a.Rows = n
			}
		default:
			t.Fatalf("combine input mode %q", mode)
		}
		if s.weights {
			ow := alloc(t, d, 4*tok*s.topk)
			a.OutWeights = ow.Ptr
			b = append(b, ow)
		}
		if s.bias >= 1 {
			cins[i].Bias0 = intranodetest.RandBF16(rng, tok*s.hidden, s.specialY)
			b0 := upload(t, d, cins[i].Bias0)
			a.Bias0 = b0.Ptr
			b = append(b, b0)
		}
		if s.bias >= 2 {
			cins[i].Bias1 = intranodetest.RandBF16(rng, tok*s.hidden, false)
			b1 := upload(t, d, cins[i].Bias1)
			a.Bias1 = b1.Ptr
			b = append(b, b1)
		}
		out := alloc(t, d, 2*tok*s.hidden)
		a.Out = out.Ptr
		b = append(b, out)
		args[i] = a
		bufs = append(bufs, b)
		extra := []device.Buffer{out}
		if s.weights {
			extra = append(extra, device.Buffer{Ptr: a.OutWeights, Size: 4 * tok * s.topk})
		}
		for _, e := range extra {
			require.NoError(t, d.MemsetAsync(e.Ptr, 0xEE, e.Size, nil))
		}
		require.NoError(t, d.DefaultStream().Synchronize())
	}
	defer func() {
		for i, b := range bufs {
			for _, x := range b {
				assert.NoError(t, g.Ranks[i].Dev.Free(x))
			}
		}
	}()
	run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
		return r.WS.Combine(r.Dev, st, args[i], s.cfg)
	})
	want, err := intranode.ReferenceCombine(shape, s.tokens, dispatched, cins)
	require.NoError(t, err)
	for i, r := range g.Ranks {
		tok := s.tokens[i]
		sameSlice(t, want[i].X, download[uint16](t, r.Dev, args[i].Out, tok*s.hidden), "combine: rank %d x", i)
		if s.weights {
			sameFloats(t, want[i].Weights, download[float32](t, r.Dev, args[i].OutWeights, tok*s.topk),
				"combine: rank %d weights", i)
		}
	}
}

// Ids outside [-1, E) are ignored by notify and dispatch, exactly like -1,
// and counted.
func TestInvalidIDsAreIgnored(t *testing.T) {
	kinds := []device.Kind{device.Host}
	if gpuCount(t) > 0 {
		kinds = append(kinds, device.CUDA)
	}
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := spec{ranks: 2, tokens: []int{4, 3}, hidden: 128, topk: 3, experts: 8, weights: true}
			g := newGroup(t, kind, s.layout(), 20*time.Second)
			streams := newStreams(t, g)
			raw := [][]int64{{0, 9, 5, -2, -1, 7, 8, 100, -7, 3, 4, 1}, {6, -1, 2, 1 << 40, 0, 5, -1, -1, -1}}
			clean := [][]int64{{0, -1, 5, -1, -1, 7, -1, -1, -1, 3, 4, 1}, {6, -1, 2, -1, 0, 5, -1, -1, -1}}
			bad := []int32{5, 1}
			data := make([]*rankData, 2)
			ins := make([]intranode.RankInput, 2)
			inv := make([]device.Buffer, 2)
			for i, r := range g.Ranks {
				rd := &rankData{in: newInputs(t, s, i, clean[i], 5), handle: r.WS.DefaultHandle(s.tokens[i])}
				rd.topk = upload(t, r.Dev, raw[i])
				rd.uploadX(t, r.Dev, s)
				data[i], ins[i] = rd, rd.in
				inv[i] = alloc(t, r.Dev, 4)
				poison(t, r, true, inv[i])
			}
			run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
				if err := r.WS.Notify(r.Dev, st, intranode.NotifyArgs{TopK: data[i].topk.Ptr, Handle: data[i].handle,
					Invalid: inv[i].Ptr}, intranode.LaunchConfig{}); err != nil {
					return err
				}
				return r.WS.Dispatch(r.Dev, st, data[i].dispatchArgs(s), intranode.LaunchConfig{})
			})
			shape := intranode.Shape{Hidden: s.hidden, TopK: s.topk, Experts: s.experts, Ranks: s.ranks}
			want, err := intranode.ReferenceDispatch(shape, ins, 0)
			require.NoError(t, err)
			for i, r := range g.Ranks {
				checkDispatch(t, s, r, data[i], want[i], "invalid ids")
				require.Equal(t, bad[i], download[int32](t, r.Dev, inv[i].Ptr, 1)[0], "rank %d invalid count", i)
				require.Equal(t, -1, r.RecvCountNow(), "no mapped counter given: left alone")
			}
		})
	}
}

// A rank that never launches: its peers' kernels give up after the
// watchdog's timeout and name the stage and the missing peer.
func TestMissingPeerTimesOut(t *testing.T) {
	kinds := []device.Kind{device.Host}
	if gpuCount(t) > 0 {
		kinds = append(kinds, device.CUDA)
	}
	for _, kind := range kinds {
		for _, kernel := range []string{"notify", "dispatch", "combine"} {
			t.Run(string(kind)+"/"+kernel, func(t *testing.T) {
				s := spec{ranks: 2, tokens: []int{3, 3}, hidden: 128, topk: 2, experts: 4}
				g := newGroup(t, kind, s.layout(), 300*time.Millisecond)
				r := g.Ranks[0]
				rd := &rankData{in: newInputs(t, s, 0, []int64{0, 3, 1, 2, -1, 3}, 1), handle: r.WS.DefaultHandle(3)}
				rd.topk = upload(t, r.Dev, rd.in.TopK)
				rd.uploadX(t, r.Dev, s)
				st, err := r.Dev.NewStream()
				require.NoError(t, err)
				defer st.Close()
				out := alloc(t, r.Dev, 2*3*128)
				start := time.Now()
				var stage uint32
				switch kernel {
				case "notify":
					require.NoError(t, r.Notify(st, rd.topk.Ptr, rd.handle, 0))
					stage = intranode.StageNotifyBarrier
				case "dispatch":
					require.NoError(t, r.WS.Dispatch(r.Dev, st, rd.dispatchArgs(s), intranode.LaunchConfig{}))
					stage = intranode.StageDispatchEntry
				case "combine":
					// y in the workspace: no staging copy (the handle was
					// never filled by a notify).
					require.NoError(t, r.WS.Combine(r.Dev, st, intranode.CombineArgs{Y: r.WS.Recv().X, Out: out.Ptr,
						Handle: rd.handle}, intranode.LaunchConfig{}))
					stage = intranode.StageCombineEntry
				}
				require.NoError(t, st.Synchronize())
				err = r.Check()
				var te *channels.TimeoutError
				require.True(t, errors.As(err, &te), "want a timeout, got %v", err)
				assert.ErrorIs(t, err, channels.ErrTimeout)
				assert.Equal(t, 0, te.Rank)
				assert.Equal(t, 1, te.Peer)
				assert.Equal(t, stage, te.Stage)
				assert.Equal(t, uint32(77), te.ID)
				assert.Contains(t, err.Error(), intranode.StageName(stage))
				assert.GreaterOrEqual(t, te.Waited, 300*time.Millisecond)
				assert.Less(t, time.Since(start), 30*time.Second)
				t.Log(err)
				if kernel == "notify" {
					_, err := r.WaitRecvCount(context.Background())
					require.ErrorIs(t, err, channels.ErrTimeout)
				}
				require.NoError(t, g.Ranks[1].Check())
			})
		}
	}
}

// Cached dispatch and combine captured once into a graph per rank and
// replayed: the kernels advance their own epochs, so every replay works
// without host updates.
func TestGraphReplays(t *testing.T) {
	kinds := []device.Kind{device.Host}
	if gpuCount(t) > 0 {
		kinds = append(kinds, device.CUDA)
	}
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := spec{ranks: 2, tokens: []int{30, 20}, hidden: 256, topk: 4, experts: 8, weights: true}
			if kind == device.CUDA {
				s.tokens, s.hidden = []int{3000, 2000}, 7168
			}
			g := newGroup(t, kind, s.layout(), 20*time.Second)
			streams := newStreams(t, g)
			shape := intranode.Shape{Hidden: s.hidden, TopK: s.topk, Experts: s.experts, Ranks: s.ranks}
			data := make([]*rankData, 2)
			ins := make([]intranode.RankInput, 2)
			for i, r := range g.Ranks {
				rt, err := routing.Generate(routing.Shape{Tokens: s.tokens[i], K: s.topk, Experts: s.experts, Ranks: 2},
					routing.GenOptions{Seed: uint64(i)})
				require.NoError(t, err)
				data[i] = &rankData{in: newInputs(t, s, i, rt.Idx, 9), handle: r.WS.DefaultHandle(s.tokens[i])}
				data[i].topk = upload(t, r.Dev, rt.Idx)
				data[i].uploadX(t, r.Dev, s)
				ins[i] = data[i].in
			}
			run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
				return r.Notify(st, data[i].topk.Ptr, data[i].handle, 0)
			})
			want, err := intranode.ReferenceDispatch(shape, ins, 0)
			require.NoError(t, err)
			outs := make([]device.Buffer, 2)
			graphs := make([]device.Graph, 2)
			for i, r := range g.Ranks {
				outs[i] = alloc(t, r.Dev, 2*s.tokens[i]*s.hidden)
				a := intranode.CombineArgs{Y: r.WS.Recv().X, Out: outs[i].Ptr, Handle: data[i].handle}
				graphs[i], err = r.Dev.Capture(streams[i], func() error {
					if err := r.WS.Dispatch(r.Dev, streams[i], data[i].dispatchArgs(s), intranode.LaunchConfig{}); err != nil {
						return err
					}
					return r.WS.Combine(r.Dev, streams[i], a, intranode.LaunchConfig{})
				})
				require.NoError(t, err)
				defer graphs[i].Close()
			}
			cins := []intranode.CombineInput{{Y: want[0].RecvX}, {Y: want[1].RecvX}}
			wantC, err := intranode.ReferenceCombine(shape, s.tokens, want, cins)
			require.NoError(t, err)
			for rep := 0; rep < 4; rep++ {
				for i, r := range g.Ranks {
					poison(t, r, false, outs[i])
				}
				run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error { return graphs[i].Launch(st) })
				for i, r := range g.Ranks {
					checkDispatch(t, s, r, data[i], want[i], fmt.Sprintf("replay %d", rep))
					sameSlice(t, wantC[i].X, download[uint16](t, r.Dev, outs[i].Ptr, s.tokens[i]*s.hidden),
						"replay %d: rank %d combine", rep, i)
				}
			}
		})
	}
}

// Back-to-back combines, each rank rewriting its combine input in stream
// order right after each combine and launching the next one without any
// host synchronisation: correct only if a combine ends on a rank when
// every peer has finished reading that rank's input (the completion
// barrier), whichever rank is fast. Inputs alternate between the combine
// input region and the receive region (overwritten by a copy too).
func TestCombineInputReuse(t *testing.T) {
	kinds := []device.Kind{device.Host}
	if gpuCount(t) > 0 {
		kinds = append(kinds, device.CUDA)
	}
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			ranks, rounds := 2, 6
			s := spec{ranks: 2, tokens: []int{40, 25}, hidden: 256, topk: 4, experts: 8, weights: true}
			if kind == device.CUDA {
				ranks, rounds = min(max(gpuCount(t), 4), intranode.MaxRanks), 4
				s = spec{ranks: ranks, tokens: fill(ranks, 1024), hidden: 7168, topk: 8, experts: 32 * ranks, weights: true}
			}
			g := newGroup(t, kind, s.layout(), 20*time.Second)
			streams := newStreams(t, g)
			shape := intranode.Shape{Hidden: s.hidden, TopK: s.topk, Experts: s.experts, Ranks: s.ranks}
			data := make([]*rankData, ranks)
			ins := make([]intranode.RankInput, ranks)
			for i, r := range g.Ranks {
				rt, err := routing.Generate(routing.Shape{Tokens: s.tokens[i], K: s.topk, Experts: s.experts, Ranks: ranks},
					routing.GenOptions{Seed: uint64(i) + 5})
				require.NoError(t, err)
				data[i] = &rankData{in: newInputs(t, s, i, rt.Idx, 3), handle: r.WS.DefaultHandle(s.tokens[i])}
				data[i].topk = upload(t, r.Dev, rt.Idx)
				data[i].uploadX(t, r.Dev, s)
				ins[i] = data[i].in
			}
			run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
				return r.NotifyDispatch(st, data[i].topk.Ptr, data[i].handle, 0, data[i].dispatchArgs(s), intranode.LaunchConfig{})
			})
			want, err := intranode.ReferenceDispatch(shape, ins, 0)
			require.NoError(t, err)

			// Per round and rank: the input (host and a device copy of it),
			// and the outputs.
			type round struct {
				cins    []intranode.CombineInput
				y, w    []device.Buffer
				out, ow []device.Buffer
			}
			rs := make([]round, rounds)
			for k := range rs {
				rd := round{cins: make([]intranode.CombineInput, ranks)}
				for i, r := range g.Ranks {
					rng := rand.New(rand.NewPCG(uint64(k), uint64(i)))
					n, tok := want[i].Received(), s.tokens[i]
					rd.cins[i] = intranode.CombineInput{Y: intranodetest.RandBF16(rng, n*s.hidden, false), Weights: randF32(rng, n*s.topk)}
					rd.y = append(rd.y, upload(t, r.Dev, rd.cins[i].Y))
					rd.w = append(rd.w, upload(t, r.Dev, rd.cins[i].Weights))
					rd.out = append(rd.out, alloc(t, r.Dev, 2*tok*s.hidden))
					rd.ow = append(rd.ow, alloc(t, r.Dev, 4*tok*s.topk))
				}
				rs[k] = rd
			}
			run(t, g, streams, func(i int, r *intranodetest.Rank, st device.Stream) error {
				n := want[i].Received()
				for k, rd := range rs {
					dst, wdst := r.WS.CombineInput().X, r.WS.CombineInput().Weights
					if k%2 == 1 {
						dst, wdst = r.WS.Recv().X, r.WS.Recv().Weights
					}
					if err := r.Dev.CopyAsync(dst, rd.y[i].Ptr, 2*n*s.hidden, st); err != nil {
						return err
					}
					if err := r.Dev.CopyAsync(wdst, rd.w[i].Ptr, 4*n*s.topk, st); err != nil {
						return err
					}
					a := intranode.CombineArgs{Y: dst, Weights: wdst, Out: rd.out[i].Ptr, OutWeights: rd.ow[i].Ptr,
						Handle: data[i].handle}
					if err := r.WS.Combine(r.Dev, st, a, intranode.LaunchConfig{}); err != nil {
						return err
					}
				}
				return nil
			})
			for k, rd := range rs {
				wantC, err := intranode.ReferenceCombine(shape, s.tokens, want, rd.cins)
				require.NoError(t, err)
				for i, r := range g.Ranks {
					tok := s.tokens[i]
					sameSlice(t, wantC[i].X, download[uint16](t, r.Dev, rd.out[i].Ptr, tok*s.hidden), "round %d: rank %d x", k, i)
					sameFloats(t, wantC[i].Weights, download[float32](t, r.Dev, rd.ow[i].Ptr, tok*s.topk),
						"round %d: rank %d weights", k, i)
				}
			}
			for _, rd := range rs {
				for i, r := range g.Ranks {
					for _, b := range []device.Buffer{rd.y[i], rd.w[i], rd.out[i], rd.ow[i]} {
						require.NoError(t, r.Dev.Free(b))
					}
				}
			}
		})
	}
}
