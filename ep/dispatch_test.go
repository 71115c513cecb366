package ep_test

// Dispatch and combine through the ep API against intranode's plain-Go
// reference: dispatch byte for byte, combine bit for bit. Host backend
// always (goroutine ranks, small shapes); GPUs when there are enough.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"github.com/goep-dev/goep/routing"
)

// spec is one scenario.
type spec struct {
	name      string
	ranks     int
	tokens    []int // per rank
	maxTokens int   // 0: max(tokens)
	hidden    int
	topk      int
	experts   int
	fp8       bool
	weights   bool
	bias      int // 0, 1 or 2 biases in combine
	align     int
	gen       routing.GenOptions
	iters     int  // rounds of non-cached dispatch, cached dispatch, combine
	worst     bool // non-cached dispatches in worst-case mode
	out       bool // copy dispatch outputs into caller buffers, combine into a caller Out
	yIsRecv   bool // combine the received rows themselves (DeepEP's check)
	inPlace   bool // write the combine input into the Buffer's CombineInput views
	launch    *ep.LaunchConfig
	i32       bool // pass the top-k ids as I32 (the reference sees the same ids)
}

func fill(r, n int) []int {
	t := make([]int, r)
	for i := range t {
		t[i] = n
	}
	return t
}

func (s spec) config() ep.Config {
	mt := s.maxTokens
	for _, n := range s.tokens {
		mt = max(mt, n)
	}
	return ep.Config{MaxTokens: max(mt, 1), Hidden: s.hidden, TopK: s.topk, Experts: s.experts, FP8: s.fp8,
		Timeout: 20 * time.Second}
}

func (s spec) String() string {
	ids := ""
	if s.i32 {
		ids = "/i32"
	}
	return fmt.Sprintf("%s/R=%d/T=%v/H=%d/K=%d/E=%d%s", s.name, s.ranks, s.tokens, s.hidden, s.topk, s.experts, ids)
}

func (s spec) shape() intranode.Shape {
	return intranode.Shape{Hidden: s.hidden, TopK: s.topk, Experts: s.experts, Ranks: s.ranks}
}

// rankIO is one rank's device inputs, sized once and refilled each round.
type rankIO struct {
	in                      intranode.RankInput
	x, scales, ids, weights uintptr
}

func (s spec) newInputs(t testing.TB, r *rig, rank int, seed uint64, ids []int64) intranode.RankInput {
	rng := rand.New(rand.NewPCG(seed, uint64(rank)))
	n := s.tokens[rank]
	in := intranode.RankInput{TopK: ids}
	if s.fp8 {
		in.XFP8 = randFP8(rng, n*s.hidden)
		in.Scales = randF32(rng, n*s.hidden/128)
	} else {
		in.X = intranodetest.RandBF16(rng, n*s.hidden, false)
	}
	if s.weights {
		in.Weights = randF32(rng, n*s.topk)
	}
	return in
}

// load copies in into the rank's device buffers.
func (io *rankIO) load(t testing.TB, d ep.Device, s spec) {
	if s.fp8 {
		require.NoError(t, d.CopyIn(io.x, bytesOf(io.in.XFP8)))
		require.NoError(t, d.CopyIn(io.scales, bytesOf(io.in.Scales)))
	} else {
		require.NoError(t, d.CopyIn(io.x, bytesOf(io.in.X)))
	}
	if s.i32 {
		require.NoError(t, d.CopyIn(io.ids, bytesOf(narrow(io.in.TopK))))
	} else {
		require.NoError(t, d.CopyIn(io.ids, bytesOf(io.in.TopK)))
	}
	if s.weights {
		require.NoError(t, d.CopyIn(io.weights, bytesOf(io.in.Weights)))
	}
}

func (io *rankIO) args(s spec, rank int) ep.DispatchArgs {
	n := s.tokens[rank]
	a := ep.DispatchArgs{TopK: ep.NewTensor(io.ids, ep.I64, n, s.topk), ExpertAlignment: s.align, WorstCase: s.worst,
		Launch: s.launch}
	if s.i32 {
		a.TopK.DType = ep.I32
	}
	if s.fp8 {
		a.X = ep.NewTensor(io.x, ep.FP8E4M3, n, s.hidden)
		a.Scales = ep.NewTensor(io.scales, ep.F32, n, s.hidden/128)
	} else {
		a.X = ep.NewTensor(io.x, ep.BF16, n, s.hidden)
	}
	if s.weights {
		a.Weights = ep.NewTensor(io.weights, ep.F32, n, s.topk)
	}
	return a
}

// narrow is ids as int32 (every test id fits).
func narrow(ids []int64) []int32 {
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}

// outs are caller-owned dispatch outputs of MaxRecv rows.
func (s spec) outs(t testing.TB, d ep.Device, maxRecv int) *ep.DispatchOutputs {
	o := &ep.DispatchOutputs{
		TopK:     ep.NewTensor(alloc(t, d, 8*maxRecv*s.topk), ep.I64, maxRecv, s.topk),
		SrcToken: ep.NewTensor(alloc(t, d, 4*maxRecv), ep.I32, maxRecv),
	}
	if s.fp8 {
		o.X = ep.NewTensor(alloc(t, d, maxRecv*s.hidden), ep.FP8E4M3, maxRecv, s.hidden)
		o.Scales = ep.NewTensor(alloc(t, d, 4*maxRecv*s.hidden/128), ep.F32, maxRecv, s.hidden/128)
	} else {
		o.X = ep.NewTensor(alloc(t, d, 2*maxRecv*s.hidden), ep.BF16, maxRecv, s.hidden)
	}
	if s.weights {
		o.Weights = ep.NewTensor(alloc(t, d, 4*maxRecv*s.topk), ep.F32, maxRecv, s.topk)
	}
	return o
}

// runSpec runs s.iters rounds of non-cached dispatch (a new routing each
// round), cached dispatch (new rows, same routing) and combine, each
// checked on every rank against the reference.
func runSpec(t *testing.T, r *rig, s spec) {
	ctx := context.Background()
	io := make([]*rankIO, s.ranks)
	outs := make([]*ep.DispatchOutputs, s.ranks)
	for i := range io {
		d, n := r.devs[i], s.tokens[i]
		io[i] = &rankIO{ids: alloc(t, d, 8*n*s.topk), x: alloc(t, d, 2*n*s.hidden)}
		if s.fp8 {
			io[i].scales = alloc(t, d, 4*n*s.hidden/128)
		}
		if s.weights {
			io[i].weights = alloc(t, d, 4*n*s.topk)
		}
		if s.out {
			outs[i] = s.outs(t, d, r.bufs[i].MaxRecv())
		}
	}
	results := make([]ep.DispatchResult, s.ranks)
	ins := make([]intranode.RankInput, s.ranks)
	var allocs []string
	for it := 0; it < max(s.iters, 1); it++ {
		for i := range io {
			gen := s.gen
			gen.Seed = s.gen.Seed*7919 + uint64(1000*it+i)
			rt, err := routing.Generate(routing.Shape{Tokens: s.tokens[i], K: s.topk, Experts: s.experts, Ranks: s.ranks}, gen)
			require.NoError(t, err)
			io[i].in = s.newInputs(t, r, i, uint64(2*it), rt.Idx)
			io[i].load(t, r.devs[i], s)
			ins[i] = io[i].in
			if it > 0 { // the views of the last round: poison them
				poisonResult(t, r.devs[i], results[i], r.bufs[i].MaxRecv())
			}
		}
		require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
			a := io[i].args(s, i)
			a.Stream, a.Out = r.streams[i], outs[i]
			res, err := b.Dispatch(ctx, a)
			results[i] = res
			if err != nil {
				return err
			}
			return r.streams[i].Synchronize()
		}))
		want, err := intranode.ReferenceDispatch(s.shape(), ins, s.align)
		require.NoError(t, err)
		for i := range results {
			checkDispatch(t, s, r, i, results[i], want[i], outs[i], true, fmt.Sprintf("round %d non-cached", it))
		}

		// Cached: new rows and weights, the same routing and handle.
		for i := range io {
			ids := io[i].in.TopK
			io[i].in = s.newInputs(t, r, i, uint64(2*it+1), ids)
			io[i].load(t, r.devs[i], s)
			ins[i] = io[i].in
			poisonResult(t, r.devs[i], results[i], r.bufs[i].MaxRecv())
		}
		handles := make([]*ep.Handle, s.ranks)
		for i := range results {
			handles[i] = results[i].Handle
		}
		require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
			a := io[i].args(s, i)
			a.Handle, a.Stream, a.Out = handles[i], r.streams[i], outs[i]
			if it%2 == 1 {
				a.TopK = ep.Tensor{} // the handle's copy of the routing
			}
			res, err := b.Dispatch(ctx, a)
			results[i] = res
			if err != nil {
				return err
			}
			return r.streams[i].Synchronize()
		}))
		want, err = intranode.ReferenceDispatch(s.shape(), ins, s.align)
		require.NoError(t, err)
		for i := range results {
			require.Same(t, handles[i], results[i].Handle)
			checkDispatch(t, s, r, i, results[i], want[i], outs[i], false, fmt.Sprintf("round %d cached", it))
		}
		runCombine(t, r, s, results, want, uint64(it))
		for _, h := range handles { // a handle lives until released
			h.Release()
		}
		if it == 0 {
			allocs = r.allocations()
		}
		if s.iters >= 1000 && (it+1)%1000 == 0 { // progress of long runs
			t.Logf("%s: %d of %d rounds checked", s.name, it+1, s.iters)
		}
	}
	// Repeated calls must not grow memory: after the first round, no round
	// allocates (or frees) device, host-mapped or imported memory, neither
	// held nor transient (the hot path never calls cudaMalloc).
	if s.iters > 1 {
		require.Equal(t, allocs, r.allocations(), "allocations (live and ever made, per rank) after round 1 and after round %d", s.iters)
	}
}

// poisonResult fills the worst-case extent of a result's views with 0xEE.
func poisonResult(t testing.TB, d ep.Device, res ep.DispatchResult, maxRecv int) {
	for _, v := range []ep.Tensor{res.RecvX, res.RecvScales, res.RecvTopK, res.RecvWeights, res.RecvSrcToken} {
		if v.Present() && v.Rows() > 0 {
			poison(t, d, v.Ptr, v.Bytes()/v.Rows()*maxRecv)
		}
	}
}

// checkDispatch compares one rank's result (views and caller copies) with
// the reference.
func checkDispatch(t *testing.T, s spec, r *rig, rank int, res ep.DispatchResult, want intranode.RankOutput,
	out *ep.DispatchOutputs, nonCached bool, what string) {
	t.Helper()
	d, b := r.devs[rank], r.bufs[rank]
	n := want.Received()
	worst := s.worst
	got := fromDev[int32](t, d, res.RecvCount.Ptr, 1)[0]
	require.Equal(t, int32(n), got, "%s: rank %d received count on the device", what, rank)
	if worst {
		require.Equal(t, -1, res.NumRecv, "%s: rank %d worst-case NumRecv", what, rank)
		require.Equal(t, b.MaxRecv(), res.RecvX.Rows(), "%s: worst-case views have MaxRecv rows", what)
	} else {
		require.Equal(t, n, res.NumRecv, "%s: rank %d NumRecv", what, rank)
		require.Equal(t, n, res.RecvX.Rows(), "%s: views have N rows", what)
	}
	sameSlice(t, want.RankPrefix, fromDev[int32](t, d, res.RankPrefix.Ptr, s.ranks), "%s: rank %d rank prefix", what, rank)
	if nonCached {
		if worst {
			require.Nil(t, res.TokensPerExpert)
			require.Equal(t, want.TokensPerLocalExpert, toInts(fromDev[int32](t, d, res.TokensPerExpertDevice.Ptr, b.LocalExperts())),
				"%s: rank %d device tokens per expert", what, rank)
		} else {
			require.Equal(t, want.TokensPerLocalExpert, res.TokensPerExpert, "%s: rank %d tokens per expert", what, rank)
			require.Equal(t, n, res.Handle.NumRecv())
		}
	}
	views := []ep.Tensor{res.RecvX, res.RecvScales, res.RecvTopK, res.RecvWeights, res.RecvSrcToken}
	sets := [][]ep.Tensor{views}
	if out != nil {
		sets = append(sets, []ep.Tensor{out.X, out.Scales, out.TopK, out.Weights, out.SrcToken})
	}
	for j, v := range sets {
		src := []string{"view", "caller copy"}[j]
		if s.fp8 {
			require.Equal(t, ep.FP8E4M3, res.RecvX.DType)
			sameSlice(t, want.RecvXFP8, fromDev[uint8](t, d, v[0].Ptr, n*s.hidden), "%s: rank %d recv x fp8 (%s)", what, rank, src)
			sameFloats(t, want.RecvScales, fromDev[float32](t, d, v[1].Ptr, n*s.hidden/128), "%s: rank %d scales (%s)", what, rank, src)
		} else {
			require.False(t, res.RecvScales.Present())
			sameSlice(t, want.RecvX, fromDev[uint16](t, d, v[0].Ptr, n*s.hidden), "%s: rank %d recv x (%s)", what, rank, src)
		}
		sameSlice(t, want.RecvTopK, fromDev[int64](t, d, v[2].Ptr, n*s.topk), "%s: rank %d recv topk (%s)", what, rank, src)
		if s.weights {
			sameFloats(t, want.RecvWeights, fromDev[float32](t, d, v[3].Ptr, n*s.topk), "%s: rank %d weights (%s)", what, rank, src)
		} else {
			require.False(t, res.RecvWeights.Present())
		}
		sameSlice(t, want.RecvSrcToken, fromDev[int32](t, d, v[4].Ptr, n), "%s: rank %d source tokens (%s)", what, rank, src)
	}
	if worst { // padding rows name no expert
		pad := fromDev[int64](t, d, res.RecvTopK.Ptr+uintptr(8*n*s.topk), (b.MaxRecv()-n)*s.topk)
		for i, v := range pad {
			if v != -1 { // require only on a failure: it costs microseconds a call, and there are 10^5 ids
				require.Equal(t, int64(-1), v, "%s: rank %d padding row %d", what, rank, n+i/s.topk)
			}
		}
	}
}

func toInts(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// runCombine combines (random rows, or the received rows themselves) with
// weights and biases as s says and checks every rank bit for bit.
func runCombine(t *testing.T, r *rig, s spec, results []ep.DispatchResult, dispatched []intranode.RankOutput, seed uint64) {
	ctx := context.Background()
	cins := make([]intranode.CombineInput, s.ranks)
	args := make([]ep.CombineArgs, s.ranks)
	for i := range args {
		rng := rand.New(rand.NewPCG(seed, uint64(i)+50))
		d := r.devs[i]
		n, tok := dispatched[i].Received(), s.tokens[i]
		a := ep.CombineArgs{Handle: results[i].Handle, Stream: r.streams[i], Launch: s.launch}
		// A handle whose count is not known on the host needs inputs of
		// the worst-case size.
		rows := n
		if results[i].Handle.NumRecv() < 0 {
			rows = r.bufs[i].MaxRecv()
		}
		switch {
		case s.yIsRecv && !s.fp8:
			cins[i].Y = dispatched[i].RecvX
			a.X = results[i].RecvX
		case s.inPlace:
			x, w, err := r.bufs[i].CombineInput(results[i].Handle)
			require.NoError(t, err)
			require.Equal(t, rows, x.Rows())
			cins[i].Y = intranodetest.RandBF16(rng, n*s.hidden, false)
			require.NoError(t, d.CopyIn(x.Ptr, bytesOf(cins[i].Y)))
			a.X = x
			if s.weights {
				cins[i].Weights = randF32(rng, n*s.topk)
				require.NoError(t, d.CopyIn(w.Ptr, bytesOf(cins[i].Weights)))
				a.Weights = w
			}
		default:
			cins[i].Y = intranodetest.RandBF16(rng, n*s.hidden, false)
			a.X = ep.NewTensor(alloc(t, d, 2*rows*s.hidden), ep.BF16, rows, s.hidden)
			require.NoError(t, d.CopyIn(a.X.Ptr, bytesOf(cins[i].Y)))
		}
		if s.weights && !s.inPlace {
			cins[i].Weights = randF32(rng, n*s.topk)
			a.Weights = ep.NewTensor(alloc(t, d, 4*rows*s.topk), ep.F32, rows, s.topk)
			require.NoError(t, d.CopyIn(a.Weights.Ptr, bytesOf(cins[i].Weights)))
		}
		for j := 0; j < s.bias; j++ {
			bias := intranodetest.RandBF16(rng, tok*s.hidden, false)
			if j == 0 {
				cins[i].Bias0 = bias
			} else {
				cins[i].Bias1 = bias
			}
			a.Bias[j] = ep.NewTensor(toDev(t, d, bias), ep.BF16, tok, s.hidden)
		}
		if s.out {
			a.Out = ep.NewTensor(alloc(t, d, 2*tok*s.hidden), ep.BF16, tok, s.hidden)
			poison(t, d, a.Out.Ptr, 2*tok*s.hidden)
			if s.weights {
				a.OutWeights = ep.NewTensor(alloc(t, d, 4*tok*s.topk), ep.F32, tok, s.topk)
				poison(t, d, a.OutWeights.Ptr, 4*tok*s.topk)
			}
		}
		args[i] = a
	}
	outs := make([]ep.CombineResult, s.ranks)
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		var err error
		if outs[i], err = b.Combine(ctx, args[i]); err != nil {
			return err
		}
		return r.streams[i].Synchronize()
	}))
	want, err := intranode.ReferenceCombine(s.shape(), s.tokens, dispatched, cins)
	require.NoError(t, err)
	for i, o := range outs {
		tok := s.tokens[i]
		if s.out {
			require.Equal(t, args[i].Out.Ptr, o.X.Ptr, "combine writes the caller's Out")
		}
		sameSlice(t, want[i].X, fromDev[uint16](t, r.devs[i], o.X.Ptr, tok*s.hidden), "combine: rank %d x", i)
		if s.weights {
			sameFloats(t, want[i].Weights, fromDev[float32](t, r.devs[i], o.Weights.Ptr, tok*s.topk), "combine: rank %d weights", i)
		} else {
			require.False(t, o.Weights.Present())
		}
	}
}

// hostSpecs cover the edge cases on the host backend, small enough for two
// cores.
func hostSpecs() []spec {
	return []spec{
		{name: "basic", ranks: 2, tokens: []int{5, 7}, hidden: 128, topk: 2, experts: 8, weights: true, bias: 2, iters: 2},
		{name: "masked-align-out", ranks: 4, tokens: []int{24, 3, 17, 9}, hidden: 384, topk: 4, experts: 16, weights: true,
			bias: 1, align: 4, out: true, gen: routing.GenOptions{Masked: 30}, iters: 2},
		{name: "fp8", ranks: 4, tokens: []int{33, 0, 17, 40}, hidden: 384, topk: 4, experts: 16, fp8: true, weights: true,
			out: true, gen: routing.GenOptions{Masked: 9}},
		{name: "fp8-worst", ranks: 2, tokens: []int{10, 12}, hidden: 256, topk: 3, experts: 8, fp8: true, worst: true},
		{name: "8-ranks-top8", ranks: 8, tokens: []int{24, 3, 17, 0, 31, 8, 1, 20}, hidden: 128, topk: 8, experts: 64,
			weights: true, bias: 1, gen: routing.GenOptions{Masked: 30}},
		{name: "worst-case", ranks: 4, tokens: []int{20, 9, 13, 6}, maxTokens: 24, hidden: 128, topk: 4, experts: 16,
			weights: true, worst: true, out: true, iters: 2},
		{name: "receives-nothing", ranks: 4, tokens: []int{20, 9, 13, 5}, hidden: 640, topk: 3, experts: 12,
			weights: true, bias: 2, gen: routing.GenOptions{EmptyRanks: []int{2}}},
		{name: "sends-nothing", ranks: 2, tokens: []int{0, 11}, hidden: 128, topk: 2, experts: 8, weights: true},
		{name: "one-expert", ranks: 4, tokens: fill(4, 16), hidden: 128, topk: 1, experts: 16, weights: true,
			gen: routing.GenOptions{Always: []int{5}}},
		{name: "t0", ranks: 2, tokens: []int{0, 0}, hidden: 128, topk: 2, experts: 4, weights: true, bias: 1},
		{name: "t0-worst", ranks: 2, tokens: []int{0, 0}, maxTokens: 3, hidden: 128, topk: 2, experts: 4, worst: true},
		{name: "t1-top9", ranks: 4, tokens: fill(4, 1), hidden: 1152, topk: 9, experts: 36, weights: true, align: 3},
		{name: "top5-e512", ranks: 8, tokens: fill(8, 6), hidden: 128, topk: 5, experts: 512, weights: true},
		{name: "e8", ranks: 8, tokens: fill(8, 5), hidden: 256, topk: 1, experts: 8},
		{name: "one-rank", ranks: 1, tokens: []int{9}, hidden: 256, topk: 3, experts: 8, weights: true},
		{name: "y-is-recv", ranks: 4, tokens: []int{7, 11, 0, 5}, hidden: 128, topk: 4, experts: 32, yIsRecv: true},
		{name: "launch-override", ranks: 4, tokens: []int{20, 30, 10, 5}, hidden: 128, topk: 5, experts: 20,
			launch: &ep.LaunchConfig{SMs: 1, Threads: 32}},
		{name: "wide-in-place", ranks: 4, tokens: []int{20, 30, 10, 5}, hidden: 384, topk: 3, experts: 8, weights: true,
			bias: 1, inPlace: true, launch: &ep.LaunchConfig{SMs: 3, Copy: ep.CopyWide}, iters: 2},
		{name: "tma-worst-in-place", ranks: 2, tokens: []int{17, 9}, maxTokens: 20, hidden: 256, topk: 2, experts: 4,
			weights: true, worst: true, inPlace: true, launch: &ep.LaunchConfig{Copy: ep.CopyTMA}},
	}
}

// withI32 is specs with I32 top-k ids.
func withI32(specs []spec) []spec {
	out := make([]spec, len(specs))
	for i, s := range specs {
		s.i32 = true
		out[i] = s
	}
	return out
}

// I32 ids: every mode (non-cached, cached with and without ids, worst
// case, FP8, caller copies, masked -1 entries, no tokens) gives exactly
// what the reference computes from the same ids as int64, which the I64
// runs of the same specs are checked against too.
func TestDispatchCombineI32Host(t *testing.T) {
	for _, s := range withI32(hostSpecs()) {
		t.Run(s.String(), func(t *testing.T) {
			runSpec(t, newRig(t, ep.Host, s.ranks, s.config()), s)
		})
	}
}

func TestDispatchCombineHost(t *testing.T) {
	for _, s := range hostSpecs() {
		t.Run(s.String(), func(t *testing.T) {
			runSpec(t, newRig(t, ep.Host, s.ranks, s.config()), s)
		})
	}
}

// Top-k 1..9 over 4 ranks, one round each.
func TestTopKRangeHost(t *testing.T) {
	for k := 1; k <= 9; k++ {
		s := spec{name: "topk", ranks: 4, tokens: []int{6, 5, 0, 7}, hidden: 128, topk: k, experts: 36, weights: k%2 == 0,
			gen: routing.GenOptions{Masked: k}}
		t.Run(s.String(), func(t *testing.T) { runSpec(t, newRig(t, ep.Host, s.ranks, s.config()), s) })
	}
}

// 100 rounds on two host ranks: epochs, counters and handle slots keep
// working (the GPU variant runs -ep.iters rounds).
func TestRepeatedCallsHost(t *testing.T) {
	s := spec{name: "repeat", ranks: 2, tokens: []int{6, 4}, hidden: 128, topk: 2, experts: 8, weights: true, bias: 1,
		out: true, iters: 100, gen: routing.GenOptions{Masked: 2}}
	runSpec(t, newRig(t, ep.Host, s.ranks, s.config()), s)
}

// gpuSpecs are DeepEP-sized shapes for ranks GPUs.
func gpuSpecs(ranks int) []spec {
	e := 32 * ranks
	all := []spec{
		{name: "deepep", ranks: ranks, tokens: fill(ranks, 4096), hidden: 7168, topk: 8, experts: e, weights: true,
			gen: routing.GenOptions{Masked: 40}},
		{name: "deepep-y-is-recv-out", ranks: ranks, tokens: fill(ranks, 2048), hidden: 7168, topk: 8, experts: e,
			weights: true, yIsRecv: true, out: true},
		{name: "fp8", ranks: ranks, tokens: fill(ranks, 1024), hidden: 7168, topk: 8, experts: e, fp8: true,
			weights: true, iters: 2},
		{name: "worst-fp8", ranks: ranks, tokens: fill(ranks, 512), hidden: 2048, topk: 8, experts: e, fp8: true,
			worst: true, weights: true},
		{name: "odd-hidden", ranks: ranks, tokens: fill(ranks, 512), hidden: 2176, topk: 6, experts: 8 * ranks,
			weights: true, bias: 2, align: 128, gen: routing.GenOptions{Masked: 100}, iters: 3},
		{name: "empty-rank", ranks: ranks, tokens: append([]int{0}, fill(ranks-1, 700)...), hidden: 5120, topk: 4,
			experts: 4 * ranks, weights: true, gen: routing.GenOptions{EmptyRanks: []int{ranks - 1}}},
		{name: "one-expert", ranks: ranks, tokens: fill(ranks, 1000), hidden: 3072, topk: 1, experts: e,
			gen: routing.GenOptions{Always: []int{e - 1}}},
		{name: "t1-top9", ranks: ranks, tokens: fill(ranks, 1), hidden: 7168, topk: 9, experts: 9 * ranks, weights: true, bias: 1},
		{name: "t0", ranks: ranks, tokens: fill(ranks, 0), maxTokens: 16, hidden: 2048, topk: 8, experts: e, weights: true},
		{name: "e512", ranks: ranks, tokens: fill(ranks, 300), hidden: 1024, topk: 8, experts: 512, weights: true},
		{name: "wide-in-place", ranks: ranks, tokens: fill(ranks, 4096), hidden: 7168, topk: 8, experts: e, weights: true,
			inPlace: true, launch: &ep.LaunchConfig{Copy: ep.CopyWide}},
		{name: "tma-worst", ranks: ranks, tokens: fill(ranks, 4096), hidden: 7168, topk: 8, experts: e, weights: true,
			worst: true, launch: &ep.LaunchConfig{Copy: ep.CopyTMA}},
		{name: "tma-fp8-in-place", ranks: ranks, tokens: fill(ranks, 2000), hidden: 7168, topk: 8, experts: e, fp8: true,
			inPlace: true, weights: true, launch: &ep.LaunchConfig{Copy: ep.CopyTMA, Threads: 256}},
	}
	if ranks == 2 {
		all[5].gen.EmptyRanks = nil // two ranks: an empty one leaves too few experts for top-4
	}
	return all
}

func TestDispatchCombineGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no CUDA GPU")
	}
	// 2, 4 and 8 ranks on the GPUs present (several ranks to a GPU when
	// there are fewer).
	for _, ranks := range []int{2, 4, 8} {
		for _, s := range gpuSpecs(ranks) {
			t.Run(s.String(), func(t *testing.T) { runSpec(t, newRig(t, ep.CUDA, s.ranks, s.config()), s) })
		}
	}
}

// The GPU specs with I32 ids (the widening kernel before notify and
// dispatch), against the same reference as I64.
func TestDispatchCombineI32GPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no CUDA GPU")
	}
	for _, ranks := range []int{2, 8} {
		for _, s := range withI32(gpuSpecs(ranks)) {
			t.Run(s.String(), func(t *testing.T) { runSpec(t, newRig(t, ep.CUDA, s.ranks, s.config()), s) })
		}
	}
}

func TestRepeatedCallsGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no CUDA GPU")
	}
	// 8 ranks, spread over the GPUs present.
	ranks := 8
	s := spec{name: "repeat", ranks: ranks, tokens: fill(ranks, 256), hidden: 2048, topk: 8, experts: 32 * ranks,
		weights: true, bias: 1, iters: *gpuIters, gen: routing.GenOptions{Masked: 50}}
	runSpec(t, newRig(t, ep.CUDA, s.ranks, s.config()), s)
}

// Ranks sharing a GPU: a launch too large for every rank's kernels to be
// resident at once is refused before anything is launched (8 ranks x 32
// SMs on one 132-SM GPU), the defaults shrink to fit, and a per-call
// override above the share is refused while the Buffer stays usable.
func TestSharedGPULaunchBudget(t *testing.T) {
	n := gpuCount(t)
	if n == 0 {
		t.Skip("no CUDA GPU")
	}
	const ranks = 8
	if n >= ranks {
		t.Skipf("%d GPUs: 8 ranks do not share one here", n)
	}
	d, err := ep.OpenDevice(ep.CUDA, 0)
	require.NoError(t, err)
	sms := d.Info().SMs
	require.NoError(t, d.Close())
	shared := (ranks + n - 1) / n
	budget := max(1, sms/shared-1)
	cfg := ep.Config{MaxTokens: 64, Hidden: 256, TopK: 4, Experts: 32}

	// Too large: refused at NewBuffer, naming the share.
	big := cfg
	big.Dispatch.SMs = budget + 1
	boots, err := bootstrap.NewInProcess(ranks, bootstrap.Config{Timeout: 30 * time.Second})
	require.NoError(t, err)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for i := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev, err := ep.OpenDevice(ep.CUDA, i%n)
			if err != nil {
				errs[i] = err
				return
			}
			defer dev.Close()
			b, err := ep.NewBuffer(context.Background(), boots[i], dev, big)
			if err == nil {
				errs[i] = errors.Join(errors.New("accepted"), b.Close(context.Background()))
				return
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.Error(t, err, "rank %d", i)
		require.Contains(t, err.Error(), fmt.Sprintf("share of its GPU is %d blocks", budget), "rank %d", i)
		require.NoError(t, boots[i].Close())
	}

	// Defaults fit; an override above the share is refused per call.
	r := newRig(t, ep.CUDA, ranks, cfg)
	for i, b := range r.bufs {
		lc, err := b.LaunchFor(ep.OpDispatch, nil)
		require.NoError(t, err)
		require.LessOrEqual(t, lc.SMs, budget, "rank %d default dispatch", i)
		_, err = b.LaunchFor(ep.OpCombine, &ep.LaunchConfig{SMs: budget + 1})
		require.ErrorContains(t, err, "share of its GPU", "rank %d override", i)
	}
}

// The hardening soak: many small checked rounds (full dispatch, cached
// dispatch, combine, each compared with the reference) with 8 ranks on the
// GPUs present, allocations unchanged from round 1 to the last (runSpec
// checks it). Run with -ep.soak=10000.
func TestSoakGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no CUDA GPU")
	}
	if *soakRounds == 0 {
		t.Skip("set -ep.soak=N to run N soak rounds")
	}
	ranks := 8
	s := spec{name: "soak", ranks: ranks, tokens: fill(ranks, 48), hidden: 256, topk: 4, experts: 4 * ranks,
		weights: true, bias: 1, iters: *soakRounds, gen: routing.GenOptions{Masked: 10}}
	runSpec(t, newRig(t, ep.CUDA, s.ranks, s.config()), s)
}
