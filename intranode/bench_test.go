package intranode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/ep/routing"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
)

// benchGroup builds a group and one Bench per rank at DeepEP's routing.
func benchGroup(t testing.TB, kind device.Kind, ranks, tokens, hidden int, fp8 bool) (*intranode.Group, []*intranode.Bench, []device.Stream) {
	c := intranode.Config{Ranks: ranks, MaxTokens: tokens, Hidden: hidden, TopK: 8, LocalExperts: 256 / ranks, FP8: fp8}
	g := newGroup(t, kind, c, 30*time.Second)
	streams := newStreams(t, g)
	benches := make([]*intranode.Bench, ranks)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, g.Run(func(i int, r *intranode.Rank) error {
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: 8, Experts: 256, Ranks: ranks}, routing.GenOptions{Seed: uint64(i)})
		if err != nil {
			return err
		}
		benches[i], err = intranode.NewBench(ctx, r, streams[i], intranode.BenchInput{TopK: rt.Idx, FP8: fp8, Weights: true, Seed: 1})
		return err
	}))
	t.Cleanup(func() {
		for _, b := range benches {
			require.NoError(t, b.Close())
		}
	})
	return g, benches, streams
}

func TestBenchHost(t *testing.T) {
	g, benches, streams := benchGroup(t, device.Host, 4, 40, 256, true)
	total := 0
	for _, b := range benches {
		require.Greater(t, b.Received, 0)
		require.Equal(t, int64(b.Received)*(256+8), b.DispatchBytes)
		require.Equal(t, int64(b.Received)*512, b.CombineBytes)
		total += b.Received
	}
	for rep := 0; rep < 3; rep++ {
		run(t, g, streams, func(i int, r *intranode.Rank, s device.Stream) error {
			b := benches[i]
			for _, f := range []func(device.Stream) error{b.NotifyDispatch, b.Dispatch, b.Combine, b.Combine, b.Dispatch} {
				if err := f(s); err != nil {
					return err
				}
			}
			return nil
		})
	}
	t.Logf("4 host ranks received %d rows in all", total)
}

// GPU timings at DeepEP's shape (hidden 7168, top-8 of 256 experts, 4096
// tokens a rank) on every GPU of the machine (2, 4 or 8 goroutine ranks),
// each call timed as DeepEP's test does: the mean of back-to-back calls
// between two events on rank 0's stream after warm-ups. Run:
//
//	go test -run '^$' -bench GPU -benchtime 50x ./intranode
func BenchmarkGPU(b *testing.B) {
	n := gpuCount(b)
	if n < 2 {
		b.Skip("needs at least 2 GPUs")
	}
	ranks := min(n, intranode.MaxRanks)
	for _, tokens := range []int{4096, 512, 128} {
		for _, fp8 := range []bool{false, true} {
			shape := fmt.Sprintf("R=%d/T=%d/bf16", ranks, tokens)
			if fp8 {
				shape = fmt.Sprintf("R=%d/T=%d/fp8", ranks, tokens)
			}
			// A parent benchmark per shape, so that its group is closed
			// (Cleanup) before the next shape's is built.
			b.Run(shape, func(b *testing.B) { benchShape(b, ranks, tokens, fp8) })
		}
	}
}

func benchShape(b *testing.B, ranks, tokens int, fp8 bool) {
	g, benches, streams := benchGroup(b, device.CUDA, ranks, tokens, 7168, fp8)
	kinds := []string{"dispatch", "notify+dispatch"}
	if !fp8 {
		kinds = append(kinds, "combine")
	}
	for _, kind := range kinds {
		b.Run(kind, func(b *testing.B) {
			pick := func(x *intranode.Bench) func(device.Stream) error {
				switch kind {
				case "dispatch":
					return x.Dispatch
				case "combine":
					return x.Combine
				}
				return x.NotifyDispatch
			}
			elapsed := make([]time.Duration, ranks)
			err := g.Run(func(i int, r *intranode.Rank) error {
				f, s := pick(benches[i]), streams[i]
				for w := 0; w < 50; w++ {
					if err := f(s); err != nil {
						return err
					}
				}
				if err := s.Synchronize(); err != nil {
					return err
				}
				start, err := r.Dev.NewEvent()
				if err != nil {
					return err
				}
				defer start.Close()
				end, err := r.Dev.NewEvent()
				if err != nil {
					return err
				}
				defer end.Close()
				if err := start.Record(s); err != nil {
					return err
				}
				for it := 0; it < b.N; it++ {
					if err := f(s); err != nil {
						return err
					}
				}
				if err := end.Record(s); err != nil {
					return err
				}
				if err := end.Synchronize(); err != nil {
					return err
				}
				if err := r.Check(); err != nil {
					return err
				}
				elapsed[i], err = r.Dev.Elapsed(start, end)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			per := elapsed[0] / time.Duration(b.N)
			bytes := benches[0].DispatchBytes
			if kind == "combine" {
				bytes = benches[0].CombineBytes
			}
			b.ReportMetric(float64(per.Nanoseconds())/1e3, "gpu-us/call")
			b.ReportMetric(float64(bytes)/per.Seconds()/1e9, "GB/s")
			slowest := elapsed[0]
			for _, e := range elapsed {
				slowest = max(slowest, e)
			}
			b.ReportMetric(float64((slowest/time.Duration(b.N)).Nanoseconds())/1e3, "slowest-rank-us/call")
		})
	}
}
