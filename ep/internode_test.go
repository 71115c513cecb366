package ep_test

// The internode mode through the ep API on the host backend: goroutine
// ranks split into virtual nodes (Config.VirtualNodes), so every
// cross-node row travels over port channels on the TCP transport. Results
// are compared with package internode's plain-Go reference
// (ReferenceDispatch, ReferenceCombine), which shares no code with the
// Notify twins the Buffer runs.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"github.com/goep-dev/goep/routing"
)

// interRouting kinds: random ids with -1 and ids outside [-1, E) mixed in,
// every id one expert, and routings that leave expert 0 and rank 1 empty.
const (
	routeRandom = iota
	routeOneExpert
	routeSkipExpert
)

func interIDs(rng *rand.Rand, s internode.Shape, tokens, kind int) []int64 {
	ids := make([]int64, tokens*s.TopK)
	for j := range ids {
		switch kind {
		case routeOneExpert:
			ids[j] = int64(s.Experts - 1)
			if j%s.TopK != 0 {
				ids[j] = -1 // one expert per token, the rest none
			}
		case routeSkipExpert:
			// Nothing for expert 0 nor for the experts of rank 1.
			le := int64(s.LocalExperts())
			e := 1 + rng.Int64N(int64(s.Experts-1))
			if e/le == 1 {
				e = -1
			}
			ids[j] = e
		default:
			switch x := rng.IntN(16); {
			case x == 0:
				ids[j] = -1
			case x == 1:
				ids[j] = int64(s.Experts + rng.IntN(3))
			case x == 2:
				ids[j] = -2 - int64(rng.IntN(3))
			default:
				ids[j] = rng.Int64N(int64(s.Experts))
			}
		}
	}
	return ids
}

// interRound is one round's inputs on every rank.
type interRound struct {
	fp8, weights, worst bool
	i32                 bool // top-k ids as int32
	align               int
	in                  []internode.RankInput
}

func (ir interRound) args(t testing.TB, r *rig, rank int, s internode.Shape) ep.DispatchArgs {
	d := r.devs[rank]
	in := ir.in[rank]
	n := len(in.TopK) / s.TopK
	a := ep.DispatchArgs{TopK: ep.NewTensor(toDev(t, d, in.TopK), ep.I64, n, s.TopK), ExpertAlignment: ir.align,
		WorstCase: ir.worst, Stream: r.streams[rank]}
	if ir.i32 {
		ids := make([]int32, len(in.TopK))
		for j, v := range in.TopK {
			ids[j] = int32(v)
		}
		a.TopK = ep.NewTensor(toDev(t, d, ids), ep.I32, n, s.TopK)
	}
	if ir.fp8 {
		a.X = ep.NewTensor(toDev(t, d, in.XFP8), ep.FP8E4M3, n, s.Hidden)
		a.Scales = ep.NewTensor(toDev(t, d, in.Scales), ep.F32, n, s.Hidden/128)
	} else {
		a.X = ep.NewTensor(toDev(t, d, in.X), ep.BF16, n, s.Hidden)
	}
	if ir.weights {
		a.Weights = ep.NewTensor(toDev(t, d, in.Weights), ep.F32, n, s.TopK)
	}
	return a
}

func newInterRound(rng *rand.Rand, s internode.Shape, tokens []int, kind int, fp8, weights bool, ids [][]int64) interRound {
	ir := interRound{fp8: fp8, weights: weights, in: make([]internode.RankInput, s.World())}
	for r := range ir.in {
		n := tokens[r]
		in := internode.RankInput{}
		if ids != nil {
			in.TopK = ids[r]
		} else {
			in.TopK = interIDs(rng, s, n, kind)
		}
		if fp8 {
			in.XFP8, in.Scales = randFP8(rng, n*s.Hidden), randF32(rng, n*s.Hidden/128)
		} else {
			in.X = intranodetest.RandBF16(rng, n*s.Hidden, false)
		}
		if weights {
			in.Weights = randF32(rng, n*s.TopK)
		}
		ir.in[r] = in
	}
	return ir
}

// checkInterDispatch compares one rank's dispatch result with the
// reference's output for that rank.
func checkInterDispatch(t *testing.T, r *rig, rank int, s internode.Shape, ir interRound, res ep.DispatchResult, want internode.RankOutput, cached bool, what string) {
	t.Helper()
	d := r.devs[rank]
	require.NoError(t, r.streams[rank].Synchronize())
	n, k, h := want.Received(), s.TopK, s.Hidden
	what = fmt.Sprintf("%s: rank %d", what, rank)
	if ir.worst || cached && res.NumRecv < 0 {
		require.Equal(t, -1, res.NumRecv, what)
		require.Equal(t, r.bufs[rank].MaxRecv(), res.RecvX.Rows(), "%s: worst-case views", what)
		sameSlice(t, []int32{int32(n)}, fromDev[int32](t, d, res.RecvCount.Ptr, 1), "%s: received count on the device", what)
		ids := fromDev[int64](t, d, res.RecvTopK.Ptr, r.bufs[rank].MaxRecv()*k)
		for i, v := range ids[n*k:] {
			if v != -1 { // require only on a failure (microseconds a call)
				require.Equal(t, int64(-1), v, "%s: top-k id %d past the received rows", what, n*k+i)
			}
		}
	} else {
		require.Equal(t, n, res.NumRecv, what)
	}
	if !cached {
		if ir.worst {
			sameSlice(t, toInts(toI32s(want.TokensPerLocalExpert)), toInts(fromDev[int32](t, d, res.TokensPerExpertDevice.Ptr, s.LocalExperts())),
				"%s: tokens per expert on the device", what)
		} else {
			sameSlice(t, want.TokensPerLocalExpert, res.TokensPerExpert, "%s: tokens per expert", what)
		}
	}
	sameSlice(t, want.RankPrefix, fromDev[int32](t, d, res.RankPrefix.Ptr, s.World()), "%s: rank prefix", what)
	sameSlice(t, want.RecvTopK, fromDev[int64](t, d, res.RecvTopK.Ptr, n*k), "%s: top-k ids", what)
	sameSlice(t, want.RecvSrcToken, fromDev[int32](t, d, res.RecvSrcToken.Ptr, n), "%s: source tokens", what)
	if ir.fp8 {
		sameSlice(t, want.RecvXFP8, fromDev[uint8](t, d, res.RecvX.Ptr, n*h), "%s: fp8 rows", what)
		sameFloats(t, want.RecvScales, fromDev[float32](t, d, res.RecvScales.Ptr, n*h/128), "%s: scales", what)
	} else {
		sameSlice(t, want.RecvX, fromDev[uint16](t, d, res.RecvX.Ptr, n*h), "%s: rows", what)
	}
	if ir.weights {
		sameFloats(t, want.RecvWeights, fromDev[float32](t, d, res.RecvWeights.Ptr, n*k), "%s: weights", what)
	} else {
		require.False(t, res.RecvWeights.Present(), what)
	}
}

func toI32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// interDispatch runs one dispatch on every rank (cached with handles) and
// checks it; it returns the results and the reference outputs.
func interDispatch(t *testing.T, r *rig, s internode.Shape, ir interRound, handles []*ep.Handle, what string) ([]ep.DispatchResult, []internode.RankOutput) {
	t.Helper()
	want, err := internode.ReferenceDispatch(s, ir.in, ir.align)
	require.NoError(t, err)
	invalid := make([]int, s.World())
	for rank, in := range ir.in {
		ly, err := internode.ReferenceLayout(s, in.TopK)
		require.NoError(t, err)
		invalid[rank] = ly.Invalid
	}
	res := make([]ep.DispatchResult, s.World())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		a := ir.args(t, r, i, s)
		if handles != nil {
			a.Handle, a.TopK, a.ExpertAlignment = handles[i], ep.Tensor{}, 0
		}
		var err error
		res[i], err = b.Dispatch(ctx, a)
		var inv *ep.InvalidIDsError
		switch {
		case handles == nil && !ir.worst && invalid[i] > 0:
			if !errors.As(err, &inv) || inv.Count != invalid[i] {
				return fmt.Errorf("want %d invalid ids reported, got %v", invalid[i], err)
			}
			return nil
		case err != nil:
			return err
		}
		if handles == nil && ir.worst {
			if err := b.InvalidIDs(); invalid[i] > 0 && (!errors.As(err, &inv) || inv.Count != invalid[i]) {
				return fmt.Errorf("want %d invalid ids from InvalidIDs, got %v", invalid[i], err)
			}
		}
		return nil
	}), what)
	for i := range res {
		checkInterDispatch(t, r, i, s, ir, res[i], want[i], handles != nil, what)
	}
	return res, want
}

// interCombine combines handles on every rank with random expert outputs
// (and weights, biases) and compares with ReferenceCombine bit for bit.
func interCombine(t *testing.T, r *rig, s internode.Shape, rng *rand.Rand, handles []*ep.Handle, dispatched []internode.RankOutput,
	tokens []int, weights bool, biases int, inPlace bool, what string) {
	t.Helper()
	w, h, k := s.World(), s.Hidden, s.TopK
	cin := make([]internode.CombineInput, w)
	for d := range cin {
		n := dispatched[d].Received()
		cin[d].Y = intranodetest.RandBF16(rng, n*h, false)
		if weights {
			cin[d].Weights = randF32(rng, n*k)
		}
		if biases > 0 {
			cin[d].Bias0 = intranodetest.RandBF16(rng, tokens[d]*h, false)
		}
		if biases > 1 {
			cin[d].Bias1 = intranodetest.RandBF16(rng, tokens[d]*h, false)
		}
	}
	want, err := internode.ReferenceCombine(s, tokens, dispatched, cin, internode.CombineOptions{Partial: internode.PartialBF16})
	require.NoError(t, err)
	got := make([]ep.CombineResult, w)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		d, n := r.devs[i], dispatched[i].Received()
		a := ep.CombineArgs{Handle: handles[i], Stream: r.streams[i]}
		if inPlace {
			x, wt, err := b.CombineInput(handles[i])
			if err != nil {
				return err
			}
			if err := d.CopyIn(x.Ptr, bytesOf(cin[i].Y)); n > 0 && err != nil {
				return err
			}
			a.X = x
			if weights {
				if err := d.CopyIn(wt.Ptr, bytesOf(cin[i].Weights)); n > 0 && err != nil {
					return err
				}
				a.Weights = wt
			}
		} else {
			// A worst-case handle's N is not known on the host: inputs
			// have MaxRecv rows, of which the first N are read.
			rows := n
			if handles[i].NumRecv() < 0 {
				rows = b.MaxRecv()
			}
			a.X = ep.NewTensor(toDev(t, d, append(append([]uint16(nil), cin[i].Y...), make([]uint16, (rows-n)*h)...)), ep.BF16, rows, h)
			if weights {
				a.Weights = ep.NewTensor(toDev(t, d, append(append([]float32(nil), cin[i].Weights...), make([]float32, (rows-n)*k)...)), ep.F32, rows, k)
			}
		}
		for j, bias := range [][]uint16{cin[i].Bias0, cin[i].Bias1} {
			if bias != nil {
				a.Bias[j] = ep.NewTensor(toDev(t, d, bias), ep.BF16, tokens[i], h)
			}
		}
		var err error
		got[i], err = b.Combine(ctx, a)
		return err
	}), what)
	for i := range got {
		require.NoError(t, r.streams[i].Synchronize())
		sameSlice(t, want[i].X, fromDev[uint16](t, r.devs[i], got[i].X.Ptr, tokens[i]*h), "%s: rank %d: combined rows", what, i)
		if weights {
			sameFloats(t, want[i].Weights, fromDev[float32](t, r.devs[i], got[i].Weights.Ptr, tokens[i]*k), "%s: rank %d: combined weights", what, i)
		}
	}
}

func handlesOf(res []ep.DispatchResult) []*ep.Handle {
	h := make([]*ep.Handle, len(res))
	for i, r := range res {
		h[i] = r.Handle
	}
	return h
}

// TestInternodeHost: 2 virtual nodes x 2 and x 4 goroutine ranks; random
// routings with -1 and out-of-range ids, a rank with T = 0, every token to
// one expert, an expert and a rank that receive nothing, T = 0 everywhere;
// BF16 with weights and FP8 with scales; non-cached (host wait and worst
// case), cached (of the last handle and of an older one), and combines of
// the last dispatch and of older ones.
func TestInternodeHost(t *testing.T) { internodeSuite(t, ep.Host, nil, 2, 4) }

// TestInternodeEmulated: the same on 2 virtual nodes x 2 ranks under the
// CPU emulation of the real kernels, where the Buffer takes package
// internode's device-pointer path (as on CUDA): the callers' tensors and
// the receive region in place, no host copies, no host meeting between
// the steps.
func TestInternodeEmulated(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	// Build the modules the calls launch before any rank spins in a kernel.
	for _, k := range []string{internode.KernelNotify, routing.KernelWidenIDs} {
		_, err := cpuemu.Unknown(k)
		require.NoError(t, err)
	}
	before := make(map[string]int64)
	for _, k := range internode.Kernels {
		before[k] = cpuemu.Launches(k)
	}
	internodeSuite(t, ep.Host, func(i int) (ep.Device, error) {
		return cpuemu.Open(i, cpuemu.Options{SMs: 2, WaitLimit: time.Minute})
	}, 2)
	// The calls ran the kernels: 7 dispatches (3 cached: no notify round,
	// internode.DeviceDispatch.Cached; two of the handle dispatched last,
	// one of an older handle after internode.Notify.Resume) and 6
	// combines per rank, of which 2 replay a cached route-only dispatch
	// first (an older dispatch's, resumed; a second combine of it), so 4
	// notify rounds only; each combine's final reduce on a grid of its own
	// (the default).
	for k, want := range map[string]int64{internode.KernelNotify: 4 * 4, internode.KernelDispatch: 4 * (7 + 2),
		internode.KernelCombine: 4 * 6, internode.KernelCombineReduce: 4 * 6} {
		require.Equal(t, want, cpuemu.Launches(k)-before[k], "%s launches", k)
	}
	require.Len(t, internode.Kernels, 4, "a kernel without an expected launch count here")
}

// TestInternodeGPU: the same on the GPUs present (rank r on GPU r mod the
// GPUs, so the 4 and 8 ranks share them when there are fewer), through
// package internode's kernels in their device-pointer form: 2 virtual
// nodes whose traffic goes over TCP, CUDA IPC inside a node.
func TestInternodeGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no GPU")
	}
	internodeSuite(t, ep.CUDA, nil, 2, 4)
}

// TestInternodeOverPort: the suite with the port over CUDA IPC between
// the virtual nodes ($GOEP_NET_TRANSPORT=ipc) instead of TCP: host memory
// copies by the proxy on the host backend and under the CPU emulation,
// the GPUs' copy engines on CUDA (TestInternodeOverPortGPU). The Buffer
// stages nothing for it (SizeHint.NetworkStaging 0).
func TestInternodeOverPort(t *testing.T) {
	t.Setenv(channels.NetTransportEnv, "ipc")
	t.Run("host", func(t *testing.T) { internodeSuite(t, ep.Host, nil, 2) })
	t.Run("emulated", func(t *testing.T) {
		cpuemu.SkipUnavailable(t)
		for _, k := range []string{internode.KernelNotify, routing.KernelWidenIDs} {
			_, err := cpuemu.Unknown(k)
			require.NoError(t, err)
		}
		internodeSuite(t, ep.Host, func(i int) (ep.Device, error) {
			return cpuemu.Open(i, cpuemu.Options{SMs: 2, WaitLimit: time.Minute})
		}, 2)
	})
	t.Run("size-hint", func(t *testing.T) {
		h, err := ep.SizeHints(ep.Config{MaxTokens: 64, Hidden: 128, TopK: 2, Experts: 8, VirtualNodes: 2}, 4)
		require.NoError(t, err)
		require.Zero(t, h.NetworkStaging)
	})
}

func TestInternodeOverPortGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no GPU")
	}
	t.Setenv(channels.NetTransportEnv, "ipc")
	internodeSuite(t, ep.CUDA, nil, 2, 4)
	t.Run("handle-order", func(t *testing.T) { internodeHandleOrder(t, ep.CUDA, nil, 2, 1) })
}

// internodeRig makes the Buffers of the internode suites on topo: hidden
// 128, top-3 of 2 experts a rank, FP8 buffers, 4 handle slots, maxTokens
// tokens a rank (open: other devices than ep.OpenDevice's).
func internodeRig(t *testing.T, kind ep.Kind, open func(i int) (ep.Device, error), topo internode.Topology, maxTokens int) (internode.Shape, ep.Config, *rig) {
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 3, Experts: 2 * w}
	cfg := ep.Config{MaxTokens: maxTokens, Hidden: s.Hidden, TopK: s.TopK, Experts: s.Experts, FP8: true, Handles: 4,
		Timeout: 20 * time.Second, VirtualNodes: topo.Nodes}
	if open != nil {
		return s, cfg, newRigOn(t, kind, w, cfg, open)
	}
	return s, cfg, newRig(t, kind, w, cfg)
}

// internodeSuite runs the checks on 2 virtual nodes of each of pers ranks,
// on devices of kind (open: other devices than ep.OpenDevice's).
func internodeSuite(t *testing.T, kind ep.Kind, open func(i int) (ep.Device, error), pers ...int) {
	for _, per := range pers {
		topo := internode.Topology{Nodes: 2, RanksPerNode: per}
		t.Run(fmt.Sprintf("2x%d", per), func(t *testing.T) {
			w := topo.World()
			s, cfg, r := internodeRig(t, kind, open, topo, 20)
			for i, b := range r.bufs {
				require.Equal(t, ep.ModeInternode, b.Mode(), "rank %d", i)
				require.Equal(t, 2, b.SizeHint().Nodes)
			}
			rng := rand.New(rand.NewPCG(7, uint64(per)))
			tokens := make([]int, w)
			for i := range tokens {
				tokens[i] = 1 + rng.IntN(cfg.MaxTokens)
			}
			tokens[1] = 0

			// 1. BF16 with weights, random routing, alignment 4.
			a := newInterRound(rng, s, tokens, routeRandom, false, true, nil)
			a.align = 4
			resA, wantA := interDispatch(t, r, s, a, nil, "bf16 dispatch")
			// Cached, new rows, the same routing.
			ids := make([][]int64, w)
			for i := range ids {
				ids[i] = a.in[i].TopK
			}
			a2 := newInterRound(rng, s, tokens, routeRandom, false, true, ids)
			interDispatch(t, r, s, a2, handlesOf(resA), "bf16 cached dispatch")

			// 2. FP8 without weights, every token to one expert, int32 ids.
			f := newInterRound(rng, s, tokens, routeOneExpert, true, false, nil)
			f.i32 = true
			resF, wantF := interDispatch(t, r, s, f, nil, "fp8 dispatch, one expert")

			// Combines: the FP8 handle's (the last dispatch), then the BF16
			// one's (an older dispatch: replayed), twice, with weights and
			// both biases, in place and not.
			interCombine(t, r, s, rng, handlesOf(resF), wantF, tokens, false, 0, true, "combine of the last dispatch")
			interCombine(t, r, s, rng, handlesOf(resA), wantA, tokens, true, 2, false, "combine of an older dispatch")
			interCombine(t, r, s, rng, handlesOf(resA), wantA, tokens, true, 1, true, "second combine of one dispatch")
			// A cached dispatch of the FP8 handle, no longer the last one
			// (on devices that run the kernels it resumes the handle's kept
			// layout: no notify round), new rows, then its combine.
			idsF := make([][]int64, w)
			for i := range idsF {
				idsF[i] = f.in[i].TopK
			}
			f2 := newInterRound(rng, s, tokens, routeOneExpert, true, false, idsF)
			interDispatch(t, r, s, f2, handlesOf(resF), "fp8 cached dispatch of an older handle")
			interCombine(t, r, s, rng, handlesOf(resF), wantF, tokens, false, 1, false, "combine after a cached dispatch of an older handle")

			// 3. Worst case, an expert and a rank that receive nothing.
			e := newInterRound(rng, s, tokens, routeSkipExpert, false, true, nil)
			e.worst = true
			resE, wantE := interDispatch(t, r, s, e, nil, "worst-case dispatch, empty expert and rank")
			require.Zero(t, wantE[1].Received())
			interDispatch(t, r, s, e, handlesOf(resE), "cached dispatch of a worst-case handle")
			interCombine(t, r, s, rng, handlesOf(resE), wantE, tokens, true, 0, false, "combine of a worst-case handle")

			// 4. No tokens anywhere.
			zero := make([]int, w)
			z := newInterRound(rng, s, zero, routeRandom, true, false, nil)
			resZ, wantZ := interDispatch(t, r, s, z, nil, "T=0 everywhere")
			interCombine(t, r, s, rng, handlesOf(resZ), wantZ, zero, false, 0, false, "combine of T=0")

			for _, res := range [][]ep.DispatchResult{resA, resF, resE, resZ} {
				for _, x := range res {
					x.Handle.Release()
				}
			}
			// The barrier meets every rank.
			ctx := context.Background()
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				_, err := b.Barrier(ctx, r.streams[i], nil)
				return err
			}))
		})
	}
}

// TestInternodeBadConfig: virtual-node counts that do not divide the ranks
// are refused by SizeHints and NewBuffer, and ranks that disagree on them
// get an error naming the field and the rank.
func TestInternodeBadConfig(t *testing.T) {
	cfg := ep.Config{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 8, VirtualNodes: 3}
	_, err := ep.SizeHints(cfg, 4)
	require.ErrorContains(t, err, "3 virtual nodes do not divide 4 ranks")

	t.Setenv(internode.VirtualNodesEnv, "x")
	cfg.VirtualNodes = 0
	_, err = ep.SizeHints(cfg, 4)
	require.ErrorContains(t, err, internode.VirtualNodesEnv)
	t.Setenv(internode.VirtualNodesEnv, "")

	// Rank 1 asks for 2 virtual nodes, the others for none.
	errs := runBuffers(t, 4, func(rank int) ep.Config {
		c := ep.Config{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 8, Timeout: 5 * time.Second, VirtualNodes: 1}
		if rank == 1 {
			c.VirtualNodes = 2
		}
		return c
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		if rank != 1 {
			require.ErrorContains(t, err, "rank 1", "rank %d", rank)
		}
		require.Regexp(t, "fields: .*nodes", err.Error(), "rank %d", rank)
	}
}

// runBuffers builds a Buffer on each of ranks host ranks with cfg(rank)
// and returns each rank's NewBuffer error (closing what was built).
func runBuffers(t *testing.T, ranks int, cfg func(rank int) ep.Config) []error {
	t.Helper()
	r := &rig{bufs: make([]*ep.Buffer, ranks)}
	boots := newBoots(t, ranks)
	errs := make([]error, ranks)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = r.run(func(i int, _ *ep.Buffer) error {
		d, err := ep.OpenDevice(ep.Host, i)
		if err != nil {
			errs[i] = err
			return nil
		}
		defer d.Close()
		b, err := ep.NewBuffer(ctx, boots[i], d, cfg(i))
		errs[i] = err
		if b != nil {
			errs[i] = errors.Join(errors.New("built"), b.Close(ctx))
		}
		return nil
	})
	return errs
}

func newBoots(t *testing.T, ranks int) []bootstrap.Bootstrap {
	t.Helper()
	boots, err := bootstrap.NewInProcess(ranks, bootstrap.Config{Timeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, b := range boots {
			_ = b.Close()
		}
	})
	return boots
}

// 1 (issue 18). An internode Buffer after Close: every exported method of
// it, of a handle it returned and of its events answers without a panic,
// and calls are refused with ErrClosed.
func TestInternodeAPIAfterClose(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 2, Experts: 8}
	r := newRig(t, ep.Host, 4, ep.Config{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 8, VirtualNodes: 2, Timeout: 10 * time.Second})
	rng := rand.New(rand.NewPCG(3, 4))
	ir := newInterRound(rng, s, []int{4, 2, 3, 1}, routeRandom, false, false, nil)
	res, _ := interDispatch(t, r, s, ir, nil, "dispatch")
	ctx := context.Background()
	require.NoError(t, r.close())
	for i, b := range r.bufs {
		for _, v := range []any{b, res[i].Handle, res[i].Done} {
			for _, f := range apicheck.Call(v, apicheck.Options{}) {
				t.Errorf("rank %d: %v", i, f)
			}
		}
		_, err := b.Dispatch(ctx, ir.args(t, r, i, s))
		require.ErrorIs(t, err, ep.ErrClosed)
		_, err = b.Combine(ctx, ep.CombineArgs{Handle: res[i].Handle})
		require.Error(t, err)
	}
}

// TestInternodeGraphReplay: in internode mode each rank captures a
// worst-case dispatch and the combine of its handle into a graph (what an
// engine does for decode steps) and replays it with new ids, rows and
// weights loaded into the captured tensors; the combine's expert outputs
// are the received rows themselves. Every replay equals the reference:
// dispatch as in checkInterDispatch (worst-case views, counts on the
// device), combine bit for bit. On the host backend and under the CPU
// emulation a replay issues the calls again; on the GPUs present it
// launches the captured kernels, 2 x 2 and 2 x 4 ranks.
func TestInternodeGraphReplay(t *testing.T) {
	type backend struct {
		name string
		kind ep.Kind
		open func(i int) (ep.Device, error)
		pers []int
	}
	backends := []backend{{name: "host", kind: ep.Host, pers: []int{2}},
		{name: "emulated", kind: ep.Host, pers: []int{2}, open: func(i int) (ep.Device, error) {
			return cpuemu.Open(i, cpuemu.Options{SMs: 2, WaitLimit: time.Minute})
		}}}
	if gpuCount(t) > 0 {
		backends = append(backends, backend{name: "cuda", kind: ep.CUDA, pers: []int{2, 4}})
	}
	for _, bk := range backends {
		for _, per := range bk.pers {
			t.Run(fmt.Sprintf("%s/2x%d", bk.name, per), func(t *testing.T) {
				if bk.name == "emulated" {
					cpuemu.SkipUnavailable(t)
					// Built before any rank spins in a kernel.
					for _, k := range []string{internode.KernelNotify, routing.KernelWidenIDs} {
						_, err := cpuemu.Unknown(k)
						require.NoError(t, err)
					}
				}
				checkInterGraphReplay(t, bk.kind, bk.open, internode.Topology{Nodes: 2, RanksPerNode: per})
			})
		}
	}
}

func checkInterGraphReplay(t *testing.T, kind ep.Kind, open func(i int) (ep.Device, error), topo internode.Topology) {
	const replays = 4
	w := topo.World()
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 3, Experts: 2 * w}
	cfg := ep.Config{MaxTokens: 24, Hidden: s.Hidden, TopK: s.TopK, Experts: s.Experts, Handles: replays + 2,
		Timeout: 20 * time.Second, VirtualNodes: topo.Nodes}
	if kind == ep.CUDA {
		s.Hidden, cfg.Hidden, cfg.MaxTokens = 2048, 2048, 512
	}
	var r *rig
	if open != nil {
		r = newRigOn(t, kind, w, cfg, open)
	} else {
		r = newRig(t, kind, w, cfg)
	}
	rng := rand.New(rand.NewPCG(11, uint64(w)))
	tokens := make([]int, w)
	for i := range tokens {
		tokens[i] = 1 + rng.IntN(cfg.MaxTokens)
	}
	// The captured tensors, refilled before each replay.
	ids, xs, wts := make([]uintptr, w), make([]uintptr, w), make([]uintptr, w)
	for i, d := range r.devs {
		n := tokens[i]
		ids[i], xs[i], wts[i] = alloc(t, d, 8*n*s.TopK), alloc(t, d, 2*n*s.Hidden), alloc(t, d, 4*n*s.TopK)
	}
	load := func(seed uint64) interRound {
		ir := newInterRound(rand.New(rand.NewPCG(seed, 5)), s, tokens, routeRandom, false, true, nil)
		ir.worst = true
		for i, d := range r.devs {
			require.NoError(t, d.CopyIn(ids[i], bytesOf(ir.in[i].TopK)))
			require.NoError(t, d.CopyIn(xs[i], bytesOf(ir.in[i].X)))
			require.NoError(t, d.CopyIn(wts[i], bytesOf(ir.in[i].Weights)))
		}
		return ir
	}
	ir := load(0)
	ctx := context.Background()
	res := make([]ep.DispatchResult, w)
	comb := make([]ep.CombineResult, w)
	graphs := r.capture(t, func(i int, b *ep.Buffer, st ep.Stream) error {
		n := tokens[i]
		var err error
		res[i], err = b.Dispatch(ctx, ep.DispatchArgs{TopK: ep.NewTensor(ids[i], ep.I64, n, s.TopK),
			X: ep.NewTensor(xs[i], ep.BF16, n, s.Hidden), Weights: ep.NewTensor(wts[i], ep.F32, n, s.TopK),
			WorstCase: true, Stream: st})
		if err != nil {
			return err
		}
		comb[i], err = b.Combine(ctx, ep.CombineArgs{X: res[i].RecvX, Weights: res[i].RecvWeights, Handle: res[i].Handle, Stream: st})
		return err
	})
	for rep := 1; rep <= replays; rep++ {
		ir = load(uint64(rep))
		require.NoError(t, r.replay(graphs), "replay %d", rep)
		what := fmt.Sprintf("replay %d", rep)
		want, err := internode.ReferenceDispatch(s, ir.in, 0)
		require.NoError(t, err)
		cin := make([]internode.CombineInput, w)
		for i := range res {
			checkInterDispatch(t, r, i, s, ir, res[i], want[i], false, what)
			cin[i] = internode.CombineInput{Y: want[i].RecvX, Weights: want[i].RecvWeights}
		}
		wantC, err := internode.ReferenceCombine(s, tokens, want, cin, internode.CombineOptions{Partial: internode.PartialBF16})
		require.NoError(t, err)
		for i := range comb {
			sameSlice(t, wantC[i].X, fromDev[uint16](t, r.devs[i], comb[i].X.Ptr, tokens[i]*s.Hidden), "%s: rank %d: combined rows", what, i)
			sameFloats(t, wantC[i].Weights, fromDev[float32](t, r.devs[i], comb[i].Weights.Ptr, tokens[i]*s.TopK),
				"%s: rank %d: combined weights", what, i)
		}
	}
	for _, x := range res {
		x.Handle.Release()
	}
}

// TestInternodeMemory: what an internode Buffer holds is what SizeHints
// says (the communicator adds under 256 KiB; the host backend's twins
// allocate none of Internode.Kernels), with the send memory in device
// memory and in pinned host memory; on the host backend, under the CPU
// emulation, which runs the kernels, and on the GPUs present (whose TCP
// connections also pin staging buffers: host-mapped memory is only
// bounded below there).
func TestInternodeMemory(t *testing.T) {
	// host-staged: the host backend staging its TCP traffic as GPUs do
	// ($GOEP_TCP_STAGE=always), so the staging buffers are allocated.
	backends := []string{"host", "host-staged", "emulated"}
	if gpuCount(t) > 0 {
		backends = append(backends, "cuda")
	}
	for _, bk := range backends {
		for _, send := range []string{"", "host"} {
			t.Run(fmt.Sprintf("%s/send=%s", bk, send), func(t *testing.T) {
				kind := ep.Host
				var open func(i int) (ep.Device, error)
				switch bk {
				case "emulated":
					cpuemu.SkipUnavailable(t)
					open = func(i int) (ep.Device, error) { return cpuemu.Open(i, cpuemu.Options{SMs: 2, WaitLimit: time.Minute}) }
				case "cuda":
					kind = ep.CUDA
				case "host-staged":
					t.Setenv("GOEP_TCP_STAGE", "always")
				}
				t.Setenv(internode.SendMemoryEnv, send)
				topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
				cfg := ep.Config{MaxTokens: 200, Hidden: 1024, TopK: 4, Experts: 8, FP8: true, VirtualNodes: topo.Nodes}
				hint, err := ep.SizeHints(cfg, topo.World())
				require.NoError(t, err)
				im := hint.Internode
				require.Positive(t, im.RDMA)
				require.Positive(t, im.NVLink)
				require.Positive(t, im.Send)
				require.Positive(t, im.Kernels)
				require.Equal(t, send == "host", im.SendHost)
				// One TCP connection to the other node's same local rank.
				nc, err := channels.NetworkConfig{VirtualNodes: topo.Nodes}.Resolve(topo.World())
				require.NoError(t, err)
				per, err := nc.StagingBytes()
				require.NoError(t, err)
				require.Equal(t, (topo.Nodes-1)*per, hint.NetworkStaging)
				staged := 0 // what the communicator's connections pin here
				if bk != "host" && bk != "emulated" {
					staged = hint.NetworkStaging
				}
				var r *rig
				if open != nil {
					r = newRigOn(t, kind, topo.World(), cfg, open)
				} else {
					r = newRig(t, kind, topo.World(), cfg)
				}
				want := hint.Device
				if bk == "host" || bk == "host-staged" { // the Go twins: no kernel tables
					want -= im.Kernels
				}
				for i, b := range r.bufs {
					require.Equal(t, hint, b.SizeHint(), "rank %d", i)
					m := b.Memory()
					require.GreaterOrEqual(t, m.Device, int64(want), "rank %d", i)
					// The communicator adds its watchdog, semaphores and
					// proxy (128 KiB here); every internode region is larger.
					require.Less(t, m.Device, int64(want)+1<<18, "rank %d: the communicator adds little", i)
					// The Buffer's counters, the watchdog's record, the send
					// memory in host memory, the TCP staging, and the proxy's
					// FIFO (a few KiB).
					own := int64(hint.HostMapped + devapi.TimeoutRecordSize + im.HostMapped() + staged)
					require.GreaterOrEqual(t, m.HostMapped, own, "rank %d", i)
					if kind == ep.Host { // GPUs pin more for their own transports
						require.Less(t, m.HostMapped, own+1<<16, "rank %d", i)
					}
				}
			})
		}
	}
}

// Internode handles used in a random order, the same order on every rank:
// three live handles (BF16 with weights, FP8 without, BF16 with int32 ids),
// and 30 steps each drawn from a new dispatch replacing a handle (its slot
// and, on devices that run the kernels, its kept notify layout reused), a
// cached dispatch of a handle with new rows, and a combine of a handle
// (weights, biases and in-place inputs drawn too). Most steps act on a
// handle that is not the last one dispatched: on devices that run the
// kernels the Buffer resumes its kept layout (internode.Notify.Resume), on
// the host backend it replays its notify round. Every step is checked
// against the reference (dispatch byte for byte, combine bit for bit).
func TestInternodeHandleOrderHost(t *testing.T) {
	internodeHandleOrder(t, ep.Host, nil, 2, 1)
	internodeHandleOrder(t, ep.Host, nil, 4, 2)
}

// The same under the CPU emulation of the kernels (the device path).
func TestInternodeHandleOrderEmulated(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	internodeHandleOrder(t, ep.Host, func(i int) (ep.Device, error) {
		return cpuemu.Open(i, cpuemu.Options{SMs: 2, WaitLimit: time.Minute})
	}, 2, 3)
}

// The same on the GPUs present (2 x 2 and 2 x 4 ranks, sharing them when
// there are fewer).
func TestInternodeHandleOrderGPU(t *testing.T) {
	if gpuCount(t) == 0 {
		t.Skip("no GPU")
	}
	internodeHandleOrder(t, ep.CUDA, nil, 2, 4)
	internodeHandleOrder(t, ep.CUDA, nil, 4, 5)
}

// orderHandle is one live handle of the random-order test.
type orderHandle struct {
	round  interRound
	tokens []int
	res    []ep.DispatchResult
	want   []internode.RankOutput
}

func (h *orderHandle) release() {
	for _, r := range h.res {
		r.Handle.Release()
	}
}

func internodeHandleOrder(t *testing.T, kind ep.Kind, open func(i int) (ep.Device, error), per int, seed uint64) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: per}
	t.Run(fmt.Sprintf("2x%d", per), func(t *testing.T) {
		w := topo.World()
		s, cfg, r := internodeRig(t, kind, open, topo, 16)
		rng := rand.New(rand.NewPCG(seed, uint64(per)))
		// Handle j's format: 0 BF16 with weights, 1 FP8 without, 2 BF16
		// with int32 ids and no weights.
		dispatch := func(j int, what string) *orderHandle {
			tokens := make([]int, w)
			for i := range tokens {
				tokens[i] = rng.IntN(cfg.MaxTokens + 1)
			}
			h := &orderHandle{tokens: tokens}
			h.round = newInterRound(rng, s, tokens, routeRandom, j == 1, j == 0, nil)
			h.round.i32 = j == 2
			h.res, h.want = interDispatch(t, r, s, h.round, nil, what)
			return h
		}
		live := make([]*orderHandle, 3)
		for j := range live {
			live[j] = dispatch(j, fmt.Sprintf("handle %d's first dispatch", j))
		}
		for step := range 30 {
			j := rng.IntN(len(live))
			h := live[j]
			switch op := rng.IntN(3); op {
			case 0:
				h.release()
				live[j] = dispatch(j, fmt.Sprintf("step %d: a new dispatch as handle %d", step, j))
			case 1:
				ids := make([][]int64, w)
				for i := range ids {
					ids[i] = h.round.in[i].TopK
				}
				again := newInterRound(rng, s, h.tokens, routeRandom, j == 1, j == 0, ids)
				interDispatch(t, r, s, again, handlesOf(h.res), fmt.Sprintf("step %d: cached dispatch of handle %d", step, j))
			default:
				interCombine(t, r, s, rng, handlesOf(h.res), h.want, h.tokens, j == 0, rng.IntN(3), rng.IntN(2) == 0,
					fmt.Sprintf("step %d: combine of handle %d", step, j))
			}
		}
		for _, h := range live {
			h.release()
		}
		ctx := context.Background()
		require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
			_, err := b.Barrier(ctx, r.streams[i], nil)
			return err
		}))
	})
}
