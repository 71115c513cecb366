package channeltest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// SharedSeed returns rank 0's random seed on every rank.
func SharedSeed(ctx context.Context, bs bootstrap.Bootstrap) (uint64, error) {
	all, err := bs.AllGather(ctx, binary.LittleEndian.AppendUint64(nil, rand.Uint64()))
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(all[0]), nil
}

// transfer is one transfer of a check: the same on every rank.
type transfer struct {
	size           int
	shift          int
	srcOff, dstOff int
	seed           uint32
}

// plan derives transfer i of a check from the shared seed: sizes as given,
// ring shifts cycling through 1..n-1 (so every distance between ranks is
// exercised), and offsets that make the two sides agree or disagree modulo
// 16, 8, 4 and 2. align forces offsets to multiples of align.
func (r *Rank) plan(seed uint64, sizes []int, align int) []transfer {
	rng := rand.New(rand.NewPCG(seed, 0x6368616e6e656c73))
	out := make([]transfer, len(sizes))
	for i, size := range sizes {
		t := transfer{size: size, shift: 1 + i%max(r.n-1, 1), seed: rng.Uint32()}
		t.srcOff = rng.IntN(maxOffset/2) / align * align
		t.dstOff = rng.IntN(maxOffset/2) / align * align
		if i%4 == 0 { // keep some transfers fully aligned: the fast path
			t.srcOff, t.dstOff = 0, 0
		}
		out[i] = t
	}
	return out
}

// putGrid is the number of blocks a put of size bytes uses; the receiver
// waits for one signal per block.
func putGrid(size int) int { return min(max(size>>18, 1), 64) }

// rankSeed is the pattern seed of rank's source data in transfer t.
func rankSeed(t transfer, rank int) uint32 { return t.seed ^ uint32(rank)*0x27d4eb2f }

// exactLimit: transfers up to this size are also compared on the host.
const exactLimit = 1 << 20

// CheckPutGet puts and gets each size over a ring (shift varies per size):
// every rank fills its source region with its own pattern, puts it into
// the next rank's destination region with every block signalling, the
// receiver waits for the signals and compares what arrived with the
// sender's source in place (through the peer mapping) and checks the guard
// bytes around it; then every rank gets the same bytes from the previous
// rank and checks them the same way.
func (r *Rank) CheckPutGet(ctx context.Context, seed uint64, sizes []int) error {
	if r.n < 2 {
		return nil
	}
	l := r.Layout
	for _, t := range r.plan(seed, sizes, 1) {
		if t.size+maxOffset > l.Region {
			return r.errorf("put/get of %d bytes does not fit the %d-byte region", t.size, l.Region)
		}
		to, from := r.ring(t.shift)
		what := fmt.Sprintf("%d bytes (src+%d -> dst+%d) rank %d -> rank %d", t.size, t.srcOff, t.dstOff, from, r.me)
		for _, get := range []bool{false, true} {
			op := "put"
			if get {
				op = "get"
			}
			if err := r.prepare(t); err != nil {
				return err
			}
			if err := r.sync(); err != nil {
				return err
			}
			if err := r.barrier(ctx); err != nil {
				return err
			}
			grid := putGrid(t.size)
			if !get {
				args := device.NewArgs(6).Ptr(r.Handles.Ptr()).U32(uint32(to)).U64(uint64(l.dst() + t.dstOff)).
					U64(uint64(t.srcOff)).U64(uint64(t.size)).U32(1)
				if err := r.launch(devapi.KernelChanPut, grid, 512, args); err != nil {
					return err
				}
				if err := r.waitSignals(from, grid, 1); err != nil {
					return r.errorf("%s %s: %w", op, what, err)
				}
			} else {
				args := device.NewArgs(5).Ptr(r.Handles.Ptr()).U32(uint32(from)).U64(uint64(t.srcOff)).
					U64(uint64(l.dst() + t.dstOff)).U64(uint64(t.size))
				if err := r.launch(devapi.KernelChanGet, grid, 512, args); err != nil {
					return err
				}
				if err := r.sync(); err != nil {
					return err
				}
			}
			if err := r.checkArrived(from, t, what, op); err != nil {
				return err
			}
			// Nobody refills its source while a peer still reads it.
			if err := r.barrier(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitSignals consumes count signals from rank from, checking that exactly
// that many arrived.
func (r *Rank) waitSignals(from, count int, stage uint32) error {
	if err := r.clearOut(4); err != nil {
		return err
	}
	args := device.NewArgs(7).Ptr(r.Handles.Ptr()).U32(128).U32(uint32(from)).U32(uint32(count)).U32(0).U32(stage).Ptr(r.out.Ptr)
	if err := r.launch(devapi.KernelChanSemWait, 1, 32, args); err != nil {
		return err
	}
	if err := r.sync(); err != nil {
		return err
	}
	out, err := r.readOut(4)
	if err != nil {
		return err
	}
	if out[0] != uint64(count) {
		return fmt.Errorf("consumed %d of %d signals", out[0], count)
	}
	return nil
}

// prepare fills the source bytes of t with this rank's pattern and poisons
// the destination bytes of t and a guard on either side.
func (r *Rank) prepare(t transfer) error {
	if err := r.fill(rankSeed(t, r.me), t.srcOff+t.size); err != nil {
		return err
	}
	return r.poison(r.Layout.Region, r.Layout.Guard+t.dstOff+t.size+r.Layout.Guard)
}

// checkArrived compares the destination region with rank from's source.
func (r *Rank) checkArrived(from int, t transfer, what, op string) error {
	l := r.Layout
	got := r.Buf.Ptr + uintptr(l.dst()+t.dstOff)
	want := r.ByRank[from].Config().Remote.Ptr() + uintptr(t.srcOff)
	bad, trampled, err := r.compare(got, want, t.size, l.Guard+t.dstOff, l.Guard)
	if err != nil {
		return r.errorf("%s %s: compare: %w", op, what, err)
	}
	if bad != 0 || trampled != 0 {
		return r.errorf("%s %s: %d bytes differ from the source, %d guard bytes around the destination were overwritten", op, what, bad, trampled)
	}
	if t.size <= exactLimit {
		if err := r.exact(got, want, t.size); err != nil {
			return r.errorf("%s %s: host comparison: %w", op, what, err)
		}
	}
	return nil
}

// CheckPackets sends each size as LL packets (proto 16 or 8) over a ring:
// each rank packs its source region into the next rank's packet buffer and
// unpacks what the previous rank sent into its destination region, in one
// launch that advances the packet buffer's flag; the result is compared
// with the sender's source. Odd sizes and offsets exercise the partial last
// packet and the unaligned payload paths.
func (r *Rank) CheckPackets(ctx context.Context, seed uint64, sizes []int, proto int) error {
	if r.n < 2 {
		return nil
	}
	if proto != 16 && proto != 8 {
		return r.errorf("LL protocol %d: want 16 or 8", proto)
	}
	l := r.Layout
	for _, t := range r.plan(seed^uint64(proto), sizes, 1) {
		pktBytes := packetBytes(proto, t.size)
		if t.size+maxOffset > l.Region || pktBytes > l.HalfPackets {
			return r.errorf("LL%d of %d bytes does not fit the layout", proto, t.size)
		}
		to, from := r.ring(t.shift)
		what := fmt.Sprintf("LL%d %d bytes (src+%d -> dst+%d) rank %d -> rank %d", proto, t.size, t.srcOff, t.dstOff, from, r.me)
		before, err := r.Packets.Flag()
		if err != nil {
			return err
		}
		if err := r.prepare(t); err != nil {
			return err
		}
		if err := r.clearOut(1); err != nil {
			return err
		}
		if err := r.sync(); err != nil {
			return err
		}
		if err := r.barrier(ctx); err != nil {
			return err
		}
		grid := r.spinGrid(min(max(pktBytes>>16, 1), 64))
		args := device.NewArgs(10).Ptr(r.Handles.Ptr()).U32(uint32(to)).U32(uint32(from)).U32(uint32(proto)).
			U64(uint64(t.srcOff)).U64(uint64(l.dst() + t.dstOff)).U64(uint64(t.size)).U64(uint64(l.HalfPackets)).
			U32(2).Ptr(r.out.Ptr)
		if err := r.launch(devapi.KernelChanLLExchange, grid, 512, args); err != nil {
			return err
		}
		if err := r.sync(); err != nil {
			return r.errorf("%s: %w", what, err)
		}
		out, err := r.readOut(1)
		if err != nil {
			return err
		}
		if out[0] != 0 {
			return r.errorf("%s: %d threads gave up waiting", what, out[0])
		}
		after, err := r.Packets.Flag()
		if err != nil {
			return err
		}
		if want := flagNext(before); after != want {
			return r.errorf("%s: packet flag went from %d to %d, want %d", what, before, after, want)
		}
		if err := r.checkArrived(from, t, what, "unpack"); err != nil {
			return err
		}
		if err := r.barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

func packetBytes(proto, size int) int {
	if proto == 16 {
		return (size + 7) / 8 * 16
	}
	return (size + 3) / 4 * 8
}

// flagNext is goep_ll_flag_next.
func flagNext(f uint32) uint32 {
	if f++; f == 0 {
		return 2
	}
	return f
}
