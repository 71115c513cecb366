package lowlatency_test

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/lowlatency"
)

// The control block offsets, stages and limits the Go side uses are the
// kernel's #defines.
func TestConstantsMatchKernel(t *testing.T) {
	src := kernels.Sources()["lowlatency.cu"]
	require.NotEmpty(t, src)
	def := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (GOEP_LL_\w+) (\d+)$`).FindAllStringSubmatch(src, -1) {
		v, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		def[m[1]] = v
	}
	for name, v := range map[string]int{
		"GOEP_LL_MAX_RANKS": lowlatency.MaxRanks, "GOEP_LL_MAX_TOPK": lowlatency.MaxTopK, "GOEP_LL_MAX_THREADS": lowlatency.MaxThreads,
		"GOEP_LL_SEND": int(lowlatency.Send), "GOEP_LL_RECV": int(lowlatency.Recv),
		"GOEP_LL_BF16": int(lowlatency.BF16), "GOEP_LL_FP8": int(lowlatency.FP8), "GOEP_LL_UE8M0": int(lowlatency.UE8M0),
		"GOEP_LL_CTRL_DISP_EPOCH": lowlatency.CtrlDispEpoch, "GOEP_LL_CTRL_COMB_EPOCH": lowlatency.CtrlCombEpoch,
		"GOEP_LL_CTRL_DISP_DONE": lowlatency.CtrlDispDone, "GOEP_LL_CTRL_COMB_DONE": lowlatency.CtrlCombDone,
		"GOEP_LL_CTRL_MASK": lowlatency.CtrlMask, "GOEP_LL_CTRL_OWN_T": lowlatency.CtrlOwnT,
		"GOEP_LL_CTRL_DISP_GATE": lowlatency.CtrlDispGate, "GOEP_LL_CTRL_DISP_EFF": lowlatency.CtrlDispEff,
		"GOEP_LL_CTRL_COMB_GATE": lowlatency.CtrlCombGate, "GOEP_LL_CTRL_COMB_EFF": lowlatency.CtrlCombEff,
		"GOEP_LL_CTRL_DISP_ARRIVE": lowlatency.CtrlDispArrive, "GOEP_LL_CTRL_DISP_FREED": lowlatency.CtrlDispFreed,
		"GOEP_LL_CTRL_COMB_ARRIVE": lowlatency.CtrlCombArrive, "GOEP_LL_CTRL_COMB_FREED": lowlatency.CtrlCombFreed,
		"GOEP_LL_CTRL_NTOK": lowlatency.CtrlNTok, "GOEP_LL_CTRL_INVALID_ACC": lowlatency.CtrlInvalidAcc,
		"GOEP_LL_CTRL_INVALID_OUT": lowlatency.CtrlInvalidOut, "GOEP_LL_CTRL_BYTES": lowlatency.CtrlBytes,
		"GOEP_LL_STAGE_DISP_FREED": lowlatency.StageDispatchFreed, "GOEP_LL_STAGE_DISP_ARRIVAL": lowlatency.StageDispatchArrival,
		"GOEP_LL_STAGE_DISP_GATE": lowlatency.StageDispatchGate, "GOEP_LL_STAGE_COMB_FREED": lowlatency.StageCombineFreed,
		"GOEP_LL_STAGE_COMB_ARRIVAL": lowlatency.StageCombineArrival, "GOEP_LL_STAGE_COMB_GATE": lowlatency.StageCombineGate,
		"GOEP_LL_CTRL_TRACE": lowlatency.CtrlTrace, "GOEP_LL_TRACE_BLOCKS": lowlatency.TraceBlocks,
		"GOEP_LL_TRACE_SLOTS": lowlatency.TraceSlots, "GOEP_LL_TRACE": 0,
	} {
		got, ok := def[name]
		require.True(t, ok, "%s is not defined in lowlatency.cu", name)
		require.Equal(t, v, got, name)
	}
	// The trace's events: the index of a name in DispatchEvents /
	// CombineEvents is its GOEP_LL_EV_* slot (D_ and C_ for one kernel's
	// own events), and every event the kernel names has a name.
	for _, k := range []struct {
		prefix string
		names  []string
	}{{"D_", lowlatency.DispatchEvents}, {"C_", lowlatency.CombineEvents}} {
		seen := map[int]bool{}
		for m, v := range def {
			ev, ok := strings.CutPrefix(m, "GOEP_LL_EV_")
			if !ok {
				continue
			}
			if own, ok := strings.CutPrefix(ev, k.prefix); ok {
				ev = own
			} else if strings.HasPrefix(ev, "D_") || strings.HasPrefix(ev, "C_") {
				continue
			}
			require.Less(t, v, len(k.names), m)
			require.Equal(t, strings.ToLower(ev), k.names[v], m)
			seen[v] = true
		}
		require.Len(t, seen, len(k.names), "%s events: %v", k.prefix, k.names)
	}
	require.LessOrEqual(t, len(lowlatency.DispatchEvents)+2, lowlatency.TraceSlots)
	require.GreaterOrEqual(t, lowlatency.TraceBlocks, lowlatency.DefaultSMs, "every grid the launcher allows records")
}

// Bad input is an error before any launch.
func TestBadInputIsRefused(t *testing.T) {
	devs := hostDevices(t, 2)
	c := lowlatency.Config{Ranks: 2, MaxTokens: 4, Hidden: 16, TopK: 2, LocalExperts: 2}
	g := newGroup(t, devs, c, 5*time.Second, 3)
	r := g.ranks[0]
	x, ids := r.upload(t, make([]byte, 2*4*16)), r.upload(t, make([]byte, 8*4*2))
	ok := lowlatency.DispatchArgs{X: x, TopK: ids, IDs64: true, Tokens: 4, Phase: lowlatency.Both}
	for name, a := range map[string]lowlatency.DispatchArgs{
		"tokens above max":    {X: x, TopK: ids, IDs64: true, Tokens: 5, Phase: lowlatency.Both},
		"set 2":               {Set: 2, X: x, TopK: ids, Tokens: 4, Phase: lowlatency.Both},
		"no phase":            {X: x, TopK: ids, Tokens: 4},
		"fp8 without regions": {X: x, TopK: ids, Tokens: 4, Format: lowlatency.FP8, Phase: lowlatency.Both},
		"null x":              {TopK: ids, Tokens: 4, Phase: lowlatency.Both},
	} {
		require.Error(t, r.ws.Dispatch(r.dev, r.stream, a, lowlatency.LaunchConfig{NumSMs: 1}), name)
	}
	require.Error(t, r.ws.Dispatch(r.dev, r.stream, ok, lowlatency.LaunchConfig{NumSMs: 4}), "grid above the spin budget")
	require.Error(t, r.ws.Dispatch(r.dev, r.stream, ok, lowlatency.LaunchConfig{NumSMs: 1, Threads: 48}), "threads")
	require.Error(t, r.ws.SetMask(r.dev, r.stream, lowlatency.MaskSet, 1<<2), "mask names rank 2 of 2")
	require.Error(t, r.ws.Combine(r.dev, r.stream, lowlatency.CombineArgs{Tokens: 4, Phase: lowlatency.Both}, lowlatency.LaunchConfig{NumSMs: 1}),
		"combine without y")
	var nilWS *lowlatency.Workspace
	require.Error(t, nilWS.Dispatch(r.dev, r.stream, ok, lowlatency.LaunchConfig{}))
	require.Error(t, nilWS.Validate())
}

// A rank that never comes: the waiting rank's call ends with a timeout
// naming the peer and the stage; in elastic mode the peer is masked
// instead, the call completes with what the others sent, and the mask says
// which rank was dropped.
func TestMissingPeer(t *testing.T) {
	for _, emu := range []bool{false, true} {
		t.Run(map[bool]string{false: "host", true: "emulated"}[emu], func(t *testing.T) {
			if emu {
				cpuemu.SkipUnavailable(t)
			}
			missingPeer(t, emu)
		})
	}
}

func missingPeer(t *testing.T, emu bool) {
	c := llCase{name: "missing", ranks: 3, maxTokens: 4, hidden: 16, topk: 2, le: 2, weights: true, hot: -1, cold: -1}
	lc := c.config()
	for _, elastic := range []bool{false, true} {
		devs, timeout := hostDevices(t, 3), 300*time.Millisecond
		if emu {
			// The emulation is slow: a live peer must never look missing.
			devs, timeout = emuDevices(t, 3), 3*time.Second
		}
		g := newGroup(t, devs, lc, timeout, 0)
		ins := make([]lowlatency.RankInput, 3)
		err := g.each(func(i int, r *rank) error {
			if i == 2 {
				return nil // rank 2 never dispatches
			}
			ins[i] = c.genInput(newRNG(1, uint64(i)), 4)
			a := lowlatency.DispatchArgs{X: r.upload(t, bytesOf(ins[i].X)), TopK: r.upload(t, bytesOf(ins[i].TopK)), IDs64: true,
				Weights: r.upload(t, bytesOf(ins[i].Weights)), Tokens: 4, Phase: lowlatency.Both, Elastic: elastic}
			if err := r.ws.Dispatch(r.dev, r.stream, a, lowlatency.LaunchConfig{NumSMs: 1, Threads: 64}); err != nil {
				return err
			}
			if err := r.stream.Synchronize(); err != nil {
				return err
			}
			return r.check()
		})
		if !elastic {
			var te *channels.TimeoutError
			require.True(t, errors.As(err, &te), "%v", err)
			require.Equal(t, 2, te.Peer)
			require.Equal(t, uint32(lowlatency.StageDispatchArrival), te.Stage)
			continue
		}
		require.NoError(t, err)
		ins[2] = lowlatency.RankInput{TopK: []int64{}, X: []uint16{}}
		want, err := lowlatency.ReferenceDispatch(lc, ins, lowlatency.Options{Masked: 1 << 2})
		require.NoError(t, err)
		for d := 0; d < 2; d++ {
			r := g.ranks[d]
			require.Equal(t, []uint32{1 << 2}, down[uint32](t, r, r.ws.MaskPtr(), 1), "rank %d mask", d)
			checkRecv(t, c, r, 0, want[d], "elastic")
		}
	}
}
