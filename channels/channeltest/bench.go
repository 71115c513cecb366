package channeltest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// Result is one measurement, reported by rank 0.
type Result struct {
	Primitive string  `json:"primitive"`
	Ranks     int     `json:"ranks"`
	Peers     int     `json:"peers"`         // peers each sender writes to at once
	Bytes     int64   `json:"bytes"`         // payload per peer per operation
	SMs       int     `json:"sms,omitempty"` // blocks launched (one per SM)
	Threads   int     `json:"threads,omitempty"`
	Iters     int     `json:"iters"`
	LatencyUS float64 `json:"latency_us"`     // per operation (round trip for ping-pong)
	GBps      float64 `json:"gbps,omitempty"` // egress per sending GPU (mean over senders)
	MinGBps   float64 `json:"min_gbps,omitempty"`
	Note      string  `json:"note,omitempty"`
}

// timeLaunches times iters back-to-back launches of kernel on the default
// stream with device events, after one untimed warm-up launch.
func (r *Rank) timeLaunches(kernel string, grid, block, iters int, args *device.Args) (time.Duration, error) {
	s := r.Dev.DefaultStream()
	if err := r.launch(kernel, grid, block, args); err != nil {
		return 0, err
	}
	if err := r.sync(); err != nil {
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
		if err := r.launch(kernel, grid, block, args); err != nil {
			return 0, err
		}
	}
	if err := end.Record(s); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	if err := r.Comm.Check(); err != nil {
		return 0, err
	}
	return r.Dev.Elapsed(start, end)
}

func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchPingPong measures signal/wait round trips between rank 0 and each
// other rank in turn: a single-thread kernel on each side does iters round
// trips in one launch (no data), timed with the GPU global timer inside the
// kernel, so launch overhead is excluded.
func (r *Rank) BenchPingPong(ctx context.Context, iters int, relaxed bool) ([]Result, error) {
	name := "signal/wait round trip"
	if relaxed {
		name = "relaxed signal/wait round trip"
	}
	return r.rank0Pairs(ctx, func(p, other int) (Result, error) {
		out, err := r.pingpong(other, uint64(iters), false, relaxed, 20)
		if err != nil {
			return Result{}, err
		}
		if out[0] != uint64(iters) {
			return Result{}, r.errorf("%s with rank %d: %d of %d rounds", name, other, out[0], iters)
		}
		return Result{Primitive: name, Ranks: r.n, Peers: 1, Iters: iters,
			LatencyUS: float64(out[2]) / float64(iters) / 1e3, Note: fmt.Sprintf("rank 0 <-> rank %d, in-kernel", p)}, nil
	})
}

// BenchPutGet measures rank 0 putting to and getting from rank 1, each
// size with sms blocks of threads threads, iters launches timed with
// events (the time per operation includes the launch).
func (r *Rank) BenchPutGet(ctx context.Context, sizes []int, sms, threads, iters int) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	var rows []Result
	l := r.Layout
	for _, size := range sizes {
		if size > l.Region {
			return nil, r.errorf("bench of %d bytes does not fit the %d-byte region", size, l.Region)
		}
		for _, op := range []string{"put", "get"} {
			if r.me == 0 {
				var args *device.Args
				kernel := devapi.KernelChanGet
				if op == "put" {
					kernel = devapi.KernelChanPut
					args = device.NewArgs(6).Ptr(r.Handles.Ptr()).U32(1).U64(uint64(l.dst())).U64(0).U64(uint64(size)).U32(0)
				} else {
					args = device.NewArgs(5).Ptr(r.Handles.Ptr()).U32(1).U64(0).U64(uint64(l.dst())).U64(uint64(size))
				}
				d, err := r.timeLaunches(kernel, sms, threads, iters, args)
				if err != nil {
					return nil, err
				}
				rows = append(rows, Result{Primitive: op, Ranks: r.n, Peers: 1, Bytes: int64(size), SMs: sms, Threads: threads,
					Iters: iters, LatencyUS: us(d) / float64(iters), GBps: gbps(int64(size)*int64(iters), d),
					Note: "rank 0 -> rank 1, per launch"})
			}
			if err := r.barrier(ctx); err != nil {
				return nil, err
			}
		}
	}
	return rows, nil
}

// BenchPutAll measures putting bytesPerPeer to every other rank at once
// for each SM count: only rank 0 sending (one-to-all), or every rank
// sending (all-to-all; GBps is the mean over ranks, MinGBps the slowest).
func (r *Rank) BenchPutAll(ctx context.Context, bytesPerPeer int, sms []int, threads, iters int, allToAll bool) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	if r.n*bytesPerPeer > r.Layout.Region {
		return nil, r.errorf("put to all of %d bytes per peer needs %d bytes of region, have %d", bytesPerPeer, r.n*bytesPerPeer, r.Layout.Region)
	}
	name := "put to all peers (one sender)"
	if allToAll {
		name = "put to all peers (all-to-all)"
	}
	var rows []Result
	for _, sm := range sms {
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
		mine := 0.0
		if allToAll || r.me == 0 {
			args := device.NewArgs(5).Ptr(r.Handles.Ptr()).U32(uint32(r.n)).U64(uint64(bytesPerPeer)).
				U64(uint64(bytesPerPeer)).U64(uint64(r.Layout.dst() + r.me*bytesPerPeer))
			d, err := r.timeLaunches(devapi.KernelChanPutAll, sm, threads, iters, args)
			if err != nil {
				return nil, err
			}
			mine = gbps(int64(r.n-1)*int64(bytesPerPeer)*int64(iters), d)
		}
		all, err := r.Comm.Bootstrap().AllGather(ctx, binary.LittleEndian.AppendUint64(nil, math.Float64bits(mine)))
		if err != nil {
			return nil, err
		}
		if r.me != 0 {
			continue
		}
		row := Result{Primitive: name, Ranks: r.n, Peers: r.n - 1, Bytes: int64(bytesPerPeer), SMs: sm, Threads: threads, Iters: iters}
		senders := all[:1]
		if allToAll {
			senders = all
		}
		row.MinGBps = math.Inf(1)
		for _, b := range senders {
			g := math.Float64frombits(binary.LittleEndian.Uint64(b))
			row.GBps += g / float64(len(senders))
			row.MinGBps = min(row.MinGBps, g)
		}
		if row.GBps > 0 {
			row.LatencyUS = float64(int64(r.n-1)*int64(bytesPerPeer)) / (row.GBps * 1e3)
		}
		if !allToAll {
			row.MinGBps = 0
		}
		rows = append(rows, row)
	}
	return rows, r.barrier(ctx)
}

// BenchLL measures LL packet exchange between partners (ranks 0-1, 2-3,
// ...; each sends words payload words to the other and receives as many
// each round): iters rounds in one launch, timed inside the kernel; the
// data is checked in the kernel too. Rank 0 reports.
func (r *Rank) BenchLL(ctx context.Context, proto int, words []int, iters int, seed uint32) ([]Result, error) {
	if r.n < 2 {
		return nil, nil
	}
	pkt, payload := 16, 8
	if proto == 8 {
		pkt, payload = 8, 4
	}
	peer := r.partner()
	var rows []Result
	for _, w := range words {
		if w*pkt > r.Layout.HalfPackets {
			return nil, r.errorf("LL%d bench of %d words does not fit half of the packet buffer", proto, w)
		}
		if err := r.clearOut(4); err != nil {
			return nil, err
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
		if peer < 0 {
			continue
		}
		grid := min(max(w/1024, 1), 32)
		args := device.NewArgs(12).Ptr(r.Handles.Ptr()).U32(uint32(peer)).U32(uint32(peer)).U32(uint32(proto)).U32(uint32(r.me)).
			U64(uint64(w)).U64(0).U64(uint64(w * pkt)).U32(seed).U32(uint32(iters)).U32(21).Ptr(r.out.Ptr)
		if err := r.launch(devapi.KernelChanLLPattern, grid, 256, args); err != nil {
			return nil, err
		}
		if err := r.sync(); err != nil {
			return nil, err
		}
		out, err := r.readOut(4)
		if err != nil {
			return nil, err
		}
		if out[0] != 0 || out[1] != 0 || out[2] != uint64(iters) {
			return nil, r.errorf("LL%d bench of %d words: %d wrong words, %d threads gave up, %d of %d rounds", proto, w, out[0], out[1], out[2], iters)
		}
		if r.me == 0 {
			lat := time.Duration(out[3]) / time.Duration(iters)
			rows = append(rows, Result{Primitive: fmt.Sprintf("LL%d exchange round", proto), Ranks: r.n, Peers: 1,
				Bytes: int64(w * payload), SMs: grid, Threads: 256, Iters: iters, LatencyUS: us(lat),
				GBps: gbps(int64(w*payload), lat), Note: "pairs exchange both ways, in-kernel"})
		}
	}
	return rows, r.barrier(ctx)
}
