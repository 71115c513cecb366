// Package colltest holds the correctness checks of package collectives,
// written once and run by its tests (goroutine ranks on the host backend
// and on GPUs) and by `ep-bench collectives` (goroutine ranks or one
// process per GPU). Every check is collective: all ranks call it with the
// same arguments in the same order.
//
// Data comes from the generator every rank, the host and the kernels share
// (collectives/ref.FillElem): inputs are written on the device by
// goep_coll_fill, outputs are compared with the plain-Go reference on the
// host (every element up to HostLimit bytes, a sample beyond) and by
// goep_coll_check on the device (every element, any size).

package colltest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// HostLimit: outputs up to this many bytes are compared element by element
// on the host by default (Buffers.HostLimit); larger ones on a sample (and
// in full on the device).
const HostLimit = 64 << 20

// sampleCopyLimit: outputs up to this size are copied to the host whole for
// a sampled comparison; larger ones element by element.
const sampleCopyLimit = 256 << 20

// Guard is the byte written around outputs to catch stray writes.
const Guard = 0xA5

// guardBytes is the guard checked on each side of an output.
const guardBytes = 256

// RunLocal runs fn on n goroutine ranks of this process, rank r on
// host-backend rank r or GPU r mod the GPUs present (device.OpenRank), each with its own communicator (cfg). A rank whose fn fails
// closes its bootstrap so the others fail fast; no rank closes its
// communicator before every rank's fn has returned (peers may still use its
// memory).
func RunLocal(ctx context.Context, kind device.Kind, n int, bcfg bootstrap.Config, cfg collectives.Config,
	fn func(ctx context.Context, c *collectives.Communicator) error) []error {
	return RunLocalWith(ctx, kind, n, bcfg, func(int) collectives.Config { return cfg }, fn)
}

// RunLocalWith is RunLocal with a configuration per rank.
func RunLocalWith(ctx context.Context, kind device.Kind, n int, bcfg bootstrap.Config, cfg func(rank int) collectives.Config,
	fn func(ctx context.Context, c *collectives.Communicator) error) []error {
	open := func(r int) (device.Device, error) { return device.OpenRank(kind, r) }
	return RunDevices(ctx, n, open, bcfg, cfg, fn)
}

// RunDevices is RunLocalWith on devices that open makes (rank r's device;
// RunDevices closes it).
func RunDevices(ctx context.Context, n int, open func(rank int) (device.Device, error), bcfg bootstrap.Config,
	cfg func(rank int) collectives.Config, fn func(ctx context.Context, c *collectives.Communicator) error) []error {
	errs := make([]error, n)
	bss, err := bootstrap.NewInProcess(n, bcfg)
	if err != nil {
		for r := range errs {
			errs[r] = err
		}
		return errs
	}
	var wg, finished sync.WaitGroup
	finished.Add(n)
	for r, bs := range bss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = runRank(ctx, open, r, bs, cfg(r), &finished, fn)
		}()
	}
	wg.Wait()
	return errs
}

func runRank(ctx context.Context, open func(int) (device.Device, error), r int, bs bootstrap.Bootstrap, cfg collectives.Config,
	finished *sync.WaitGroup, fn func(context.Context, *collectives.Communicator) error) (err error) {
	done := false
	defer func() {
		if !done {
			finished.Done()
		}
		err = errors.Join(err, bs.Close())
	}()
	dev, err := open(r)
	if err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	c, err := collectives.New(ctx, bs, dev, cfg)
	if err != nil {
		return err
	}
	err = fn(ctx, c)
	if err != nil {
		_ = bs.Close()
	}
	done = true
	finished.Done()
	finished.Wait()
	return errors.Join(err, c.Close())
}

// Buffers is one rank's test memory: a send and a recv arena, optionally
// registered for the zero-copy algorithms, and a small result buffer.
type Buffers struct {
	C          *collectives.Communicator
	Dev        device.Device
	Send, Recv device.Buffer
	Registered bool
	// HostLimit bounds the outputs compared in full on the host (default
	// the package's HostLimit); larger ones are sampled.
	HostLimit int
	out       device.Buffer
}

// NewBuffers allocates arenas of size bytes (collective when register:
// every rank registers both).
func NewBuffers(ctx context.Context, c *collectives.Communicator, size int, register bool) (_ *Buffers, err error) {
	b := &Buffers{C: c, Dev: c.Device(), HostLimit: HostLimit}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Free())
		}
	}()
	if b.Send, err = b.Dev.Alloc(size); err != nil {
		return nil, err
	}
	if b.Recv, err = b.Dev.Alloc(size); err != nil {
		return nil, err
	}
	if b.out, err = b.Dev.Alloc(4096); err != nil {
		return nil, err
	}
	if register {
		if _, err = c.Register(ctx, b.Send); err != nil {
			return nil, err
		}
		if _, err = c.Register(ctx, b.Recv); err != nil {
			return nil, err
		}
		b.Registered = true
	}
	return b, nil
}

// Free frees the arenas (registrations stay until the communicator closes:
// free only after every rank is done with them).
func (b *Buffers) Free() error {
	var errs []error
	for _, x := range []*device.Buffer{&b.Send, &b.Recv, &b.out} {
		if x.Ptr != 0 {
			errs = append(errs, b.Dev.Free(*x))
			*x = device.Buffer{}
		}
	}
	return errors.Join(errs...)
}

// Case is one collective call to check.
type Case struct {
	Kind      collectives.Kind
	Algorithm string // "" lets the selector choose
	Blocks    int
	Count     int // allreduce: elements; allgather: per rank sent; reduce-scatter: per rank received
	DType     collectives.DataType
	Op        collectives.Op
	InPlace   bool
	Offset    int // elements between the arena start and the buffers (misalignment)
	Fill      ref.Fill
	Seed      uint32
	Graph     bool // capture the call into a CUDA graph, replay it (Replays, default 1)
	Replays   int
}

func (k Case) String() string {
	s := fmt.Sprintf("%s/%s %d x %s", k.Kind, algoName(k.Algorithm), k.Count, k.DType)
	if k.Kind != collectives.AllGather {
		s += " " + k.Op.String()
	}
	if k.InPlace {
		s += " in-place"
	}
	if k.Offset != 0 {
		s += fmt.Sprintf(" +%d", k.Offset)
	}
	if k.Graph {
		s += fmt.Sprintf(" graph x%d", max(k.Replays, 1))
	}
	return s
}

func algoName(a string) string {
	if a == "" {
		return "auto"
	}
	return a
}

// layout is where a case's buffers sit in the arenas.
type layout struct {
	send, recv           uintptr
	sendBytes, recvBytes int
	fillAt               uintptr // where this rank's input is generated
}

func (b *Buffers) layout(k Case) (layout, error) {
	W, me := b.C.Size(), b.C.Rank()
	e := k.DType.Size()
	n := k.Count * e
	var l layout
	switch k.Kind {
	case collectives.AllReduce:
		l.sendBytes, l.recvBytes = n, n
	case collectives.AllGather:
		l.sendBytes, l.recvBytes = n, W*n
	case collectives.ReduceScatter:
		l.sendBytes, l.recvBytes = W*n, n
	}
	off := uintptr(k.Offset*e) + guardBytes
	l.send, l.recv = b.Send.Ptr+off, b.Recv.Ptr+off
	if k.InPlace {
		switch k.Kind {
		case collectives.AllReduce:
			l.send = l.recv
		case collectives.AllGather:
			l.send = l.recv + uintptr(me*n)
		case collectives.ReduceScatter:
			l.recv = l.send + uintptr(me*n)
		}
	}
	l.fillAt = l.send
	need := int(off) + max(l.sendBytes, l.recvBytes) + guardBytes
	if need > b.Send.Size || need > b.Recv.Size {
		return l, fmt.Errorf("%s needs %d bytes of arena, have %d", k, need, min(b.Send.Size, b.Recv.Size))
	}
	return l, nil
}

func (b *Buffers) launch(kernel string, s device.Stream, args *device.Args, items int) error {
	grid := max(1, min(264, (items+511)/512))
	if b.Dev.Info().Kind == device.Host {
		grid = 1
	}
	return b.Dev.Launch(kernel, device.D1(grid), device.D1(512), 0, s, args)
}

// fill generates this rank's input of k at l.
func (b *Buffers) fill(k Case, l layout, s device.Stream, seed uint32) error {
	count := l.sendBytes / k.DType.Size()
	args := device.NewArgs(7).Ptr(l.fillAt).U64(uint64(count)).U32(uint32(k.DType)).U32(uint32(k.Fill)).
		U32(seed).U32(uint32(b.C.Rank())).U64(0)
	return b.launch(abi.KernelFill, s, args, count)
}

// check enqueues goep_coll_check of k's output (results accumulate in out).
func (b *Buffers) check(k Case, l layout, s device.Stream, seed uint32) error {
	count := l.recvBytes / k.DType.Size()
	args := device.NewArgs(11).Ptr(l.recv).U64(uint64(count)).U32(uint32(k.DType)).U32(uint32(k.Op)).
		U32(uint32(k.Fill)).U32(seed).U32(k.Kind.ABICode()).U32(uint32(b.C.Size())).
		U32(uint32(b.C.Rank())).U64(uint64(k.Count)).Ptr(b.out.Ptr)
	return b.launch(abi.KernelCheck, s, args, count)
}

func (b *Buffers) resetOut() error {
	var z [16]byte
	binary.LittleEndian.PutUint64(z[8:], ^uint64(0))
	return b.Dev.CopyIn(b.out.Ptr, z[:])
}

func (b *Buffers) readOut() (bad, first uint64, err error) {
	var z [16]byte
	if err := b.Dev.CopyOut(z[:], b.out.Ptr); err != nil {
		return 0, 0, err
	}
	return binary.LittleEndian.Uint64(z[:]), binary.LittleEndian.Uint64(z[8:]), nil
}

// issue enqueues k's collective.
func (b *Buffers) issue(ctx context.Context, k Case, l layout, s device.Stream) (*collectives.Work, error) {
	var opts []collectives.CallOption
	if k.Algorithm != "" {
		opts = append(opts, collectives.WithAlgorithm(k.Algorithm))
	}
	if k.Blocks > 0 {
		opts = append(opts, collectives.WithBlocks(k.Blocks))
	}
	switch k.Kind {
	case collectives.AllGather:
		return b.C.AllGather(ctx, s, l.send, l.recv, k.Count, k.DType, opts...)
	case collectives.ReduceScatter:
		return b.C.ReduceScatter(ctx, s, l.send, l.recv, k.Count, k.DType, k.Op, opts...)
	}
	return b.C.AllReduce(ctx, s, l.send, l.recv, k.Count, k.DType, k.Op, opts...)
}

// expected is element i of this rank's output of k with seed.
func (b *Buffers) expected(k Case, seed uint32) func(i uint64) uint32 {
	W, me := b.C.Size(), b.C.Rank()
	switch k.Kind {
	case collectives.AllGather:
		return func(i uint64) uint32 { return ref.ExpectedAllGather(k.DType, k.Fill, seed, uint64(k.Count), i) }
	case collectives.ReduceScatter:
		return func(i uint64) uint32 {
			return ref.ExpectedReduceScatter(k.DType, k.Op, k.Fill, seed, W, me, uint64(k.Count), i)
		}
	}
	return func(i uint64) uint32 { return ref.ExpectedAllReduce(k.DType, k.Op, k.Fill, seed, W, i) }
}

// Fits reports whether k's forced algorithm can run k on this
// communicator (LL algorithms are bounded by the packet buffer).
func (b *Buffers) Fits(k Case) bool {
	if k.Algorithm == "" {
		return true
	}
	return b.C.CanRun(k.Kind, k.Algorithm, k.Count, k.DType, k.Op, b.Registered) == nil
}

// Check runs case k once (or as a graph replayed k.Replays times) and
// checks the output: against the plain-Go reference on the host (all of it
// up to HostLimit, a sample beyond), on the device in full, and the guard
// bytes around it. It returns the algorithm that ran.
func (b *Buffers) Check(ctx context.Context, k Case) (string, error) {
	l, err := b.layout(k)
	if err != nil {
		return "", err
	}
	s := b.Dev.DefaultStream()
	fail := func(format string, a ...any) error {
		return fmt.Errorf("rank %d: %s: %s", b.C.Rank(), k, fmt.Sprintf(format, a...))
	}
	// Guards and a poisoned output (a skipped write shows).
	if err := b.poison(l.recv, l.recvBytes, s); err != nil {
		return "", err
	}
	if l.send != l.recv && (l.send < l.recv || l.send >= l.recv+uintptr(l.recvBytes)) {
		if err := b.poison(l.send, l.sendBytes, s); err != nil {
			return "", err
		}
	}
	if err := b.fill(k, l, s, k.Seed); err != nil {
		return "", err
	}
	if err := b.resetOut(); err != nil {
		return "", err
	}
	if err := s.Synchronize(); err != nil {
		return "", err
	}
	// Peers must not write into this rank's output before it is poisoned.
	if err := b.C.Barrier(ctx); err != nil {
		return "", err
	}
	var w *collectives.Work
	if k.Graph {
		g, err := b.Dev.Capture(s, func() error {
			var err error
			w, err = b.issue(ctx, k, l, s)
			return err
		})
		if err != nil {
			return "", fail("capture: %v", err)
		}
		defer g.Close()
		for range max(k.Replays, 1) {
			if err := g.Launch(s); err != nil {
				return "", fail("graph launch: %v", err)
			}
		}
	} else if w, err = b.issue(ctx, k, l, s); err != nil {
		return "", err
	}
	if err := s.Synchronize(); err != nil {
		return "", fail("synchronize: %v", err)
	}
	if err := w.Sync(ctx); err != nil {
		return "", err
	}
	if err := b.C.Check(); err != nil {
		return "", err
	}
	if err := b.check(k, l, s, k.Seed); err != nil {
		return "", err
	}
	if err := s.Synchronize(); err != nil {
		return "", err
	}
	bad, first, err := b.readOut()
	if err != nil {
		return "", err
	}
	if bad != 0 {
		return "", fail("device check: %d wrong elements, the first at %d", bad, first)
	}
	if err := b.hostCompare(k, l); err != nil {
		return "", fail("%v", err)
	}
	if err := b.guards(l); err != nil {
		return "", fail("%v", err)
	}
	// Nobody may refill its input while a peer still reads it (zero-copy).
	if err := b.C.Barrier(ctx); err != nil {
		return "", err
	}
	return w.Algorithm(), nil
}

// poison sets [p-guard, p+n+guard) to the guard byte (clipped to the arena
// holding p).
func (b *Buffers) poison(p uintptr, n int, s device.Stream) error {
	for _, a := range []device.Buffer{b.Send, b.Recv} {
		if p >= a.Ptr && p < a.Ptr+uintptr(a.Size) {
			lo := max(p-guardBytes, a.Ptr)
			hi := min(p+uintptr(n)+guardBytes, a.Ptr+uintptr(a.Size))
			return b.Dev.MemsetAsync(lo, Guard, int(hi-lo), s)
		}
	}
	return fmt.Errorf("buffer %#x is outside the arenas", p)
}

// hostCompare compares the output with the reference on the host: every
// element up to HostLimit bytes, else the first and last and 4096 random
// ones.
func (b *Buffers) hostCompare(k Case, l layout) error {
	want := b.expected(k, k.Seed)
	e := k.DType.Size()
	n := l.recvBytes / e
	if l.recvBytes <= b.HostLimit {
		got := make([]byte, l.recvBytes)
		if err := b.Dev.CopyOut(got, l.recv); err != nil {
			return err
		}
		if m := ref.Compare(got, k.DType, want); m != nil {
			return fmt.Errorf("host check: %d of %d elements wrong, the first at %d: %#x, want %#x", m.Count, n, m.Index, m.Got, m.Want)
		}
		return nil
	}
	idx := []int{0, n - 1}
	rng := rand.New(rand.NewPCG(uint64(k.Seed), 7))
	for range 4096 {
		idx = append(idx, rng.IntN(n))
	}
	var whole []byte
	if l.recvBytes <= sampleCopyLimit {
		whole = make([]byte, l.recvBytes)
		if err := b.Dev.CopyOut(whole, l.recv); err != nil {
			return err
		}
	}
	var one [4]byte
	for _, i := range idx {
		var got uint32
		if whole != nil {
			got = ref.Elem(whole, k.DType, i)
		} else {
			if err := b.Dev.CopyOut(one[:e], l.recv+uintptr(i*e)); err != nil {
				return err
			}
			got = ref.Elem(one[:e], k.DType, 0)
		}
		if w := want(uint64(i)); got != w {
			return fmt.Errorf("host sample: element %d is %#x, want %#x", i, got, w)
		}
	}
	return nil
}

// guards checks the bytes around the output.
func (b *Buffers) guards(l layout) error {
	var g [guardBytes]byte
	for _, at := range []uintptr{l.recv - guardBytes, l.recv + uintptr(l.recvBytes)} {
		if at < b.Recv.Ptr || at+guardBytes > b.Recv.Ptr+uintptr(b.Recv.Size) {
			continue
		}
		if err := b.Dev.CopyOut(g[:], at); err != nil {
			return err
		}
		for i, v := range g {
			if v != Guard {
				return fmt.Errorf("byte %d outside the output (at %+d) changed to %#x", i, int(at-l.recv), v)
			}
		}
	}
	return nil
}

// Prepare poisons k's output region and generates this rank's input (on
// the stream; synchronise before use).
func (b *Buffers) Prepare(k Case, s device.Stream) error {
	l, err := b.layout(k)
	if err != nil {
		return err
	}
	if err := b.poison(l.recv, l.recvBytes, s); err != nil {
		return err
	}
	return b.fill(k, l, s, k.Seed)
}

// Issue enqueues k's collective on s.
func (b *Buffers) Issue(ctx context.Context, k Case, s device.Stream) (*collectives.Work, error) {
	l, err := b.layout(k)
	if err != nil {
		return nil, err
	}
	return b.issue(ctx, k, l, s)
}

// VerifyDevice checks k's output in full on the device (after Prepare and
// Issue with the same k) and waits for the answer.
func (b *Buffers) VerifyDevice(k Case, s device.Stream) error {
	l, err := b.layout(k)
	if err != nil {
		return err
	}
	if err := b.resetOut(); err != nil {
		return err
	}
	if err := b.check(k, l, s, k.Seed); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := b.C.Check(); err != nil {
		return err
	}
	bad, first, err := b.readOut()
	if err != nil {
		return err
	}
	if bad != 0 {
		return fmt.Errorf("rank %d: %s: %d wrong elements, the first at %d", b.C.Rank(), k, bad, first)
	}
	return nil
}

// BackToBack issues iters calls of k without synchronising, each with a
// fresh seed (fill, collective, device check all stream-ordered), cycling
// through algorithms when given (so consecutive calls use different ones),
// and checks every result on the device. It returns the calls' algorithms.
func (b *Buffers) BackToBack(ctx context.Context, k Case, iters int, algorithms []string) ([]string, error) {
	l, err := b.layout(k)
	if err != nil {
		return nil, err
	}
	if k.InPlace {
		return nil, fmt.Errorf("back-to-back checks refill the input: use out-of-place cases")
	}
	s := b.Dev.DefaultStream()
	if err := b.resetOut(); err != nil {
		return nil, err
	}
	used := map[string]bool{}
	var w *collectives.Work
	for i := 0; i < iters; i++ {
		kk := k
		if len(algorithms) > 0 {
			kk.Algorithm = algorithms[i%len(algorithms)]
		}
		seed := k.Seed + uint32(i)*0x9e37
		if err := b.fill(kk, l, s, seed); err != nil {
			return nil, err
		}
		if w, err = b.issue(ctx, kk, l, s); err != nil {
			return nil, fmt.Errorf("rank %d: call %d (%s): %w", b.C.Rank(), i, kk, err)
		}
		used[w.Algorithm()] = true
		if err := b.check(kk, l, s, seed); err != nil {
			return nil, err
		}
	}
	if err := s.Synchronize(); err != nil {
		return nil, err
	}
	if err := w.Sync(ctx); err != nil {
		return nil, err
	}
	bad, first, err := b.readOut()
	if err != nil {
		return nil, err
	}
	if bad != 0 {
		return nil, fmt.Errorf("rank %d: %s, %d back-to-back calls: %d wrong elements (first index %d)", b.C.Rank(), k, iters, bad, first)
	}
	var out []string
	for a := range used {
		out = append(out, a)
	}
	return out, b.C.Barrier(ctx)
}

// GraphPair captures two calls of k with different seeds into one graph
// (fill, collective, device check, twice), replays it replays times and
// checks every result on the device: consecutive collectives in the graph
// carry different data, so one that read a stale packet or scratch slot of
// the previous replay or call would fail.
func (b *Buffers) GraphPair(ctx context.Context, k Case, replays int) error {
	l, err := b.layout(k)
	if err != nil {
		return err
	}
	if k.InPlace {
		return fmt.Errorf("graph checks refill the input: use out-of-place cases")
	}
	s := b.Dev.DefaultStream()
	if err := b.resetOut(); err != nil {
		return err
	}
	g, err := b.Dev.Capture(s, func() error {
		for _, seed := range []uint32{k.Seed, k.Seed ^ 0x5bd1e995} {
			if err := b.fill(k, l, s, seed); err != nil {
				return err
			}
			if _, err := b.issue(ctx, k, l, s); err != nil {
				return err
			}
			if err := b.check(k, l, s, seed); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rank %d: %s: capture: %w", b.C.Rank(), k, err)
	}
	defer g.Close()
	for i := 0; i < replays; i++ {
		if err := g.Launch(s); err != nil {
			return fmt.Errorf("rank %d: %s: replay %d: %w", b.C.Rank(), k, i, err)
		}
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := b.C.Check(); err != nil {
		return err
	}
	bad, first, err := b.readOut()
	if err != nil {
		return err
	}
	if bad != 0 {
		return fmt.Errorf("rank %d: %s: %d graph replays of 2 calls: %d wrong elements (first index %d)", b.C.Rank(), k, replays, bad, first)
	}
	return b.C.Barrier(ctx)
}
