package intranode_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"github.com/goep-dev/goep/intranode/intranodetest"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/parallel"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// gpuCount is how many CUDA GPUs this machine has (0 without a driver).
func gpuCount(t testing.TB) int {
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Logf("CUDA backend skipped: no CUDA GPU (%v)", err)
		return 0
	}
	return n
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// upload copies s into a new device buffer (at least 256 bytes, so that
// empty inputs still have a valid, aligned pointer).
func upload[T any](t testing.TB, d device.Device, s []T) device.Buffer {
	var z T
	n := max(len(s)*int(unsafe.Sizeof(z)), 256)
	b, err := d.Alloc(n)
	require.NoError(t, err)
	if len(s) > 0 {
		require.NoError(t, d.CopyIn(b.Ptr, bytesOf(s)))
	}
	return b
}

func download[T any](t testing.TB, d device.Device, p uintptr, n int) []T {
	out := make([]T, n)
	if n > 0 {
		require.NoError(t, d.CopyOut(bytesOf(out), p))
	}
	return out
}

func alloc(t testing.TB, d device.Device, n int) device.Buffer {
	b, err := d.Alloc(max(n, 256))
	require.NoError(t, err)
	return b
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

// spec is one dispatch/combine scenario.
type spec struct {
	name      string
	ranks     int
	tokens    []int // per rank
	maxTokens int   // 0: max(tokens)
	hidden    int
	topk      int
	experts   int
	fp8       bool
	weights   bool
	bias      int // biases in combine: 0, 1 or 2
	align     int
	gen       routing.GenOptions
	specialY  bool // put +-0, +-inf, NaN, subnormals into combine inputs
	yIsRecv   bool // combine the received rows themselves (DeepEP's check); same as ymode "recv"
	// ymode places each rank's combine input (see combineInput): "" or
	// "copy" outside the workspace (staged by the copy kernel), "rows"
	// outside with CombineArgs.Rows (staged by device copies), "recv" the
	// receive region itself (y = recv_x, weights = recv_weights),
	// "cinput" the combine input region, "mixed" a different one per rank.
	ymode string
	iters int // notify+dispatch, cached dispatch, combine: this many rounds
	cfg   intranode.LaunchConfig
	// notifyDispatch launches non-cached dispatches with
	// Workspace.NotifyDispatch (no entry wait) instead of two calls.
	notifyDispatch bool
}

func (s spec) layout() intranode.Config {
	mt := s.maxTokens
	for _, n := range s.tokens {
		mt = max(mt, n)
	}
	return intranode.Config{Ranks: s.ranks, MaxTokens: max(mt, 1), Hidden: s.hidden, TopK: s.topk,
		LocalExperts: s.experts / s.ranks, FP8: s.fp8}
}

func (s spec) String() string {
	return fmt.Sprintf("%s/R=%d/T=%v/H=%d/K=%d/E=%d/fp8=%v", s.name, s.ranks, s.tokens, s.hidden, s.topk, s.experts, s.fp8)
}

// combineInput is where rank r puts its combine input under s.
func (s spec) combineInput(r int) string {
	m := s.ymode
	if s.yIsRecv {
		m = "recv"
	}
	if m == "mixed" {
		m = []string{"cinput", "recv", "copy", "rows"}[r%4]
	}
	if m == "" {
		m = "copy"
	}
	return m
}

// rankData is one rank's host inputs and device buffers for a scenario.
type rankData struct {
	in      intranode.RankInput
	topk    device.Buffer
	x       device.Buffer
	scales  device.Buffer
	weights device.Buffer
	handle  intranode.Handle
}

func randF32(rng *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	return w
}

// newInputs draws rank r's dispatch input for s (x and weights from seed).
func newInputs(t testing.TB, s spec, r int, ids []int64, seed uint64) intranode.RankInput {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	n := s.tokens[r]
	in := intranode.RankInput{TopK: ids}
	if s.fp8 {
		in.XFP8 = make([]uint8, n*s.hidden)
		parallel.FillChunks(rng, len(in.XFP8), func(rng *rand.Rand, lo, hi int) {
			for i := lo; i < hi; i += 8 {
				v := rng.Uint64()
				for j := i; j < min(i+8, hi); j++ {
					in.XFP8[j] = uint8(v >> (8 * (j - i)))
				}
			}
		})
		in.Scales = randF32(rng, n*s.hidden/128)
	} else {
		in.X = intranodetest.RandBF16(rng, n*s.hidden, false)
	}
	if s.weights {
		in.Weights = randF32(rng, n*s.topk)
	}
	return in
}

func (rd *rankData) uploadX(t testing.TB, d device.Device, s spec) {
	for _, b := range []device.Buffer{rd.x, rd.scales, rd.weights} {
		if b.Ptr != 0 {
			require.NoError(t, d.Free(b))
		}
	}
	rd.x, rd.scales, rd.weights = device.Buffer{}, device.Buffer{}, device.Buffer{}
	if s.fp8 {
		rd.x = upload(t, d, rd.in.XFP8)
		rd.scales = upload(t, d, rd.in.Scales)
	} else {
		rd.x = upload(t, d, rd.in.X)
	}
	if s.weights {
		rd.weights = upload(t, d, rd.in.Weights)
	}
}

func (rd *rankData) dispatchArgs(s spec) intranode.DispatchArgs {
	return intranode.DispatchArgs{X: rd.x.Ptr, FP8: s.fp8, Scales: rd.scales.Ptr, TopK: rd.topk.Ptr,
		Weights: rd.weights.Ptr, Handle: rd.handle}
}

// poison fills every region a dispatch or combine writes, and the handle,
// with 0xEE so that an element a kernel skips cannot pass for a zero.
func poison(t testing.TB, r *intranodetest.Rank, handleToo bool, extra ...device.Buffer) {
	l := r.WS.Layout
	regions := []intranode.Region{l.RecvX, l.RecvScales, l.RecvSrcToken, l.RecvTopK, l.RecvWeights,
		l.CombineX, l.CombineWeights}
	if handleToo {
		regions = append(regions, l.SendPos, l.RankPrefix, l.RecvBase, l.NumRecv)
	}
	for _, reg := range regions {
		if reg.Size > 0 {
			require.NoError(t, r.Dev.MemsetAsync(r.WS.Base+uintptr(reg.Offset), 0xEE, reg.Size, nil))
		}
	}
	for _, b := range extra {
		if b.Ptr != 0 {
			require.NoError(t, r.Dev.MemsetAsync(b.Ptr, 0xEE, b.Size, nil))
		}
	}
	require.NoError(t, r.Dev.DefaultStream().Synchronize())
	for i := range r.ExpertCounts.Host {
		r.ExpertCounts.Host[i] = 0xEE
	}
}

// run calls f on every rank at once with its own stream, then synchronises
// every stream and checks every rank's timeout record.
func run(t testing.TB, g *intranodetest.Group, streams []device.Stream, f func(i int, r *intranodetest.Rank, s device.Stream) error) {
	t.Helper()
	// A call that takes seconds is a stall (ranks sharing a GPU: see
	// ARCHITECTURE.md): when each rank's launches returned and when its
	// stream drained, and every goroutine's stack 5 s in, tell a launch
	// held on the host (a goroutine inside a driver call) from kernels
	// queued but not run.
	start := time.Now()
	launched := make([]time.Duration, len(g.Ranks))
	drained := make([]time.Duration, len(g.Ranks))
	stacks := make(chan []byte, 1)
	slow := time.AfterFunc(5*time.Second, func() {
		buf := make([]byte, 256<<10)
		stacks <- buf[:runtime.Stack(buf, true)]
	})
	err := g.Run(func(i int, r *intranodetest.Rank) error {
		if err := f(i, r, streams[i]); err != nil {
			return err
		}
		launched[i] = time.Since(start)
		if err := streams[i].Synchronize(); err != nil {
			return err
		}
		drained[i] = time.Since(start)
		return r.Check()
	})
	slow.Stop()
	select {
	case st := <-stacks:
		t.Logf("slow call (%v): per rank, launches returned at %v, stream drained at %v; goroutines 5 s in:\n%s",
			time.Since(start), launched, drained, st)
	default:
	}
	if err != nil {
		dumpControl(t, g)
	}
	require.NoError(t, err)
}

// dumpControl logs every rank's control block (epochs, fingerprints,
// arrivals and entries per kind) after a failed launch: which signals
// landed tells a lost signal from a launch that never ran.
func dumpControl(t testing.TB, g *intranodetest.Group) {
	t.Helper()
	for i, r := range g.Ranks {
		l := r.WS.Layout
		b := make([]byte, intranode.CtrlBytes)
		if err := r.Dev.CopyOut(b, r.WS.Base+uintptr(l.Ctrl.Offset)); err != nil {
			t.Logf("rank %d: control block: %v", i, err)
			continue
		}
		u := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
		var sb strings.Builder
		fmt.Fprintf(&sb, "rank %d: epochs", i)
		for k := 0; k < 3; k++ {
			fmt.Fprintf(&sb, " %d", u(intranode.EpochOffset(k)))
		}
		for k, name := range []string{"notify", "dispatch", "combine"} {
			fmt.Fprintf(&sb, " | %s arrive/entered:", name)
			for src := 0; src < l.Ranks; src++ {
				const progress = 1<<intranode.SignalShift - 1 // the tag above it (device kernels)
				fmt.Fprintf(&sb, " %d/%d", u(intranode.ArriveOffset(k, src))&progress>>20,
					u(intranode.EnteredOffset(k, src))&progress)
			}
		}
		fmt.Fprintf(&sb, " | fp seq (host twins):")
		for src := 0; src < l.Ranks; src++ {
			fmt.Fprintf(&sb, " %d", uint16(u(intranode.FingerprintOffset(src))))
		}
		// Device kernels: pub[src] = {fp lo, n, fp hi, n}; the launch
		// number n of src's last published word (0: never published).
		fmt.Fprintf(&sb, " | published launch:")
		for src := 0; src < l.Ranks; src++ {
			fmt.Fprintf(&sb, " %d", uint32(u(intranode.PublishedOffset(src))>>32))
		}
		t.Log(sb.String())
	}
}

func newStreams(t testing.TB, g *intranodetest.Group) []device.Stream {
	ss := make([]device.Stream, len(g.Ranks))
	for i, r := range g.Ranks {
		s, err := r.Dev.NewStream()
		require.NoError(t, err)
		ss[i] = s
		t.Cleanup(func() { s.Close() })
	}
	return ss
}

func newGroup(t testing.TB, kind device.Kind, c intranode.Config, timeout time.Duration) *intranodetest.Group {
	l, err := intranode.NewLayout(c)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := intranodetest.NewGroup(ctx, kind, l, intranodetest.RankOptions{Timeout: timeout, WaitID: 77})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, g.Close(ctx))
	})
	return g
}

// checkDispatch compares one rank's receive region and handle with the
// reference, byte for byte.
func checkDispatch(t testing.TB, s spec, r *intranodetest.Rank, rd *rankData, want intranode.RankOutput, what string) {
	t.Helper()
	d, l := r.Dev, r.WS.Layout
	n := want.Received()
	rank := r.WS.Rank
	sameSlice(t, want.RankPrefix, download[int32](t, d, rd.handle.RankPrefix, s.ranks), "%s: rank %d rank prefix", what, rank)
	require.Equal(t, int32(n), download[int32](t, d, rd.handle.NumRecv, 1)[0], "%s: rank %d recv count", what, rank)
	v := r.WS.Recv()
	if s.fp8 {
		sameSlice(t, want.RecvXFP8, download[uint8](t, d, v.X, n*s.hidden), "%s: rank %d recv x (fp8)", what, rank)
		sameFloats(t, want.RecvScales, download[float32](t, d, v.Scales, n*s.hidden/128), "%s: rank %d recv scales", what, rank)
	} else {
		sameSlice(t, want.RecvX, download[uint16](t, d, v.X, n*s.hidden), "%s: rank %d recv x", what, rank)
	}
	sameSlice(t, want.RecvSrcToken, download[int32](t, d, v.SrcToken, n), "%s: rank %d recv src token", what, rank)
	sameSlice(t, want.RecvTopK, download[int64](t, d, v.TopK, n*l.TopK), "%s: rank %d recv topk", what, rank)
	if s.weights {
		sameFloats(t, want.RecvWeights, download[float32](t, d, v.Weights, n*l.TopK), "%s: rank %d recv weights", what, rank)
	}
	// The source of each row follows from the prefix.
	src := make([]int32, n)
	lo := int32(0)
	for sr, hi := range want.RankPrefix {
		for i := lo; i < hi; i++ {
			src[i] = int32(sr)
		}
		lo = hi
	}
	sameSlice(t, want.RecvSrcRank, src, "%s: rank %d recv src rank", what, rank)
}
