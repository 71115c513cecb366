package intranode_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// benchGroup builds a group and one Bench per rank at DeepEP's routing.
func benchGroup(t testing.TB, kind device.Kind, ranks, tokens, hidden int, fp8 bool) (*intranodetest.Group, []*intranodetest.Bench, []device.Stream) {
	c := intranode.Config{Ranks: ranks, MaxTokens: tokens, Hidden: hidden, TopK: 8, LocalExperts: 256 / ranks, FP8: fp8}
	g := newGroup(t, kind, c, 30*time.Second)
	streams := newStreams(t, g)
	benches := make([]*intranodetest.Bench, ranks)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, g.Run(func(i int, r *intranodetest.Rank) error {
		rt, err := routing.Generate(routing.Shape{Tokens: tokens, K: 8, Experts: 256, Ranks: ranks}, routing.GenOptions{Seed: uint64(i)})
		if err != nil {
			return err
		}
		benches[i], err = intranodetest.NewBench(ctx, r, streams[i], intranodetest.BenchInput{TopK: rt.Idx, FP8: fp8, Weights: true, Seed: 1})
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
		run(t, g, streams, func(i int, r *intranodetest.Rank, s device.Stream) error {
			b := benches[i]
			fs := []func(device.Stream) error{b.NotifyDispatch, b.Dispatch, b.Combine, b.Combine, b.Dispatch}
			for _, v := range benchVariants(true) {
				fs = append(fs, v.pick(b))
			}
			for _, v := range benchVariants(false) {
				fs = append(fs, v.pick(b))
			}
			for _, f := range fs {
				if err := f(s); err != nil {
					return err
				}
			}
			return nil
		})
	}
	t.Logf("4 host ranks received %d rows in all", total)
}

// GPU timings at DeepEP's shape (hidden 7168, top-8 of 256 experts, 4096,
// 512 and 128 tokens a rank, BF16 and FP8) on every GPU of the machine (2, 4
// or 8 goroutine ranks), each call timed as DeepEP's test does: the mean of
// back-to-back calls between two events on rank 0's stream after warm-ups.
// Per shape: cached dispatch through each copy path (plain, wide, tma) on
// 24 and 16 SMs, notify+dispatch (defaults), and for BF16 combine on 24 and
// 16 SMs (input in the combine input region). Run:
//
//	go test -run '^$' -bench GPU -benchtime 50x ./intranode
//
// GOEP_BENCH_NO_TMA=1 leaves the TMA variants out (a TMA variant whose
// module does not compile is skipped with the error).
// GOEP_BENCH_NO_FINGERPRINT=1 runs the kernels compiled without the call
// fingerprint (TestMain; measurement only): the same binary with and
// without it is the fingerprint's A/B. Each result reports the metric
// fingerprint (1 default, 0 compiled out) and logs the mode.
func BenchmarkGPU(b *testing.B) {
	n := gpuCount(b)
	if n == 0 {
		b.Skip("no CUDA GPU")
	}
	// One rank per GPU, or 2 ranks sharing the only GPU (not an NVLink
	// figure then).
	ranks := min(max(n, 2), intranode.MaxRanks)
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

// benchVariant is one timed closure of a shape.
type benchVariant struct {
	name     string
	pick     func(x *intranodetest.Bench) func(device.Stream) error
	combine  bool
	optional bool // skip (not fail) when the first launch errors: a path the toolchain may not build
}

func benchVariants(fp8 bool) []benchVariant {
	var vs []benchVariant
	dispatch := func(c intranode.CopyMode) {
		for _, sms := range []int{24, 16} {
			cfg := intranode.LaunchConfig{NumSMs: sms, Copy: c}
			vs = append(vs, benchVariant{name: fmt.Sprintf("dispatch/%v/sms=%d", c, sms),
				pick:     func(x *intranodetest.Bench) func(device.Stream) error { return x.DispatchWith(cfg) },
				optional: c == intranode.CopyTMA})
		}
	}
	dispatch(intranode.CopyPlain)
	dispatch(intranode.CopyWide)
	vs = append(vs, benchVariant{name: "notify+dispatch",
		pick: func(x *intranodetest.Bench) func(device.Stream) error { return x.NotifyDispatch }})
	if !fp8 {
		for _, sms := range []int{24, 16} {
			cfg := intranode.LaunchConfig{NumSMs: sms}
			vs = append(vs, benchVariant{name: fmt.Sprintf("combine/sms=%d", sms), combine: true,
				pick: func(x *intranodetest.Bench) func(device.Stream) error { return x.CombineWith(cfg) }})
		}
	}
	// Last in each shape: the path least proven on hardware.
	if os.Getenv("GOEP_BENCH_NO_TMA") != "1" {
		dispatch(intranode.CopyTMA)
	}
	return vs
}

// errOptional marks a failed first launch of an optional variant.
type errOptional struct{ err error }

func (e errOptional) Error() string { return e.err.Error() }

func benchShape(b *testing.B, ranks, tokens int, fp8 bool) {
	g, benches, streams := benchGroup(b, device.CUDA, ranks, tokens, 7168, fp8)
	for _, v := range benchVariants(fp8) {
		b.Run(v.name, func(b *testing.B) {
			elapsed := make([]time.Duration, ranks)
			err := g.Run(func(i int, r *intranodetest.Rank) error {
				f, s := v.pick(benches[i]), streams[i]
				if err := f(s); err != nil {
					if v.optional {
						return errOptional{err}
					}
					return err
				}
				for w := 1; w < 50; w++ {
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
			var opt errOptional
			if err != nil && errors.As(err, &opt) {
				b.Skipf("%s unavailable: %v", v.name, err)
			}
			if err != nil {
				b.Fatal(err)
			}
			per := elapsed[0] / time.Duration(b.N)
			bytes := benches[0].DispatchBytes
			if v.combine {
				bytes = benches[0].CombineBytes
			}
			b.ReportMetric(float64(per.Nanoseconds())/1e3, "gpu-us/call")
			b.ReportMetric(float64(bytes)/per.Seconds()/1e9, "GB/s")
			slowest := elapsed[0]
			for _, e := range elapsed {
				slowest = max(slowest, e)
			}
			b.ReportMetric(float64((slowest/time.Duration(b.N)).Nanoseconds())/1e3, "slowest-rank-us/call")
			// Which build ran: 1 default, 0 fingerprint compiled out
			// ($GOEP_BENCH_NO_FINGERPRINT=1, TestMain); the log says it in
			// words (benchmark logs are always printed).
			fpOn := 1.0
			if kernelflags.NoFingerprint() {
				fpOn = 0
			}
			b.ReportMetric(fpOn, "fingerprint")
			b.Log(kernelflags.Mode())
		})
	}
}
