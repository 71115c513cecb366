package routing_test

import (
	"testing"
	"time"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

// GPU benchmarks of the layout kernel at DeepEP's test shape (T=4096, top-8
// of 256 experts, 8 ranks), timed with CUDA events around b.N back-to-back
// launches after 50 warm-ups. Reported as gpu-us/launch; ns/op is the host's
// issue rate. Skipped without a GPU. Run:
//
//	go test -run '^$' -bench Layout -benchtime 20000x ./routing
func BenchmarkLayoutKernel(b *testing.B) {
	b.Run("int64", func(b *testing.B) { benchLayout(b, false, 0) })
	b.Run("int32", func(b *testing.B) { benchLayout(b, true, 0) })
	// 100 launches per graph: the device cost without the host's launch path.
	b.Run("int64-graph", func(b *testing.B) { benchLayout(b, false, 100) })
}

func benchLayout(b *testing.B, as32 bool, perGraph int) {
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		b.Skipf("no CUDA GPU: %v", err)
	}
	d, st := open(b, device.CUDA)
	s := routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}
	r, err := routing.Generate(s, routing.GenOptions{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	buf, in, err := routing.Upload(d, r, as32)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(buf)
	dl, err := routing.NewDeviceLayout(d, s)
	if err != nil {
		b.Fatal(err)
	}
	defer dl.Close()
	launch := func() error { return dl.Launch(st, in, routing.LayoutConfig{}) }
	for i := 0; i < 50; i++ {
		if err := launch(); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Synchronize(); err != nil {
		b.Fatal(err)
	}
	want, _ := r.Layout()
	if got, _, err := dl.Read(); err != nil || want.Diff(got) != nil {
		b.Fatalf("layout wrong before timing: %v %v", err, want.Diff(got))
	}
	step, per := launch, 1
	if perGraph > 0 {
		g, err := d.Capture(st, func() error {
			for i := 0; i < perGraph; i++ {
				if err := launch(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		step, per = func() error { return g.Launch(st) }, perGraph
		for i := 0; i < 5; i++ {
			if err := step(); err != nil {
				b.Fatal(err)
			}
		}
	}
	start, _ := d.NewEvent()
	end, _ := d.NewEvent()
	defer start.Close()
	defer end.Close()
	b.ResetTimer()
	if err := start.Record(st); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if err := step(); err != nil {
			b.Fatal(err)
		}
	}
	if err := end.Record(st); err != nil {
		b.Fatal(err)
	}
	if err := end.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	el, err := d.Elapsed(start, end)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(el)/float64(time.Microsecond)/float64(b.N*per), "gpu-us/launch")
}
