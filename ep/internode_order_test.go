package ep_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
)

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
		s := internode.Shape{Topology: topo, Hidden: 128, TopK: 3, Experts: 2 * w}
		cfg := ep.Config{MaxTokens: 16, Hidden: s.Hidden, TopK: s.TopK, Experts: s.Experts, FP8: true, Handles: 4,
			Timeout: 20 * time.Second, VirtualNodes: topo.Nodes}
		var r *rig
		if open != nil {
			r = newRigOn(t, kind, w, cfg, open)
		} else {
			r = newRig(t, kind, w, cfg)
		}
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
