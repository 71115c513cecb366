package collectives_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// Hand-computed reductions. The twins and collectives/ref share the bit
// conversions of single values, so here the expected bits were worked out
// by hand from the rules in ref's package comment (rank-order float32
// accumulation, one rounding, strict min/max): no Go code computes them,
// and a mistake common to twin and reference cannot pass. Each case is one
// element on 3 ranks; a buffer repeats a group's cases so every algorithm
// meets them in vectors, tails, blocks and rounds.
type handCase struct {
	in   [3]uint32 // rank r's element
	want uint32
	why  string
}

var handGroups = []struct {
	dt    collectives.DataType
	op    collectives.Op
	cases []handCase
}{
	{collectives.FP32, collectives.Sum, []handCase{
		{[3]uint32{0x3f800000, 0x33800000, 0x33800000}, 0x3f800000, "1 + 2^-24 ties to 1, twice"},
		{[3]uint32{0x33800000, 0x33800000, 0x3f800000}, 0x3f800001, "2^-24 + 2^-24 = 2^-23 first, then 1 + 2^-23"},
		{[3]uint32{0x4b800000, 0x3f800000, 0xcb800000}, 0x00000000, "2^24 + 1 ties to 2^24, minus 2^24"},
	}},
	{collectives.BF16, collectives.Sum, []handCase{
		{[3]uint32{0x3f80, 0x3b80, 0x3b80}, 0x3f81, "1 + 2^-8 + 2^-8 in float32, rounded once"},
		{[3]uint32{0x4b80, 0x3f80, 0xcb80}, 0x0000, "2^24 + 1 is not a float32"},
		{[3]uint32{0x7f7f, 0x7f7f, 0x0000}, 0x7f80, "twice the largest bf16 overflows to +inf"},
	}},
	{collectives.FP16, collectives.Sum, []handCase{
		{[3]uint32{0x7b53, 0x7b53, 0xfb53}, 0x7b53, "60000 + 60000 - 60000: no fp16 overflow in float32"},
		{[3]uint32{0x7bff, 0x7bff, 0x0000}, 0x7c00, "65504 * 2 rounds to +inf"},
		{[3]uint32{0x3c00, 0x0001, 0x8001}, 0x3c00, "1 + smallest subnormal - it"},
	}},
	{collectives.BF16, collectives.Min, []handCase{
		{[3]uint32{0x0000, 0x8000, 0x8000}, 0x0000, "-0 < +0 is false: rank 0's +0 stays"},
		{[3]uint32{0x4040, 0xbf80, 0xc000}, 0xc000, "min(3, -1, -2) = -2"},
	}},
	{collectives.FP16, collectives.Max, []handCase{
		{[3]uint32{0x8000, 0x0000, 0x0000}, 0x8000, "+0 > -0 is false: rank 0's -0 stays"},
		{[3]uint32{0x4200, 0x4500, 0x4400}, 0x4500, "max(3, 5, 4) = 5"},
	}},
	{collectives.FP32, collectives.Max, []handCase{
		{[3]uint32{0xc0000000, 0xbf800000, 0xc0400000}, 0xbf800000, "max(-2, -1, -3) = -1"},
	}},
}

// The reference meets the same hand-computed bits.
func TestHandComputedReductionsReference(t *testing.T) {
	for _, g := range handGroups {
		for _, hc := range g.cases {
			if got := ref.Reduce(g.dt, g.op, hc.in[:]); got != hc.want {
				t.Errorf("ref.Reduce(%s, %s, %#x) = %#x, want %#x (%s)", g.dt, g.op, hc.in, got, hc.want, hc.why)
			}
		}
	}
}

// The twins (and the kernels, with 3 GPUs or more) meet them in every
// native algorithm.
func TestHandComputedReductions(t *testing.T) {
	const W = 3
	worlds := []world{{device.Host, W}}
	if gpus() >= W {
		worlds = append(worlds, world{device.CUDA, W})
	}
	for _, w := range worlds {
		t.Run(w.String(), func(t *testing.T) { handReductions(t, w) })
	}
}

func handReductions(t *testing.T, w world) {
	const W = 3
	run(t, w, configFor(w), func(ctx context.Context, c *collectives.Communicator) error {
		dev, me := c.Device(), c.Rank()
		const maxCount = 1001
		send, err := dev.Alloc(W * maxCount * 4)
		if err != nil {
			return err
		}
		defer dev.Free(send)
		recv, err := dev.Alloc(W * maxCount * 4)
		if err != nil {
			return err
		}
		defer dev.Free(recv)
		for _, b := range []device.Buffer{send, recv} {
			if _, err := c.Register(ctx, b); err != nil {
				return err
			}
		}
		for _, g := range handGroups {
			e := g.dt.Size()
			put := func(buf []byte, i int, v uint32) {
				if e == 2 {
					binary.LittleEndian.PutUint16(buf[2*i:], uint16(v))
				} else {
					binary.LittleEndian.PutUint32(buf[4*i:], v)
				}
			}
			get := func(buf []byte, i int) uint32 {
				if e == 2 {
					return uint32(binary.LittleEndian.Uint16(buf[2*i:]))
				}
				return binary.LittleEndian.Uint32(buf[4*i:])
			}
			for _, kind := range []collectives.Kind{collectives.AllReduce, collectives.ReduceScatter} {
				for _, algo := range collectives.Algorithms(kind) {
					if algo == collectives.AlgoNCCL {
						continue
					}
					for _, count := range []int{len(g.cases), 7, maxCount} {
						// Element i of the input (all parts, for reduce-scatter)
						// holds case i mod len; rank me's output element k is
						// element k (allreduce) or me*count+k (reduce-scatter).
						parts := 1
						if kind == collectives.ReduceScatter {
							parts = W
						}
						in := make([]byte, parts*count*e)
						for i := range parts * count {
							put(in, i, g.cases[i%len(g.cases)].in[me])
						}
						if err := dev.CopyIn(send.Ptr, in); err != nil {
							return err
						}
						var w *collectives.Work
						opt := collectives.WithAlgorithm(algo)
						if kind == collectives.AllReduce {
							w, err = c.AllReduce(ctx, nil, send.Ptr, recv.Ptr, count, g.dt, g.op, opt)
						} else {
							w, err = c.ReduceScatter(ctx, nil, send.Ptr, recv.Ptr, count, g.dt, g.op, opt)
						}
						if err != nil {
							return err
						}
						if err := w.Sync(ctx); err != nil {
							return err
						}
						out := make([]byte, count*e)
						if err := dev.CopyOut(out, recv.Ptr); err != nil {
							return err
						}
						first := 0
						if kind == collectives.ReduceScatter {
							first = me * count
						}
						for k := range count {
							hc := g.cases[(first+k)%len(g.cases)]
							if got := get(out, k); got != hc.want {
								return fmt.Errorf("%s %s %s/%s count %d: element %d = %#x, want %#x (%s)",
									kind, g.dt, g.op, algo, count, k, got, hc.want, hc.why)
							}
						}
					}
				}
			}
		}
		return nil
	})
}
