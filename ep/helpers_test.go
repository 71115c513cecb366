package ep_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/parallel"
)

// gpuIters sets the rounds of the repeated-calls test on GPUs
// (-ep.iters=1000 on the GPU machine).
var gpuIters = flag.Int("ep.iters", 100, "rounds of TestRepeatedCallsGPU")

// soakRounds sets the rounds of TestSoakGPU (0: skipped).
var soakRounds = flag.Int("ep.soak", 0, "rounds of TestSoakGPU (0 skips it)")

func gpuCount(t testing.TB) int {
	n, err := ep.GPUCount()
	if err != nil || n == 0 {
		t.Logf("no CUDA GPU: %v", err)
		return 0
	}
	return n
}

// ordinalOf is rank r's device: host-backend rank r, or on CUDA GPU r mod
// the GPUs present, so any number of ranks runs on the GPUs there
// (goroutine ranks sharing a GPU share its context).
func ordinalOf(t testing.TB, kind ep.Kind, r int) int {
	if kind != ep.CUDA {
		return r
	}
	n := gpuCount(t)
	require.Positive(t, n, "a CUDA rank needs a GPU")
	return r % n
}

// sourceLoader is what marks the CPU emulation's device (it loads CUDA
// sources as the user-kernel path does).
type sourceLoader interface {
	LoadSource(file, src string) ([]string, error)
}

// countingEmu is a counting wrapper of an emulated device that still
// loads sources.
type countingEmu struct {
	*counting
	src sourceLoader
}

func (c countingEmu) LoadSource(file, src string) ([]string, error) {
	return c.src.LoadSource(file, src)
}

// counting wraps a Device and keeps every allocation, host-mapped
// allocation and import that is still open, to prove Close frees all.
type counting struct {
	device.Device
	mu      sync.Mutex
	allocs  map[uintptr]int
	mapped  map[uintptr]int
	imports map[uintptr]int
	total   int // allocations ever made
}

func newCounting(d device.Device) *counting {
	return &counting{Device: d, allocs: map[uintptr]int{}, mapped: map[uintptr]int{}, imports: map[uintptr]int{}}
}

// allocations describes, per rank, the memory held now and the number of
// allocations ever made.
func (r *rig) allocations() []string {
	out := make([]string, len(r.counts))
	for i, c := range r.counts {
		a, m, imp := c.live()
		c.mu.Lock()
		out[i] = fmt.Sprintf("rank %d: %d device allocations, %d host-mapped, %d imports live; %d made", i, a, m, imp, c.total)
		c.mu.Unlock()
	}
	return out
}

func (c *counting) Alloc(n int) (device.Buffer, error) {
	b, err := c.Device.Alloc(n)
	if err == nil {
		c.mu.Lock()
		c.allocs[b.Ptr] = n
		c.total++
		c.mu.Unlock()
	}
	return b, err
}

func (c *counting) Free(b device.Buffer) error {
	c.mu.Lock()
	delete(c.allocs, b.Ptr)
	c.mu.Unlock()
	return c.Device.Free(b)
}

func (c *counting) AllocHostMapped(n int) (device.HostMapped, error) {
	m, err := c.Device.AllocHostMapped(n)
	if err == nil {
		c.mu.Lock()
		c.mapped[m.Dev] = n
		c.total++
		c.mu.Unlock()
	}
	return m, err
}

func (c *counting) FreeHostMapped(m device.HostMapped) error {
	c.mu.Lock()
	delete(c.mapped, m.Dev)
	c.mu.Unlock()
	return c.Device.FreeHostMapped(m)
}

func (c *counting) Import(h device.Shared) (device.Buffer, error) {
	b, err := c.Device.Import(h)
	if err == nil {
		c.mu.Lock()
		c.imports[b.Ptr]++
		c.mu.Unlock()
	}
	return b, err
}

func (c *counting) CloseImport(b device.Buffer) error {
	c.mu.Lock()
	if c.imports[b.Ptr]--; c.imports[b.Ptr] <= 0 {
		delete(c.imports, b.Ptr)
	}
	c.mu.Unlock()
	return c.Device.CloseImport(b)
}

// Context forwards the CUDA context so the wrapper also works on GPUs.
func (c *counting) Context() *cuda.Context {
	if x, ok := c.Device.(interface{ Context() *cuda.Context }); ok {
		return x.Context()
	}
	return nil
}

func (c *counting) live() (allocs, mapped, imports int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.allocs), len(c.mapped), len(c.imports)
}

// rig is a group of goroutine ranks with a Buffer each.
type rig struct {
	kind    ep.Kind
	cfg     ep.Config
	devs    []ep.Device
	counts  []*counting
	boots   []bootstrap.Bootstrap
	bufs    []*ep.Buffer
	streams []ep.Stream
	closed  bool
}

// newRig builds ranks Buffers of cfg on devices of kind, each wrapped in a
// counting Device; Cleanup closes them (if the test did not) and checks
// nothing leaked.
func newRig(t testing.TB, kind ep.Kind, ranks int, cfg ep.Config) *rig {
	t.Helper()
	return newRigOn(t, kind, ranks, cfg, func(i int) (ep.Device, error) { return ep.OpenDevice(kind, ordinalOf(t, kind, i)) })
}

// newRigOn is newRig on the devices open returns (kind says what they
// are: Host for the CPU emulation, whose source loader the counting
// wrapper keeps, so that package internode still sees an emulated device).
func newRigOn(t testing.TB, kind ep.Kind, ranks int, cfg ep.Config, open func(i int) (ep.Device, error)) *rig {
	t.Helper()
	r := &rig{kind: kind, cfg: cfg, bufs: make([]*ep.Buffer, ranks), streams: make([]ep.Stream, ranks)}
	var err error
	r.boots, err = bootstrap.NewInProcess(ranks, bootstrap.Config{Timeout: 30 * time.Second})
	require.NoError(t, err)
	for i := 0; i < ranks; i++ {
		d, err := open(i)
		require.NoError(t, err)
		c := newCounting(d)
		r.devs = append(r.devs, d)
		r.counts = append(r.counts, c)
	}
	t.Cleanup(func() {
		if !r.closed {
			require.NoError(t, r.close())
		}
		for i := range r.devs {
			a, m, imp := r.counts[i].live()
			require.Zero(t, a+m+imp, "rank %d: %d allocations, %d host-mapped, %d imports left after Close", i, a, m, imp)
			require.NoError(t, r.devs[i].Close())
			require.NoError(t, r.boots[i].Close())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, r.run(func(i int, _ *ep.Buffer) error {
		var dev ep.Device = r.counts[i]
		if src, ok := r.devs[i].(sourceLoader); ok {
			dev = countingEmu{r.counts[i], src}
		}
		b, err := ep.NewBuffer(ctx, r.boots[i], dev, cfg)
		r.bufs[i] = b
		if err != nil {
			return err
		}
		r.streams[i], err = r.devs[i].NewStream()
		return err
	}))
	return r
}

// run calls f on every rank at once and joins the errors.
func (r *rig) run(f func(i int, b *ep.Buffer) error) error {
	errs := make([]error, len(r.bufs))
	var wg sync.WaitGroup
	for i := range r.bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i, r.bufs[i]); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// graph is a captured graph (ep.Device.Capture's result).
type graph interface {
	Launch(ep.Stream) error
}

// capture records issue(i, b, stream) of every rank into a graph on its
// stream (a Cleanup closes them).
func (r *rig) capture(t testing.TB, issue func(i int, b *ep.Buffer, st ep.Stream) error) []graph {
	t.Helper()
	graphs := make([]graph, len(r.bufs))
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		g, err := r.devs[i].Capture(r.streams[i], func() error { return issue(i, b, r.streams[i]) })
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = g.Close() })
		graphs[i] = g
		return nil
	}), "capture")
	return graphs
}

// replay launches every rank's graph, waits for it and checks the Buffer.
func (r *rig) replay(graphs []graph) error {
	return r.run(func(i int, b *ep.Buffer) error {
		if err := graphs[i].Launch(r.streams[i]); err != nil {
			return err
		}
		if err := r.streams[i].Synchronize(); err != nil {
			return err
		}
		return b.Check()
	})
}

func (r *rig) close() error {
	r.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return r.run(func(i int, b *ep.Buffer) error {
		var errs []error
		if r.streams[i] != nil {
			errs = append(errs, r.streams[i].Synchronize(), r.streams[i].Close())
		}
		if b != nil {
			errs = append(errs, b.Close(ctx))
		}
		return errors.Join(errs...)
	})
}

// mem is device memory a test allocated; freed at Cleanup.
func alloc(t testing.TB, d ep.Device, n int) uintptr {
	b, err := d.Alloc(max(n, 256))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Free(b) })
	return b.Ptr
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func toDev[T any](t testing.TB, d ep.Device, s []T) uintptr {
	var z T
	p := alloc(t, d, len(s)*int(unsafe.Sizeof(z)))
	if len(s) > 0 {
		require.NoError(t, d.CopyIn(p, bytesOf(s)))
	}
	return p
}

func fromDev[T any](t testing.TB, d ep.Device, p uintptr, n int) []T {
	out := make([]T, n)
	if n > 0 {
		require.NoError(t, d.CopyOut(bytesOf(out), p))
	}
	return out
}

func poison(t testing.TB, d ep.Device, p uintptr, n int) {
	if n > 0 {
		require.NoError(t, d.MemsetAsync(p, 0xEE, n, nil))
		require.NoError(t, d.DefaultStream().Synchronize())
	}
}

// integer is what sameSlice compares: types whose == is equality of bytes,
// so that whole slices compare as memory (floats go through sameFloats).
type integer interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~uint
}

// sameSlice fails with the first differing index instead of a megabyte diff.
// GPU-sized checks compare hundreds of megabytes: the whole slices compare
// as bytes first (memcmp speed), and only a difference is walked element by
// element to report it.
func sameSlice[T integer](t testing.TB, want, got []T, format string, a ...any) {
	t.Helper()
	if len(want) == len(got) && bytes.Equal(bytesOf(want), bytesOf(got)) {
		return
	}
	what := fmt.Sprintf(format, a...)
	require.Equal(t, len(want), len(got), "%s: length", what)
	for i := range want {
		if want[i] != got[i] {
			n := 0
			for j := range want {
				if want[j] != got[j] {
					n++
				}
			}
			t.Fatalf("%s: %d of %d elements differ; first at %d: want %v, got %v", what, n, len(want), i, want[i], got[i])
		}
	}
	t.Fatalf("%s: bytes differ but no element does", what) // unreachable for integers
}

// sameFloats compares float32 slices bit for bit (as bytes; their bits
// only to report a difference).
func sameFloats(t testing.TB, want, got []float32, format string, a ...any) {
	t.Helper()
	if len(want) == len(got) && bytes.Equal(bytesOf(want), bytesOf(got)) {
		return
	}
	w, g := make([]uint32, len(want)), make([]uint32, len(got))
	for i, v := range want {
		w[i] = math.Float32bits(v)
	}
	for i, v := range got {
		g[i] = math.Float32bits(v)
	}
	sameSlice(t, w, g, format, a...)
}

func randF32(rng *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return w
}

func randFP8(rng *rand.Rand, n int) []uint8 {
	x := make([]uint8, n)
	parallel.FillChunks(rng, n, func(rng *rand.Rand, lo, hi int) {
		var bits uint64
		for i := lo; i < hi; i++ {
			if (i-lo)%8 == 0 {
				bits = rng.Uint64()
			}
			x[i] = uint8(bits) & 0x7e // finite E4M3
			bits >>= 8
		}
	})
	return x
}
