package twins

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// Twins of kernels/coll_ll.cu, coll_bulk.cu and coll_util.cu. Each runs the
// kernel's protocol (packet slots and flags, scratch slots, per-block
// semaphores, mailboxes) on host-backend memory, the grid's blocks one after
// another: block b of every rank pairs only with block b of the others, and
// every rank walks its blocks in the same order, so goroutine ranks running
// these concurrently meet as the GPU's blocks do. Reductions follow
// collectives/ref exactly.

func init() {
	// goep_coll_ar_ll1(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelARLL1, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		dt, op := ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5))
		return c.arLL1(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ar_ll2(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelARLL2, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		dt, op := ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5))
		return c.arLL2(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ag_ll(ctx, in, out, u64 bytes)
	device.RegisterHostKernel(abi.KernelAGLL, func(l *device.HostLaunch) error {
		a := l.Args
		return collCtx(a.GetPtr(0)).agLL(a.GetPtr(1), a.GetPtr(2), a.GetU64(3))
	})
	// goep_coll_rs_ll(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelRSLL, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		dt, op := ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5))
		return c.rsLL(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ar_rsag(ctx, in, out, u64 count, u32 dtype, u32 op, u64 cell)
	device.RegisterHostKernel(abi.KernelARRSAG, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		return c.blocks(l, func(b, nb uint32) bool {
			return c.arRSAG(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5)), a.GetU64(6))
		})
	})
	// goep_coll_ag_scratch(ctx, in, out, u64 bytes, u64 cell)
	device.RegisterHostKernel(abi.KernelAGScratch, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		return c.blocks(l, func(b, nb uint32) bool {
			return c.agScratch(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), a.GetU64(4))
		})
	})
	// goep_coll_rs_scratch(ctx, in, out, u64 count, u32 dtype, u32 op, u64 cell)
	device.RegisterHostKernel(abi.KernelRSScratch, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		return c.blocks(l, func(b, nb uint32) bool {
			return c.rsScratch(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5)), a.GetU64(6))
		})
	})
	// goep_coll_ar_zc(ctx, in, out, u64 count, u32 dtype, u32 op, u32 in_reg, u64 in_off, u32 out_reg, u64 out_off)
	device.RegisterHostKernel(abi.KernelARZC, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		in, out, count := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		dt, op := ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5))
		return c.zeroCopy(l, desc{a.GetU32(6), a.GetU32(8), a.GetU64(7), a.GetU64(9)}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			c.arZC(b, nb, ins, outs, count, dt, op)
		})
	})
	// goep_coll_ag_zc(ctx, in, out, u64 bytes, u32 out_reg, u64 out_off)
	device.RegisterHostKernel(abi.KernelAGZC, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		in, out, n := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		return c.zeroCopy(l, desc{noReg, a.GetU32(4), 0, a.GetU64(5)}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			lo, hi := blockShare(n, b, nb, 16)
			at := uint64(c.Rank) * n
			for p := range c.World {
				if outs[p]+uintptr(at) != in {
					devapi.Copy(outs[p]+uintptr(at+lo), in+uintptr(lo), hi-lo)
				}
			}
		})
	})
	// goep_coll_rs_zc(ctx, in, out, u64 count, u32 dtype, u32 op, u32 in_reg, u64 in_off)
	device.RegisterHostKernel(abi.KernelRSZC, func(l *device.HostLaunch) error {
		a := l.Args
		c := collCtx(a.GetPtr(0))
		in, out, count := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		dt, op := ref.DataType(a.GetU32(4)), ref.Op(a.GetU32(5))
		return c.zeroCopy(l, desc{a.GetU32(6), noReg, a.GetU64(7), 0}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			lo, hi := blockShare(count, b, nb, uint64(16/dt.Size()))
			e := uint64(dt.Size())
			srcs := make([]uintptr, c.World)
			for q := range srcs {
				srcs[q] = ins[q] + uintptr((uint64(c.Rank)*count+lo)*e)
			}
			reduceRange(dt, op, srcs, []uintptr{out + uintptr(lo*e)}, hi-lo)
		})
	})
	// goep_coll_fill(buf, u64 count, u32 dtype, u32 fill, u32 seed, u32 rank, u64 first)
	device.RegisterHostKernel(abi.KernelFill, func(l *device.HostLaunch) error {
		a := l.Args
		dt := ref.DataType(a.GetU32(2))
		buf := devapi.Bytes(a.GetPtr(0), a.GetU64(1)*uint64(dt.Size()))
		ref.FillBuffer(buf, dt, ref.Fill(a.GetU32(3)), a.GetU32(4), int(a.GetU32(5)), a.GetU64(6))
		return nil
	})
	// goep_coll_check(buf, u64 count, u32 dtype, u32 op, u32 fill, u32 seed, u32 kind, u32 world, u32 rank, u64 n, u64* out)
	device.RegisterHostKernel(abi.KernelCheck, checkTwin)
}

const noReg = math.MaxUint32

// collCtxT is a decoded goep_coll_ctx with the twins' helpers.
type collCtxT struct{ abi.Ctx }

func collCtx(p uintptr) collCtxT {
	return collCtxT{abi.DecodeCtx(device.HostSlice[byte](p, abi.CtxSize))}
}

// peer is goep_coll_peer: (rank + j) mod world.
func (c collCtxT) peer(j uint32) uint32 { return (c.Rank + j) % c.World }

func (c collCtxT) waiter(from, stage uint32) devapi.Waiter {
	return devapi.Waiter{Watchdog: c.Watchdog, ID: c.LLID[from], Peer: from, Stage: stage}
}

func (c collCtxT) sem(b, p uint32) devapi.Semaphore {
	at := c.Sems + uintptr(b*abi.MaxRanks+p)*devapi.SemaphoreSize
	return devapi.DecodeSemaphore(device.HostSlice[byte](at, devapi.SemaphoreSize))
}

// barrier is goep_coll_barrier for block b: signal every peer, then wait
// for every peer.
func (c collCtxT) barrier(b, stage uint32) bool {
	for p := range c.World {
		if p != c.Rank {
			devapi.SemSignal(c.sem(b, p))
		}
	}
	for p := range c.World {
		if p != c.Rank && !devapi.SemWait(c.sem(b, p), devapi.OpSemWait, stage) {
			return false
		}
	}
	return true
}

// blocks runs fn for every block of the grid in order, stopping at the first
// block whose waits gave up (the kernel's blocks all leave then too).
func (c collCtxT) blocks(l *device.HostLaunch, fn func(b, nb uint32) bool) error {
	nb := uint32(blocks(l.Grid))
	if nb > c.SemBlocks {
		return fmt.Errorf("grid of %d blocks, the communicator has semaphores for %d", nb, c.SemBlocks)
	}
	for b := range nb {
		if !fn(b, nb) {
			return nil
		}
	}
	return nil
}

// pkt is the address of packet k of slot `slot` (slots of `words`
// packets) in the half at base of rank p's packet buffer.
func (c collCtxT) pkt(p uint32, base, slot, words, k uint64) uintptr {
	return c.Packets[p] + uintptr(base+(slot*words+k)*devapi.LL16Size)
}

func half(flag uint32, size uint64) uint64 { return uint64(flag&1) * size }

// word8 is goep_ll_gather for 8-byte words: word k of b, zero-padded.
func word8(b []byte, k uint64) uint64 {
	at := k * 8
	if at+8 <= uint64(len(b)) {
		return binary.LittleEndian.Uint64(b[at:])
	}
	var v uint64
	for i := uint64(0); at+i < uint64(len(b)); i++ {
		v |= uint64(b[at+i]) << (8 * i)
	}
	return v
}

// putWord8 is goep_ll_scatter for 8-byte words.
func putWord8(b []byte, k, v uint64) {
	at := k * 8
	if at+8 <= uint64(len(b)) {
		binary.LittleEndian.PutUint64(b[at:], v)
		return
	}
	for i := uint64(0); at+i < uint64(len(b)); i++ {
		b[at+i] = byte(v >> (8 * i))
	}
}

// reduceWords reduces 8-byte words (rank order) lane by lane.
func reduceWords(dt ref.DataType, op ref.Op, words []uint64) uint64 {
	sz := dt.Size()
	bits := 8 * sz
	mask := uint64(1)<<bits - 1
	vals := make([]uint32, len(words))
	var r uint64
	for lane := 0; lane < 8/sz; lane++ {
		for q, w := range words {
			vals[q] = uint32(w >> (bits * lane) & mask)
		}
		r |= uint64(ref.Reduce(dt, op, vals)) << (bits * lane)
	}
	return r
}

func (c collCtxT) getWord(p uintptr, flag, from, stage uint32) (uint64, bool) {
	return devapi.LL16Read(p, flag, c.waiter(from, stage))
}

func (c collCtxT) putWord(p uintptr, v uint64, flag uint32) {
	devapi.LL16Store(p, uint32(v), uint32(v>>32), flag)
}

func (c collCtxT) arLL1(in, out uintptr, bytes uint64, dt ref.DataType, op ref.Op) error {
	flag := devapi.FlagBegin(c.Flag)
	defer devapi.FlagEnd(c.Flag, flag)
	me, words, base := c.Rank, (bytes+7)/8, half(flag, c.PacketHalf)
	src, dst := devapi.Bytes(in, bytes), devapi.Bytes(out, bytes)
	own := make([]uint64, words)
	for k := range words {
		own[k] = word8(src, k)
		for j := uint32(1); j < c.World; j++ {
			c.putWord(c.pkt(c.peer(j), base, uint64(me), words, k), own[k], flag)
		}
	}
	xs := make([]uint64, c.World)
	for k := range words {
		for q := range c.World {
			if q == me {
				xs[q] = own[k]
				continue
			}
			v, ok := c.getWord(c.pkt(me, base, uint64(q), words, k), flag, q, abi.StageLL1)
			if !ok {
				return nil
			}
			xs[q] = v
		}
		putWord8(dst, k, reduceWords(dt, op, xs))
	}
	return nil
}

func (c collCtxT) arLL2(in, out uintptr, bytes uint64, dt ref.DataType, op ref.Op) error {
	f1 := devapi.FlagBegin(c.Flag)
	f2 := devapi.FlagNext(f1)
	defer devapi.FlagEnd(c.Flag, f2)
	me, W := c.Rank, c.World
	words := (bytes + 7) / 8
	P := (words + uint64(W) - 1) / uint64(W)
	b1, b2 := half(f1, c.PacketHalf), half(f2, c.PacketHalf)
	src, dst := devapi.Bytes(in, bytes), devapi.Bytes(out, bytes)
	piece := func(p uint32) (lo, n uint64) {
		lo = uint64(p) * P
		if lo >= words {
			return lo, 0
		}
		return lo, min(P, words-lo)
	}
	for j := uint32(1); j < W; j++ {
		p := c.peer(j)
		lo, n := piece(p)
		for kk := range n {
			c.putWord(c.pkt(p, b1, uint64(me), P, kk), word8(src, lo+kk), f1)
		}
	}
	lo, n := piece(me)
	xs := make([]uint64, W)
	for kk := range n {
		for q := range W {
			if q == me {
				xs[q] = word8(src, lo+kk)
				continue
			}
			v, ok := c.getWord(c.pkt(me, b1, uint64(q), P, kk), f1, q, abi.StageLL1)
			if !ok {
				return nil
			}
			xs[q] = v
		}
		r := reduceWords(dt, op, xs)
		putWord8(dst, lo+kk, r)
		for j := uint32(1); j < W; j++ {
			c.putWord(c.pkt(c.peer(j), b2, uint64(me), P, kk), r, f2)
		}
	}
	for j := uint32(1); j < W; j++ {
		p := c.peer(W - j)
		lo, n := piece(p)
		for kk := range n {
			v, ok := c.getWord(c.pkt(me, b2, uint64(p), P, kk), f2, p, abi.StageLL2)
			if !ok {
				return nil
			}
			putWord8(dst, lo+kk, v)
		}
	}
	return nil
}

func (c collCtxT) agLL(in, out uintptr, bytes uint64) error {
	flag := devapi.FlagBegin(c.Flag)
	defer devapi.FlagEnd(c.Flag, flag)
	me, words, base := c.Rank, (bytes+7)/8, half(flag, c.PacketHalf)
	src := devapi.Bytes(in, bytes)
	for k := range words {
		v := word8(src, k)
		for j := uint32(1); j < c.World; j++ {
			c.putWord(c.pkt(c.peer(j), base, uint64(me), words, k), v, flag)
		}
	}
	if own := out + uintptr(uint64(me)*bytes); own != in {
		devapi.Copy(own, in, bytes)
	}
	for j := uint32(1); j < c.World; j++ {
		p := c.peer(c.World - j)
		dst := devapi.Bytes(out+uintptr(uint64(p)*bytes), bytes)
		for k := range words {
			v, ok := c.getWord(c.pkt(me, base, uint64(p), words, k), flag, p, abi.StageLL1)
			if !ok {
				return nil
			}
			putWord8(dst, k, v)
		}
	}
	return nil
}

func (c collCtxT) rsLL(in, out uintptr, part uint64, dt ref.DataType, op ref.Op) error {
	flag := devapi.FlagBegin(c.Flag)
	defer devapi.FlagEnd(c.Flag, flag)
	me, words, base := c.Rank, (part+7)/8, half(flag, c.PacketHalf)
	for j := uint32(1); j < c.World; j++ {
		p := c.peer(j)
		src := devapi.Bytes(in+uintptr(uint64(p)*part), part)
		for k := range words {
			c.putWord(c.pkt(p, base, uint64(me), words, k), word8(src, k), flag)
		}
	}
	own, dst := devapi.Bytes(in+uintptr(uint64(me)*part), part), devapi.Bytes(out, part)
	xs := make([]uint64, c.World)
	for k := range words {
		for q := range c.World {
			if q == me {
				xs[q] = word8(own, k)
				continue
			}
			v, ok := c.getWord(c.pkt(me, base, uint64(q), words, k), flag, q, abi.StageLL1)
			if !ok {
				return nil
			}
			xs[q] = v
		}
		putWord8(dst, k, reduceWords(dt, op, xs))
	}
	return nil
}

// rounds mirrors goep_coll_plan / goep_coll_round.
type rounds struct{ abi.Rounds }

func plan(total, parts, cell, vec uint64) rounds {
	return rounds{abi.PlanRounds(total, parts, cell, vec)}
}

func (r rounds) round(parts, k uint64) (base, cs uint64) {
	if k < r.Full {
		return k * parts * r.Cell, r.Cell
	}
	return r.Full * parts * r.Cell, r.LastCell
}

func cellLen(start, cs, total uint64) uint64 {
	if start >= total {
		return 0
	}
	return min(cs, total-start)
}

func (c collCtxT) arRSAG(b, nblocks uint32, in, out uintptr, count uint64, dt ref.DataType, op ref.Op, cell uint64) bool {
	e := uint64(dt.Size())
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	parts := uint64(W) * nb
	r := plan(count, parts, cell, 16/e)
	slot := cell * e
	mine := c.Scratch[me]
	if !c.barrier(b, abi.StageEntry) {
		return false
	}
	cellAt := func(rb, cs uint64, p uint32) (uint64, uint64) {
		st := rb + (uint64(p)*nb+uint64(b))*cs
		return st, cellLen(st, cs, count)
	}
	for k := range r.Total {
		rb, cs := r.round(parts, k)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			st, n := cellAt(rb, cs, p)
			devapi.Copy(c.Scratch[p]+uintptr((uint64(me)*nb+uint64(b))*slot), in+uintptr(st*e), n*e)
		}
		if !c.barrier(b, abi.StageRSData) {
			return false
		}
		st, n := cellAt(rb, cs, me)
		srcs := make([]uintptr, W)
		for q := range W {
			srcs[q] = mine + uintptr((uint64(q)*nb+uint64(b))*slot)
		}
		srcs[me] = in + uintptr(st*e)
		dsts := []uintptr{out + uintptr(st*e)}
		for j := uint32(1); j < W; j++ {
			dsts = append(dsts, c.Scratch[c.peer(j)]+uintptr((uint64(W+me)*nb+uint64(b))*slot))
		}
		reduceRange(dt, op, srcs, dsts, n)
		if !c.barrier(b, abi.StageAGData) {
			return false
		}
		for j := uint32(1); j < W; j++ {
			p := c.peer(W - j)
			st, n := cellAt(rb, cs, p)
			devapi.Copy(out+uintptr(st*e), mine+uintptr((uint64(W+p)*nb+uint64(b))*slot), n*e)
		}
	}
	return true
}

func (c collCtxT) agScratch(b, nblocks uint32, in, out uintptr, bytes, cell uint64) bool {
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	r := plan(bytes, nb, cell, 16)
	mine, own := c.Scratch[me], out+uintptr(uint64(me)*bytes)
	if !c.barrier(b, abi.StageEntry) {
		return false
	}
	slotAt := func(h uint64, q uint32) uintptr {
		return uintptr(((h*uint64(W)+uint64(q))*nb + uint64(b)) * cell)
	}
	for k := range r.Total {
		h := k & 1
		rb, cs := r.round(nb, k)
		st := rb + uint64(b)*cs
		n := cellLen(st, cs, bytes)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			devapi.Copy(c.Scratch[p]+slotAt(h, me), in+uintptr(st), n)
		}
		if own != in {
			devapi.Copy(own+uintptr(st), in+uintptr(st), n)
		}
		if !c.barrier(b, abi.StageAGData) {
			return false
		}
		for j := uint32(1); j < W; j++ {
			p := c.peer(W - j)
			devapi.Copy(out+uintptr(uint64(p)*bytes+st), mine+slotAt(h, p), n)
		}
	}
	return true
}

func (c collCtxT) rsScratch(b, nblocks uint32, in, out uintptr, count uint64, dt ref.DataType, op ref.Op, cell uint64) bool {
	e := uint64(dt.Size())
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	r := plan(count, nb, cell, 16/e)
	slot := cell * e
	mine, own := c.Scratch[me], in+uintptr(uint64(me)*count*e)
	if !c.barrier(b, abi.StageEntry) {
		return false
	}
	slotAt := func(h uint64, q uint32) uintptr {
		return uintptr(((h*uint64(W)+uint64(q))*nb + uint64(b)) * slot)
	}
	for k := range r.Total {
		h := k & 1
		rb, cs := r.round(nb, k)
		st := rb + uint64(b)*cs
		n := cellLen(st, cs, count)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			devapi.Copy(c.Scratch[p]+slotAt(h, me), in+uintptr((uint64(p)*count+st)*e), n*e)
		}
		if !c.barrier(b, abi.StageRSData) {
			return false
		}
		srcs := make([]uintptr, W)
		for q := range W {
			srcs[q] = mine + slotAt(h, q)
		}
		srcs[me] = own + uintptr(st*e)
		reduceRange(dt, op, srcs, []uintptr{out + uintptr(st*e)}, n)
	}
	return true
}

// desc is a zero-copy kernel's mailbox descriptor.
type desc struct {
	inReg, outReg   uint32
	inOff, outOffst uint64
}

// zeroCopy runs a zero-copy kernel: per block, the descriptor exchange,
// then body with every rank's send and recv pointers, then the exit
// barrier.
func (c collCtxT) zeroCopy(l *device.HostLaunch, d desc, in, out uintptr, body func(b, nb uint32, ins, outs []uintptr)) error {
	nb := uint32(blocks(l.Grid))
	if nb > c.SemBlocks {
		return fmt.Errorf("grid of %d blocks, the communicator has semaphores for %d", nb, c.SemBlocks)
	}
	me, W := c.Rank, c.World
	for b := range nb {
		for p := range W {
			if p == me {
				continue
			}
			box := devapi.Bytes(c.Mailbox[p]+uintptr((b*abi.MaxRanks+me)*abi.DescSize), abi.DescSize)
			binary.LittleEndian.PutUint32(box[abi.DescInReg:], d.inReg)
			binary.LittleEndian.PutUint32(box[abi.DescOutReg:], d.outReg)
			binary.LittleEndian.PutUint64(box[abi.DescInOff:], d.inOff)
			binary.LittleEndian.PutUint64(box[abi.DescOutOff:], d.outOffst)
			devapi.SemSignal(c.sem(b, p))
		}
		ins, outs := make([]uintptr, W), make([]uintptr, W)
		ins[me], outs[me] = in, out
		for p := range W {
			if p == me {
				continue
			}
			if !devapi.SemWait(c.sem(b, p), devapi.OpSemWait, abi.StageEntry) {
				return nil
			}
			box := devapi.Bytes(c.Mailbox[me]+uintptr((b*abi.MaxRanks+p)*abi.DescSize), abi.DescSize)
			ins[p] = c.resolve(binary.LittleEndian.Uint32(box[abi.DescInReg:]), p, binary.LittleEndian.Uint64(box[abi.DescInOff:]))
			outs[p] = c.resolve(binary.LittleEndian.Uint32(box[abi.DescOutReg:]), p, binary.LittleEndian.Uint64(box[abi.DescOutOff:]))
		}
		body(b, nb, ins, outs)
		if !c.barrier(b, abi.StageExit) {
			return nil
		}
	}
	return nil
}

// resolve is rank p's registration reg at offset off, as mapped here.
func (c collCtxT) resolve(reg, p uint32, off uint64) uintptr {
	if reg >= c.MaxRegs {
		return 0
	}
	return uintptr(devapi.U64(c.Regs+uintptr((reg*abi.MaxRanks+p)*8)).Load() + off)
}

// blockShare is block b's share of n elements dealt in units of unit
// elements over nb blocks (the twins' stand-in for a grid-stride loop).
func blockShare(n uint64, b, nb uint32, unit uint64) (lo, hi uint64) {
	units := (n + unit - 1) / unit
	per := (units + uint64(nb) - 1) / uint64(nb)
	lo = min(uint64(b)*per*unit, n)
	hi = min(lo+per*unit, n)
	return lo, hi
}

func (c collCtxT) arZC(b, nb uint32, ins, outs []uintptr, count uint64, dt ref.DataType, op ref.Op) {
	e, V := uint64(dt.Size()), uint64(16/dt.Size())
	W := uint64(c.World)
	P := ((count+W-1)/W + V - 1) / V * V
	lo := uint64(c.Rank) * P
	n := cellLen(lo, P, count)
	blo, bhi := blockShare(n, b, nb, V)
	srcs := make([]uintptr, W)
	dsts := make([]uintptr, W)
	for q := range W {
		srcs[q] = ins[q] + uintptr((lo+blo)*e)
		dsts[q] = outs[c.peer(uint32(q))] + uintptr((lo+blo)*e)
	}
	reduceRange(dt, op, srcs, dsts, bhi-blo)
}

// reduceRange is goep_coll_reduce_range: dsts[d][k] = reduce over srcs in
// rank order, for n elements. The sources are read in full before the first
// store, which is what the kernel's threads do for every element they own
// (a destination may be a source: in-place calls).
func reduceRange(dt ref.DataType, op ref.Op, srcs, dsts []uintptr, n uint64) {
	if n == 0 {
		return
	}
	res := make([]byte, n*uint64(dt.Size()))
	switch {
	case dt == ref.FP32 && op == ref.Sum:
		acc := device.HostSlice[float32](srcs[0], int(n))
		r := unsafe.Slice((*float32)(unsafe.Pointer(&res[0])), n)
		copy(r, acc)
		for _, s := range srcs[1:] {
			x := device.HostSlice[float32](s, int(n))
			for i := range r {
				r[i] = float32(r[i] + x[i])
			}
		}
	case dt.Size() == 2 && op == ref.Sum:
		acc := make([]float32, n)
		for q, s := range srcs {
			x := device.HostSlice[uint16](s, int(n))
			for i := range acc {
				if q == 0 {
					acc[i] = ref.ToFloat32(dt, uint32(x[i]))
				} else {
					acc[i] = float32(acc[i] + ref.ToFloat32(dt, uint32(x[i])))
				}
			}
		}
		for i, v := range acc {
			binary.LittleEndian.PutUint16(res[2*i:], uint16(ref.FromFloat32(dt, v)))
		}
	default:
		bufs := make([][]byte, len(srcs))
		for q, s := range srcs {
			bufs[q] = devapi.Bytes(s, uint64(len(res)))
		}
		copy(res, ref.AllReduce(dt, op, bufs))
	}
	for _, d := range dsts {
		copy(devapi.Bytes(d, uint64(len(res))), res)
	}
}

func checkTwin(l *device.HostLaunch) error {
	a := l.Args
	buf, count, dt, op := a.GetPtr(0), a.GetU64(1), ref.DataType(a.GetU32(2)), ref.Op(a.GetU32(3))
	fill, seed, kind := ref.Fill(a.GetU32(4)), a.GetU32(5), a.GetU32(6)
	world, rank, n, out := int(a.GetU32(7)), int(a.GetU32(8)), a.GetU64(9), a.GetPtr(10)
	want := func(i uint64) uint32 {
		switch kind {
		case abi.KindAllGather:
			return ref.ExpectedAllGather(dt, fill, seed, n, i)
		case abi.KindReduceScatter:
			return ref.ExpectedReduceScatter(dt, op, fill, seed, world, rank, n, i)
		}
		return ref.ExpectedAllReduce(dt, op, fill, seed, world, i)
	}
	if m := ref.Compare(devapi.Bytes(buf, count*uint64(dt.Size())), dt, want); m != nil {
		devapi.U64(out).Add(uint64(m.Count))
		first := devapi.U64(out + 8)
		if uint64(m.Index) < first.Load() {
			first.Store(uint64(m.Index))
		}
	}
	return nil
}
