package ep_test

// Mismatched calls across ranks: the call fingerprint that travels with the
// kernels' signals turns each into ep.ErrMismatch on every rank, naming the
// peer and the field, instead of a hang or wrong data returned as success;
// the Buffer then refuses calls until Close. Runs on the host backend and,
// with a GPU, on CUDA (TestMismatchedCalls/cuda).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"github.com/goep-dev/goep/routing"
)

func TestMismatchedCalls(t *testing.T) {
	type call int
	const (
		full call = iota
		fullFP8
		cached
		combine
	)
	cases := []struct {
		name  string
		calls [][]call // per rank, after one matched full dispatch
		field string   // the field every rank's error names
	}{
		{"cached-vs-full", [][]call{{cached}, {full}, {full}}, "call"},
		{"dtype", [][]call{{fullFP8}, {full}}, "dtype FP8"},
		{"dispatch-vs-combine", [][]call{{combine}, {cached}}, "call"},
		{"order", [][]call{{cached, combine}, {combine, cached}}, "call"},
	}
	for _, kind := range kinds(t) {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%s", kind, c.name), func(t *testing.T) {
				ranks := len(c.calls)
				const hidden, topk, experts, tokens = 256, 2, 4, 16
				cfg := ep.Config{MaxTokens: tokens, Hidden: hidden, TopK: topk, Experts: experts * ranks, FP8: true,
					Timeout: 20 * time.Second}
				r := newRig(t, kind, ranks, cfg)
				ctx := context.Background()
				type rankIO struct{ x, x8, sc, ids, y uintptr }
				io := make([]rankIO, ranks)
				for i := range io {
					d := r.devs[i]
					rng := rand.New(rand.NewPCG(uint64(i), 9))
					rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: topk, Experts: cfg.Experts, Ranks: ranks},
						routing.GenOptions{Seed: uint64(i) + 1})
					require.NoError(t, err)
					io[i] = rankIO{x: toDev(t, d, intranodetest.RandBF16(rng, tokens*hidden, false)), x8: toDev(t, d, randFP8(rng, tokens*hidden)),
						sc: toDev(t, d, randF32(rng, tokens*hidden/128)), ids: toDev(t, d, rt.Idx),
						y: alloc(t, d, 2*hidden*r.bufs[i].MaxRecv())}
				}
				args := func(i int, fp8 bool) ep.DispatchArgs {
					a := ep.DispatchArgs{TopK: ep.NewTensor(io[i].ids, ep.I64, tokens, topk), Stream: r.streams[i]}
					a.X = ep.NewTensor(io[i].x, ep.BF16, tokens, hidden)
					if fp8 {
						a.X = ep.NewTensor(io[i].x8, ep.FP8E4M3, tokens, hidden)
						a.Scales = ep.NewTensor(io[i].sc, ep.F32, tokens, hidden/128)
					}
					return a
				}
				// One matched full dispatch: every rank's handle.
				handles := make([]*ep.Handle, ranks)
				require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
					res, err := b.Dispatch(ctx, args(i, false))
					handles[i] = res.Handle
					if err != nil {
						return err
					}
					return r.streams[i].Synchronize()
				}))
				// Then the mismatched calls: each rank stops at its first
				// error; whatever a call returned, the rank's Buffer must
				// end with ErrMismatch (Check after its stream is done).
				errs := make([]error, ranks)
				_ = r.run(func(i int, b *ep.Buffer) error {
					for _, k := range c.calls[i] {
						var err error
						switch k {
						case full, fullFP8:
							_, err = b.Dispatch(ctx, args(i, k == fullFP8))
						case cached:
							a := args(i, false)
							a.Handle = handles[i]
							_, err = b.Dispatch(ctx, a)
						case combine:
							_, err = b.Combine(ctx, ep.CombineArgs{Handle: handles[i], Stream: r.streams[i],
								X: ep.NewTensor(io[i].y, ep.BF16, r.bufs[i].MaxRecv(), hidden)})
						}
						if err != nil {
							t.Logf("rank %d: call %d: %v", i, k, err)
							break
						}
					}
					if err := r.streams[i].Synchronize(); err != nil {
						t.Logf("rank %d: sync: %v", i, err)
					}
					errs[i] = b.Check()
					return nil
				})
				for i, err := range errs {
					require.ErrorIs(t, err, ep.ErrMismatch, "rank %d", i)
					require.NotErrorIs(t, err, ep.ErrTimeout, "rank %d", i)
					var me *intranode.MismatchError
					require.True(t, errors.As(err, &me), "rank %d: %v", i, err)
					require.Equal(t, i, me.Rank)
					require.NotEqual(t, i, me.Peer)
					require.NotEmpty(t, me.Fields)
					require.Contains(t, err.Error(), c.field, "rank %d", i)
					// Refused until Close.
					_, err = r.bufs[i].Dispatch(ctx, args(i, false))
					require.ErrorIs(t, err, ep.ErrMismatch, "rank %d: the next call", i)
				}
				for _, h := range handles {
					h.Release()
				}
			})
		}
	}
}
