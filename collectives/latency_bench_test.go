package collectives_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
)

// Small-message allreduce latency on the GPUs present (2..8 goroutine
// ranks, one per GPU, or 2 sharing the only one): the cost of the always-on
// call fingerprint is measured here, before and after (the benchmark uses
// only the public API, so the same file runs on an older commit). Each
// b.N is b.N back-to-back calls on every rank's stream ("eager": launch
// overhead included) or b.N calls captured 50 to a graph and replayed
// ("graph": what the kernels themselves take); the metric is the mean
// wall time per call between two bootstrap barriers around the loop,
// ns/op. Run, e.g.:
//
//	go test -c -o collectives.test ./collectives
//	./collectives.test -test.run '^$' -test.bench 'GPUSmallAllReduce' -test.benchtime 5000x -test.count 5
//
// With GOEP_BENCH_NO_FINGERPRINT=1 the same binary runs the kernels
// compiled without the call fingerprint (TestMain; measurement only): the
// fingerprint's A/B. Each result reports the metric fingerprint (1 default,
// 0 compiled out) and logs the mode.
func BenchmarkGPUSmallAllReduce(b *testing.B) {
	n := gpus()
	if n == 0 {
		b.Skip("no CUDA GPU")
	}
	ranks := min(max(n, 2), 8)
	for _, size := range []int{4 << 10, 64 << 10} {
		for _, algo := range []string{collectives.AlgoLL, collectives.AlgoLL2} {
			for _, mode := range []string{"eager", "graph"} {
				b.Run(fmt.Sprintf("R=%d/%dKiB/%s/%s", ranks, size>>10, algo, mode), func(b *testing.B) {
					benchAllReduce(b, ranks, size/2, algo, mode == "graph")
				})
			}
		}
	}
}

func benchAllReduce(b *testing.B, ranks, count int, algo string, graph bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const perGraph = 50
	var elapsed atomic.Int64
	errs := colltest.RunLocal(ctx, device.CUDA, ranks, bootstrap.Config{Timeout: time.Minute}, gpuConfig(ranks),
		func(ctx context.Context, c *collectives.Communicator) error {
			buf, err := colltest.NewBuffers(ctx, c, 2*count, false)
			if err != nil {
				return err
			}
			defer buf.Free()
			s := c.Device().DefaultStream()
			call := func() error {
				_, err := c.AllReduce(ctx, s, buf.Send.Ptr, buf.Recv.Ptr, count, ref.BF16, ref.Sum, collectives.WithAlgorithm(algo))
				return err
			}
			var g device.Graph
			if graph {
				if g, err = c.Device().Capture(s, func() error {
					for i := 0; i < perGraph; i++ {
						if err := call(); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					return err
				}
				defer g.Close()
			}
			loop := func(calls int) error {
				if graph {
					for i := 0; i < (calls+perGraph-1)/perGraph; i++ {
						if err := g.Launch(s); err != nil {
							return err
						}
					}
				} else {
					for i := 0; i < calls; i++ {
						if err := call(); err != nil {
							return err
						}
					}
				}
				return errors.Join(s.Synchronize(), c.Check())
			}
			if err := loop(100); err != nil { // warm-up
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			start := time.Now()
			if err := loop(b.N); err != nil {
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			if c.Rank() == 0 {
				elapsed.Store(int64(time.Since(start)))
			}
			return nil
		})
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	calls := b.N
	if graph {
		calls = (b.N + perGraph - 1) / perGraph * perGraph
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(elapsed.Load())/float64(calls)/1e3, "us/call")
	reportFingerprintMode(b)
}

// reportFingerprintMode says which build a benchmark ran: the metric
// fingerprint (1 default, 0 compiled out by $GOEP_BENCH_NO_FINGERPRINT=1)
// on its result line, and the mode in its log (always printed for
// benchmarks).
func reportFingerprintMode(b *testing.B) {
	on := 1.0
	if kernelflags.NoFingerprint() {
		on = 0
	}
	b.ReportMetric(on, "fingerprint")
	b.Log(kernelflags.Mode())
}
