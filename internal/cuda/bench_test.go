package cuda

import "testing"

// Benchmarks of the Go + cgo overhead of hot calls. The GPU ones are skipped
// without a device. Run: go test -run '^$' -bench . ./internal/cuda

// BenchmarkCgoNop is one cgo crossing into the shim and back: the floor
// under every call (no GPU needed).
func BenchmarkCgoNop(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		cgoNop()
	}
}

// BenchmarkContextBind is the cgo crossing plus the context check that
// every context-bound call does (cuCtxGetCurrent; no switch needed).
func BenchmarkContextBind(b *testing.B) {
	ctx := gpuContext(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := bindOnly(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKernelArgsPack(b *testing.B) {
	a := NewKernelArgs()
	b.ReportAllocs()
	for b.Loop() {
		a.Reset().Ptr(0x7f0000001000).U32(1 << 20).U32(7).U64(42).F32(1.5)
	}
}

func BenchmarkStreamQuery(b *testing.B) {
	ctx := gpuContext(b)
	s := newStream(b, ctx)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Query(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEventRecord(b *testing.B) {
	ctx := gpuContext(b)
	s := newStream(b, ctx)
	ev, err := NewEvent(ctx, EventDisableTiming)
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Destroy()
	b.ReportAllocs()
	for b.Loop() {
		if err := ev.Record(s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkEventQuery(b *testing.B) {
	ctx := gpuContext(b)
	ev, err := NewEvent(ctx, EventDisableTiming)
	if err != nil {
		b.Fatal(err)
	}
	defer ev.Destroy()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ev.Query(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLaunchNoop launches an empty kernel with no parameters. Once the
// launch queue is full this measures launch throughput, GPU side included.
func BenchmarkLaunchNoop(b *testing.B) {
	ctx := gpuContext(b)
	s := newStream(b, ctx)
	fn := function(b, loadTestModule(b, ctx), "noop")
	b.ReportAllocs()
	for b.Loop() {
		if err := Launch(fn, Dim3{X: 1}, Dim3{X: 32}, 0, s, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLaunchArgs repacks three parameters and launches a tiny kernel.
func BenchmarkLaunchArgs(b *testing.B) {
	ctx := gpuContext(b)
	s := newStream(b, ctx)
	fn := function(b, loadTestModule(b, ctx), "fill_u32")
	p := memAlloc(b, ctx, 256)
	args := NewKernelArgs()
	b.ReportAllocs()
	for b.Loop() {
		if err := Launch(fn, Dim3{X: 1}, Dim3{X: 32}, 0, s, args.Reset().Ptr(p).U32(32).U32(3)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkMemcpyHtoDAsync4 queues 4-byte copies from pinned memory.
func BenchmarkMemcpyHtoDAsync4(b *testing.B) {
	ctx := gpuContext(b)
	s := newStream(b, ctx)
	pin := hostAlloc(b, ctx, 4, 0)
	p := memAlloc(b, ctx, 4)
	src := pin.Bytes()
	b.ReportAllocs()
	for b.Loop() {
		if err := MemcpyHtoDAsync(p, src, s); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
}
