package intranodetest

import (
	"context"
	"errors"
	"fmt"
	"github.com/goep-dev/goep/intranode"
	"math/rand/v2"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// BenchInput is one rank's share of a benchmark shape.
type BenchInput struct {
	// TopK is this rank's routing, int64 [Tokens][TopK] (-1 = none);
	// Tokens = len(TopK)/TopK. routing.Generate draws DeepEP's.
	TopK []int64
	// FP8 dispatches FP8 rows with scales (the layout needs Config.FP8).
	FP8 bool
	// Weights sends top-k weights in dispatch and in combine.
	Weights bool
	// Seed draws x, scales, weights and the combine input.
	Seed uint64
	// Launch sizes dispatch and combine (zero: defaults).
	Launch intranode.LaunchConfig
}

// Bench is one rank's prepared dispatch/combine at a fixed shape: inputs
// uploaded, a handle built (one notify + dispatch already ran), outputs
// allocated. Timing code wraps the closures with events; every rank must
// call the same closure the same number of times, since each is a
// collective.
type Bench struct {
	Tokens, Received int
	Handle           intranode.Handle
	// Notify is the first kernel of a non-cached dispatch (the host then
	// waits for Rank.RecvCountNow() >= 0, as DeepEP does, before it sizes
	// outputs); NotifyDispatch is a whole non-cached dispatch without that
	// wait (outputs are views, sized for the worst case), through
	// intranode.Workspace.NotifyDispatch.
	Notify, NotifyDispatch func(s device.Stream) error
	// Dispatch is a cached dispatch (DeepEP's timed mode): the handle is
	// reused, no notify, no host synchronisation.
	Dispatch func(s device.Stream) error
	// Combine sends back a BF16 row per received token (random data, in the
	// combine input region, so read in place) with the handle and sums them
	// at their owners.
	Combine func(s device.Stream) error
	// DispatchWith and CombineWith are Dispatch and Combine with another
	// launch configuration (copy path, SMs, threads).
	DispatchWith, CombineWith func(cfg intranode.LaunchConfig) func(s device.Stream) error
	// DispatchBytes and CombineBytes count as DeepEP's intranode test does:
	// received rows x hidden x 2 bytes, self-traffic included; FP8
	// dispatch counts hidden + hidden/32 bytes a row (1 byte an element
	// plus a float32 scale per 128).
	DispatchBytes, CombineBytes int64

	r    *Rank
	bufs []device.Buffer
}

// NewBench prepares a benchmark on rank r; every rank of the group calls it
// at once (it runs one notify and dispatch). s is the stream the closures
// will be used on.
func NewBench(ctx context.Context, r *Rank, s device.Stream, in BenchInput) (_ *Bench, err error) {
	l := r.WS.Layout
	if len(in.TopK)%l.TopK != 0 {
		return nil, fmt.Errorf("intranode: bench: %d top-k entries for top-%d", len(in.TopK), l.TopK)
	}
	t := len(in.TopK) / l.TopK
	if t > l.MaxTokens {
		return nil, fmt.Errorf("intranode: bench: %d tokens, the layout holds %d", t, l.MaxTokens)
	}
	for i, e := range in.TopK {
		if e < -1 || e >= int64(l.Experts()) {
			return nil, fmt.Errorf("intranode: bench: token %d slot %d: expert id %d outside [-1, %d)", i/l.TopK, i%l.TopK, e, l.Experts())
		}
	}
	if in.FP8 && !l.FP8 {
		return nil, errors.New("intranode: bench: FP8 needs a layout with Config.FP8")
	}
	b := &Bench{Tokens: t, r: r, Handle: r.WS.DefaultHandle(t)}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	dev := r.Dev
	rng := rand.New(rand.NewPCG(in.Seed, uint64(r.WS.Rank)))
	up := func(data []byte) (uintptr, error) {
		buf, err := dev.Alloc(max(len(data), 256))
		if err != nil {
			return 0, err
		}
		b.bufs = append(b.bufs, buf)
		if len(data) > 0 {
			err = dev.CopyIn(buf.Ptr, data)
		}
		return buf.Ptr, err
	}
	da := intranode.DispatchArgs{FP8: in.FP8, Handle: b.Handle}
	if da.TopK, err = up(sliceBytes(in.TopK)); err != nil {
		return nil, err
	}
	if in.FP8 {
		q := make([]byte, t*l.Hidden)
		for i := range q {
			q[i] = byte(rng.Uint32()) & 0x7e // finite E4M3 values
		}
		if da.X, err = up(q); err != nil {
			return nil, err
		}
		if da.Scales, err = up(sliceBytes(randFloats(rng, t*l.ScalesPerRow()))); err != nil {
			return nil, err
		}
	} else if da.X, err = up(sliceBytes(randBF16s(rng, t*l.Hidden))); err != nil {
		return nil, err
	}
	if in.Weights {
		if da.Weights, err = up(sliceBytes(randFloats(rng, t*l.TopK))); err != nil {
			return nil, err
		}
	}

	b.Notify = func(s device.Stream) error { return r.Notify(s, da.TopK, b.Handle, 0) }
	b.DispatchWith = func(cfg intranode.LaunchConfig) func(s device.Stream) error {
		return func(s device.Stream) error { return r.WS.Dispatch(dev, s, da, cfg) }
	}
	b.Dispatch = b.DispatchWith(in.Launch)
	b.NotifyDispatch = func(s device.Stream) error { return r.NotifyDispatch(s, da.TopK, b.Handle, 0, da, in.Launch) }
	if err := b.NotifyDispatch(s); err != nil {
		return nil, err
	}
	if err := s.Synchronize(); err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	if b.Received, err = r.WaitRecvCount(ctx); err != nil {
		return nil, err
	}
	rowBytes := int64(2 * l.Hidden)
	b.CombineBytes = int64(b.Received) * rowBytes
	b.DispatchBytes = b.CombineBytes
	if in.FP8 {
		b.DispatchBytes = int64(b.Received) * int64(l.Hidden+l.Hidden/32)
	}

	// The combine input where an engine would write it: the combine input
	// region of the workspace.
	cin := r.WS.CombineInput()
	ca := intranode.CombineArgs{Handle: b.Handle, Y: cin.X}
	if b.Received > 0 {
		if err := dev.CopyIn(cin.X, sliceBytes(randBF16s(rng, b.Received*l.Hidden))); err != nil {
			return nil, err
		}
	}
	if ca.Out, err = up(make([]byte, 2*t*l.Hidden)); err != nil {
		return nil, err
	}
	if in.Weights {
		ca.Weights = cin.Weights
		if b.Received > 0 {
			if err := dev.CopyIn(cin.Weights, sliceBytes(randFloats(rng, b.Received*l.TopK))); err != nil {
				return nil, err
			}
		}
		if ca.OutWeights, err = up(make([]byte, 4*t*l.TopK)); err != nil {
			return nil, err
		}
	}
	b.CombineWith = func(cfg intranode.LaunchConfig) func(s device.Stream) error {
		return func(s device.Stream) error { return r.WS.Combine(dev, s, ca, cfg) }
	}
	b.Combine = b.CombineWith(in.Launch)
	return b, nil
}

// Close frees the benchmark's buffers (not the rank).
func (b *Bench) Close() error {
	var errs []error
	for _, buf := range b.bufs {
		errs = append(errs, b.r.Dev.Free(buf))
	}
	b.bufs = nil
	return errors.Join(errs...)
}

func sliceBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func randBF16s(rng *rand.Rand, n int) []uint16 {
	x := make([]uint16, n)
	for i := range x {
		x[i] = kernels.Float32ToBF16(float32(rng.NormFloat64()))
	}
	return x
}

func randFloats(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}
