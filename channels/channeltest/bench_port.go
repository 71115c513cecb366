package channeltest

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// BenchPortPingPong measures signal/wait round trips through the proxies
// between rank 0 and each other rank in turn: one thread on each side does
// iters round trips in one launch (signal = FIFO push, proxy, stream write
// into the peer's token), timed inside the kernel.
func (r *Rank) BenchPortPingPong(ctx context.Context, iters int) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	if err := r.EnsurePort(ctx); err != nil {
		return nil, err
	}
	const name = "port signal/wait round trip"
	return r.rank0Pairs(ctx, func(p, other int) (Result, error) {
		args := device.NewArgs(6).Ptr(r.PortHandles.Ptr()).U32(uint32(other)).U64(uint64(iters)).U32(b2u(r.me == 0)).U32(22).Ptr(r.out.Ptr)
		out, err := r.launchOut(devapi.KernelPortPingPong, 1, 32, 2, args)
		if err != nil {
			return Result{}, err
		}
		if out[0] != uint64(iters) {
			return Result{}, r.errorf("%s with rank %d: %d of %d rounds", name, other, out[0], iters)
		}
		return Result{Primitive: name, Ranks: r.n, Peers: 1, Iters: iters,
			LatencyUS: float64(out[1]) / float64(iters) / 1e3, Note: fmt.Sprintf("rank 0 <-> rank %d, in-kernel, through both proxies", p)}, nil
	})
}

// BenchPortPut measures rank 0 putting each size to rank 1 through its
// port channel (one thread pushes iters puts and a flush; timed inside the
// kernel from the first push to the flush's completion) and, beside it, the
// same transfers as plain peer-to-peer copy-engine copies issued by the
// host on a stream of their own (timed with events): the ceiling a put can
// reach, since the proxy issues exactly such copies.
func (r *Rank) BenchPortPut(ctx context.Context, sizes []int, iters int) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	if err := r.EnsurePort(ctx); err != nil {
		return nil, err
	}
	l := r.Layout
	var rows []Result
	for _, size := range sizes {
		if size > l.Region {
			return nil, r.errorf("port put of %d bytes does not fit the %d-byte region", size, l.Region)
		}
		if r.me == 0 {
			port, err := r.timePortPut(size, iters)
			if err != nil {
				return nil, err
			}
			plain, err := r.timePlainCopy(size, iters)
			if err != nil {
				return nil, err
			}
			pg, cg := gbps(int64(size)*int64(iters), port), gbps(int64(size)*int64(iters), plain)
			ratio := 0.0
			if cg > 0 {
				ratio = 100 * pg / cg
			}
			rows = append(rows,
				Result{Primitive: "port put", Ranks: r.n, Peers: 1, Bytes: int64(size), Iters: iters,
					LatencyUS: us(port) / float64(iters), GBps: pg,
					Note: fmt.Sprintf("rank 0 -> rank 1, proxy + copy engine, %.0f%% of the plain copy", ratio)},
				Result{Primitive: "plain CE copy", Ranks: r.n, Peers: 1, Bytes: int64(size), Iters: iters,
					LatencyUS: us(plain) / float64(iters), GBps: cg, Note: "rank 0 -> rank 1, peer-to-peer copy-engine copies issued by the host"})
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// timePortPut runs goep_port_put_bench once to warm up, then once timed.
func (r *Rank) timePortPut(size, iters int) (time.Duration, error) {
	var elapsed time.Duration
	for _, n := range []int{1, iters} {
		if err := r.clearOut(2); err != nil {
			return 0, err
		}
		args := device.NewArgs(8).Ptr(r.PortHandles.Ptr()).U32(1).U64(uint64(r.Layout.dst())).U64(0).U64(uint64(size)).
			U32(uint32(n)).U32(23).Ptr(r.out.Ptr)
		if err := r.launch(devapi.KernelPortPutBench, 1, 32, args); err != nil {
			return 0, err
		}
		if err := r.sync(); err != nil {
			return 0, err
		}
		out, err := r.readOut(2)
		if err != nil {
			return 0, err
		}
		if out[0] != 1 {
			return 0, r.errorf("port put of %d bytes: the flush did not complete", size)
		}
		elapsed = time.Duration(out[1])
	}
	return elapsed, nil
}

// timePlainCopy times iters copy-engine copies of size bytes from this
// rank's source region to rank 1's destination region.
func (r *Rank) timePlainCopy(size, iters int) (time.Duration, error) {
	s, err := r.Dev.NewStream()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	dst := r.ByRank[1].Config().Remote.Ptr() + uintptr(r.Layout.dst())
	if err := r.Dev.CopyAsync(dst, r.Buf.Ptr, size, s); err != nil { // warm-up
		return 0, err
	}
	start, err := r.Dev.NewEvent()
	if err != nil {
		return 0, err
	}
	defer start.Close()
	end, err := r.Dev.NewEvent()
	if err != nil {
		return 0, err
	}
	defer end.Close()
	if err := start.Record(s); err != nil {
		return 0, err
	}
	for i := 0; i < iters; i++ {
		if err := r.Dev.CopyAsync(dst, r.Buf.Ptr, size, s); err != nil {
			return 0, err
		}
	}
	if err := end.Record(s); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	return r.Dev.Elapsed(start, end)
}

// BenchPortAtomic measures the rate of atomic adds rank 0 pushes to rank 1
// through its port channel (one block of 256 threads, adds of 1, then a
// flush; timed inside the kernel), onto one counter (consecutive adds to
// one word, which the proxy folds together) and onto 64 (one operation
// each). Rank 1 then checks its counters hold exactly the adds.
func (r *Rank) BenchPortAtomic(ctx context.Context, adds int) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	if err := r.EnsurePort(ctx); err != nil {
		return nil, err
	}
	ctrOff := r.Layout.dst()
	var rows []Result
	for _, nc := range []int{1, 64} {
		if r.me == 1 {
			if err := r.Dev.CopyIn(r.Buf.Ptr+uintptr(ctrOff), make([]byte, 8*nc)); err != nil {
				return nil, err
			}
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
		if r.me == 0 {
			args := device.NewArgs(7).Ptr(r.PortHandles.Ptr()).U32(1).U64(uint64(adds)).U64(uint64(ctrOff)).U32(uint32(nc)).U32(24).Ptr(r.out.Ptr)
			out, err := r.launchOut(devapi.KernelPortAtomicRate, 1, 256, 2, args)
			if err != nil {
				return nil, err
			}
			if out[0] != 0 {
				return nil, r.errorf("port atomicAdd rate: a push or the flush gave up")
			}
			d := time.Duration(out[1])
			rate := 0.0
			if d > 0 {
				rate = float64(adds) / d.Seconds() / 1e6
			}
			rows = append(rows, Result{Primitive: "port atomicAdd", Ranks: r.n, Peers: 1, Bytes: 8, Threads: 256, Iters: adds,
				LatencyUS: us(d) / float64(adds), Note: fmt.Sprintf("rank 0 -> rank 1, %d counter(s), %.2f M adds/s", nc, rate)})
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
		if r.me == 1 {
			b := make([]byte, 8*nc)
			if err := r.Dev.CopyOut(b, r.Buf.Ptr+uintptr(ctrOff)); err != nil {
				return nil, err
			}
			for k := 0; k < nc; k++ {
				want := uint64(adds / nc)
				if k < adds%nc {
					want++
				}
				if got := binary.LittleEndian.Uint64(b[8*k:]); got != want {
					return nil, r.errorf("port atomicAdd rate: counter %d of %d is %d, want %d", k, nc, got, want)
				}
			}
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
	}
	return rows, nil
}
