package lowlatency_test

// GPU variants: goroutine ranks spread over the GPUs present (rank i on GPU
// i mod n), so 8 ranks share one GPU on a one-GPU machine; every grid is
// capped by the spin budget so that all ranks' blocks are resident at once.

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/lowlatency"
)

// gpuDevices opens n ranks' devices on the GPUs present, or skips.
func gpuDevices(t *testing.T, n int) ([]device.Device, int) {
	gpus, err := device.CUDADeviceCount()
	if err != nil || gpus == 0 {
		t.Skipf("no CUDA GPU (%v)", err)
	}
	devs := make([]device.Device, n)
	for i := range devs {
		d, err := device.Open(device.CUDA, i%gpus)
		require.NoError(t, err)
		devs[i] = d
		t.Cleanup(func() { _ = d.Close() })
	}
	shared := (n + gpus - 1) / gpus
	return devs, channels.SpinBudget(devs[0].Info().SMs, shared)
}

func TestDispatchCombineMatchReferenceGPU(t *testing.T) {
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			devs, spin := gpuDevices(t, c.ranks)
			c.cfg = lowlatency.LaunchConfig{NumSMs: min(4, spin), Threads: 128}
			g := newGroup(t, devs, c.config(), 20*time.Second, spin)
			runCase(t, g, c)
		})
	}
}

// A large shape on the GPU (the decode shape of the speed goal, smaller
// hidden so that the checks stay quick): 8 ranks, 128 tokens, top-8 of 256.
func TestDecodeShapeGPU(t *testing.T) {
	for _, f := range []lowlatency.Format{lowlatency.BF16, lowlatency.FP8, lowlatency.UE8M0} {
		t.Run(f.String(), func(t *testing.T) {
			c := llCase{name: "decode-" + f.String(), ranks: 8, maxTokens: 128, hidden: 2048, topk: 8, le: 32, format: f,
				weights: true, split: true, microBatches: 2, iters: 2, tokens: []int{128, 128, 1, 0, 128, 77, 128, 128},
				hot: -1, cold: -1}
			devs, spin := gpuDevices(t, c.ranks)
			c.cfg = lowlatency.LaunchConfig{NumSMs: spin}
			g := newGroup(t, devs, c.config(), 20*time.Second, spin)
			runCase(t, g, c)
		})
	}
}

// graphReplays captures, on every rank, two micro-batches (dispatch and
// combine on set 0, then on set 1) into one graph and replays it, checking
// both combined outputs after every replay (outputs poisoned before each).
// nodes > 1 splits the ranks into that many virtual nodes.
func graphReplays(t *testing.T, devs []device.Device, spin, replays, nodes int) {
	c := llCase{name: "graph", nodes: nodes, ranks: len(devs), maxTokens: 32, hidden: 512, topk: 4, le: 4, weights: true, hot: -1, cold: -1}
	c.cfg = lowlatency.LaunchConfig{NumSMs: max(1, min(4, spin)), Threads: 128}
	if spin == 0 {
		c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
	}
	lc := c.config()
	var g *group
	if nodes > 1 {
		g = newNodeGroup(t, devs, lc, 20*time.Second, spin)
	} else {
		g = newGroup(t, devs, lc, 20*time.Second, spin)
	}
	type mb struct {
		ins               []lowlatency.RankInput
		x, ids, w, y, out []uintptr
		want              [][]uint16
	}
	mbs := make([]*mb, 2)
	for b := range mbs {
		m := &mb{ins: make([]lowlatency.RankInput, c.ranks)}
		for _, p := range []*[]uintptr{&m.x, &m.ids, &m.w, &m.y, &m.out} {
			*p = make([]uintptr, c.ranks)
		}
		for i, r := range g.ranks {
			rng := newRNG(uint64(b), uint64(i))
			m.ins[i] = c.genInput(rng, c.maxTokens-3*i%7)
			m.x[i] = r.upload(t, bytesOf(m.ins[i].X))
			m.ids[i] = r.upload(t, bytesOf(m.ins[i].TopK))
			m.w[i] = r.upload(t, bytesOf(m.ins[i].Weights))
			m.out[i] = r.upload(t, make([]byte, 2*len(m.ins[i].X)))
		}
		recv, err := lowlatency.ReferenceDispatch(lc, m.ins, lowlatency.Options{})
		require.NoError(t, err)
		// The experts "compute" y = the received row (BF16), written once
		// into the zero-copy combine buffer at the rows dispatch fills.
		cins := make([]lowlatency.CombineInput, c.ranks)
		for d, r := range g.ranks {
			cins[d].Y = make([][][]uint16, c.le)
			yb := make([]uint16, c.le*lc.Slots()*c.hidden)
			for l, rows := range recv[d].Experts {
				for p, row := range rows {
					y := randBF16(newRNG(uint64(b*1000+l), uint64(p)), c.hidden)
					cins[d].Y[l] = append(cins[d].Y[l], y)
					copy(yb[(l*lc.Slots()+p)*c.hidden:], y)
					_ = row
				}
			}
			m.y[d] = r.ws.CombineBuffer(b).X
			require.NoError(t, r.dev.CopyIn(m.y[d], bytesOf(yb)))
		}
		m.want, err = lowlatency.ReferenceCombine(lc, m.ins, recv, cins, false, lowlatency.Options{})
		require.NoError(t, err)
		mbs[b] = m
	}
	graphs := make([]device.Graph, c.ranks)
	for i, r := range g.ranks {
		var err error
		graphs[i], err = r.dev.Capture(r.stream, func() error {
			for b, m := range mbs {
				a := lowlatency.DispatchArgs{Set: b, X: m.x[i], TopK: m.ids[i], IDs64: true, Weights: m.w[i],
					Tokens: m.ins[i].Tokens(c.topk), Phase: lowlatency.Send}
				if err := r.ws.Dispatch(r.dev, r.stream, a, c.cfg); err != nil {
					return err
				}
			}
			for b, m := range mbs {
				a := lowlatency.DispatchArgs{Set: b, X: m.x[i], TopK: m.ids[i], IDs64: true, Weights: m.w[i],
					Tokens: m.ins[i].Tokens(c.topk), Phase: lowlatency.Recv}
				if err := r.ws.Dispatch(r.dev, r.stream, a, c.cfg); err != nil {
					return err
				}
				ca := lowlatency.CombineArgs{Set: b, Tokens: m.ins[i].Tokens(c.topk), Y: m.y[i], Out: m.out[i], Phase: lowlatency.Both}
				if err := r.ws.Combine(r.dev, r.stream, ca, c.cfg); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = graphs[i].Close() })
	}
	for rep := 0; rep < replays; rep++ {
		g.run(t, func(i int, r *rank) error {
			for _, m := range mbs {
				if n := 2 * len(m.ins[i].X); n > 0 {
					if err := r.dev.MemsetAsync(m.out[i], 0xEE, n, r.stream); err != nil {
						return err
					}
				}
			}
			return graphs[i].Launch(r.stream)
		})
		for b, m := range mbs {
			for i, r := range g.ranks {
				sameSlice(t, m.want[i], down[uint16](t, r, m.out[i], len(m.ins[i].X)), "replay %d mb %d rank %d", rep, b, i)
			}
		}
	}
}

func TestGraphReplaysHost(t *testing.T) { graphReplays(t, hostDevices(t, 4), 0, 3, 1) }

// 8 ranks (sharing the GPUs present), 1,000 replays, every one checked.
func TestGraphReplaysGPU(t *testing.T) {
	devs, spin := gpuDevices(t, 8)
	graphReplays(t, devs, spin, 1000, 1)
}

// Split send/receive with other work between the steps on the same stream
// (a large device copy standing in for the other micro-batch's compute),
// checked against the reference.
func TestSplitOverlapGPU(t *testing.T) {
	devs, spin := gpuDevices(t, 8)
	c := llCase{name: "overlap", ranks: 8, maxTokens: 64, hidden: 1024, topk: 8, le: 8, format: lowlatency.FP8,
		weights: true, hot: -1, cold: -1, cfg: lowlatency.LaunchConfig{NumSMs: spin}}
	lc := c.config()
	g := newGroup(t, devs, lc, 20*time.Second, spin)
	const big = 64 << 20
	scratch := make([][2]uintptr, c.ranks)
	for i, r := range g.ranks {
		a, err := r.dev.Alloc(big)
		require.NoError(t, err)
		b, err := r.dev.Alloc(big)
		require.NoError(t, err)
		r.bufs = append(r.bufs, a, b)
		scratch[i] = [2]uintptr{a.Ptr, b.Ptr}
	}
	ins := make([]lowlatency.RankInput, c.ranks)
	x, ids, w := make([]uintptr, c.ranks), make([]uintptr, c.ranks), make([]uintptr, c.ranks)
	for i, r := range g.ranks {
		ins[i] = c.genInput(newRNG(5, uint64(i)), c.maxTokens)
		x[i], ids[i], w[i] = r.upload(t, bytesOf(ins[i].X)), r.upload(t, bytesOf(ins[i].TopK)), r.upload(t, bytesOf(ins[i].Weights))
	}
	want, err := lowlatency.ReferenceDispatch(lc, ins, lowlatency.Options{Format: c.format})
	require.NoError(t, err)
	for rep := 0; rep < 20; rep++ {
		set := rep % 2
		g.run(t, func(i int, r *rank) error {
			a := lowlatency.DispatchArgs{Set: set, X: x[i], TopK: ids[i], IDs64: true, Weights: w[i], Tokens: c.maxTokens,
				Format: c.format, Phase: lowlatency.Send}
			if err := r.ws.Dispatch(r.dev, r.stream, a, c.cfg); err != nil {
				return err
			}
			for k := 0; k < 4; k++ {
				if err := r.dev.CopyAsync(scratch[i][k%2], scratch[i][1-k%2], big, r.stream); err != nil {
					return err
				}
			}
			a.Phase = lowlatency.Recv
			return r.ws.Dispatch(r.dev, r.stream, a, c.cfg)
		})
		for d, r := range g.ranks {
			checkRecv(t, c, r, set, want[d], fmt.Sprintf("rep %d rank %d", rep, d))
		}
	}
}
