package intranode_test

// Mismatched calls on the real kernels (CPU emulation): after matched
// rounds (so that the signal words carry a history of tags), ranks make
// different calls; every rank's launch must fail with a mismatch record
// (not a timeout) naming a peer, whose decoded fingerprints name the field
// that differs. Covers the three ways the kernels see it: an entry flag
// with another tag (cached dispatch BF16 against FP8), an arrival counter
// with another tag (notify + dispatch with the entry wait skipped, BF16
// against FP8), and the slow path's look at the fingerprint word (another
// kernel at the same sequence number: cached against full dispatch,
// dispatch against combine, the same calls in another order).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"github.com/goep-dev/goep/routing"
)

// emuCall is one EP call of the mismatch scenarios.
type emuCall int

const (
	full    emuCall = iota // notify + dispatch (entry wait skipped), BF16
	fullFP8                // the same with FP8 rows
	cached                 // dispatch with its entry wait, BF16
	cachedFP8
	combine
)

func TestEmulatedMismatchedCalls(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	type call = emuCall
	cases := []struct {
		name    string
		matched int      // matched rounds (full, cached, combine) first
		calls   [][]call // per rank
		field   string   // named by every rank's error
	}{
		{"entry-dtype", 1, [][]call{{cachedFP8}, {cached}}, "dtype FP8"},
		{"arrival-dtype", 2, [][]call{{full}, {fullFP8}, {full}}, "dtype FP8"},
		{"cached-vs-full", 1, [][]call{{cached}, {full}, {full}}, "call"},
		{"dispatch-vs-combine", 0, [][]call{{combine}, {cached}}, "call"},
		{"order", 1, [][]call{{cached, combine}, {combine, cached}}, "call"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs, run := emuMismatch(t, c.matched, c.calls)
			for i, err := range errs {
				var te *channels.TimeoutError
				require.ErrorAs(t, err, &te, "rank %d", i)
				require.Equal(t, uint32(intranode.StageMismatch), te.Stage, "rank %d: %v", i, err)
				require.NotEqual(t, i, te.Peer, "rank %d", i)
				me := intranode.NewMismatchError(i, te.Peer, "emulated", te.Expected, te.Observed)
				msg := fmt.Sprint(me)
				require.NotEmpty(t, me.Fields, "rank %d: %s", i, msg)
				require.Contains(t, msg, c.field, "rank %d", i)
				t.Logf("rank %d: %s", i, msg)
			}
			// A failed rank's later launches leave at once (no hang).
			for i, e := range run(cached) {
				require.Error(t, e, "rank %d", i)
			}
		})
	}
}

// emuMismatch runs the scenario: R = len(calls) emulated ranks, matched
// rounds of (full, cached, combine), then rank i makes calls[i] in turn.
// It returns each rank's error from the scenario (nil when all its calls
// and its check passed) and a function that makes one more call k on
// every rank at once (each rank's error).
func emuMismatch(t *testing.T, matched int, calls [][]emuCall) ([]error, func(k emuCall) []error) {
	t.Helper()
	type call = emuCall
	R := len(calls)
	const hidden, topk, experts, tokens = 256, 2, 4, 12
	l, err := intranode.NewLayout(intranode.Config{Ranks: R, MaxTokens: tokens, Hidden: hidden, TopK: topk,
		LocalExperts: experts, FP8: true})
	require.NoError(t, err)
	boots, err := bootstrap.NewInProcess(R, bootstrap.Config{})
	require.NoError(t, err)
	ranks := make([]*intranodetest.Rank, R)
	devs := make([]*cpuemu.Device, R)
	t.Cleanup(func() {
		for i := range devs {
			if devs[i] != nil {
				_ = devs[i].Close()
			}
			_ = boots[i].Close()
		}
	})
	par := func(f func(i int) error) []error {
		var wg sync.WaitGroup
		errs := make([]error, R)
		for i := 0; i < R; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = f(i) }()
		}
		wg.Wait()
		return errs
	}
	for i, e := range par(func(i int) error {
		dev, err := cpuemu.Open(i, cpuemu.Options{SMs: 8})
		if err != nil {
			return err
		}
		devs[i] = dev
		ranks[i], err = intranodetest.NewRank(context.Background(), dev, boots[i], l,
			intranodetest.RankOptions{Timeout: 30 * time.Second})
		return err
	}) {
		require.NoError(t, e, "rank %d", i)
	}
	cfg := intranode.LaunchConfig{NumSMs: 2, Threads: 64}
	type io struct{ topk, x, x8, sc uintptr }
	ios := make([]io, R)
	handles := make([]intranode.Handle, R)
	for i, r := range ranks {
		rng := rand.New(rand.NewPCG(uint64(i), 5))
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: topk, Experts: experts * R, Ranks: R},
			routing.GenOptions{Seed: uint64(i) + 1})
		require.NoError(t, err)
		x8 := make([]uint8, tokens*hidden)
		for j := range x8 {
			x8[j] = uint8(rng.Uint32())
		}
		sc := make([]float32, tokens*hidden/128)
		for j := range sc {
			sc[j] = rng.Float32()
		}
		ios[i] = io{topk: emuUp(t, r.Dev, rt.Idx), x: emuUp(t, r.Dev, emuRandBF16(rng, tokens*hidden)),
			x8: emuUp(t, r.Dev, x8), sc: emuUp(t, r.Dev, sc)}
		handles[i] = r.WS.DefaultHandle(tokens)
	}
	run := func(i int, k call) error {
		r := ranks[i]
		a := intranode.DispatchArgs{TopK: ios[i].topk, Handle: handles[i], X: ios[i].x}
		if k == fullFP8 || k == cachedFP8 {
			a.FP8, a.X, a.Scales = true, ios[i].x8, ios[i].sc
		}
		var err error
		switch k {
		case full, fullFP8:
			err = r.NotifyDispatch(nil, ios[i].topk, handles[i], 4, a, cfg)
		case cached, cachedFP8:
			err = r.WS.Dispatch(r.Dev, nil, a, cfg)
		case combine:
			err = r.WS.Combine(r.Dev, nil, intranode.CombineArgs{Handle: handles[i], Y: r.WS.CombineInput().X,
				Out: emuUp(t, r.Dev, make([]uint16, tokens*hidden))}, cfg)
		}
		if err != nil {
			return err
		}
		return r.Check()
	}
	for m := 0; m < matched; m++ {
		for _, k := range []call{full, cached, combine} {
			for i, e := range par(func(i int) error { return run(i, k) }) {
				require.NoError(t, e, "matched round %d, call %d, rank %d", m, k, i)
			}
		}
	}
	errs := par(func(i int) error {
		for _, k := range calls[i] {
			if err := run(i, k); err != nil {
				return err
			}
		}
		return ranks[i].Check()
	})
	return errs, func(k call) []error { return par(func(i int) error { return run(i, k) }) }
}
