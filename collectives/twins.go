package collectives

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Twins of kernels/coll_ll.cu, coll_bulk.cu and coll_util.cu. Each runs the
// kernel's protocol (packet slots and flags, scratch slots, per-block
// semaphores, mailboxes) on host-backend memory, the grid's blocks one after
// another: block b of every rank pairs only with block b of the others, and
// every rank walks its blocks in the same order, so goroutine ranks running
// these concurrently meet as the GPU's blocks do.
//
// The arithmetic is the kernels' (coll_common.cuh, coll_util.cu), written
// here again rather than called from collectives/ref, the reference the
// tests compare these twins with: elements widened to float32, combined in
// rank order (min and max replace only on strict less or greater), rounded
// once to the element type. Only the bit conversions of single values are
// shared (kernels.*BF16*, *FP8E4M3*, ref.*FP16*), each pinned by
// hand-computed cases of its own; TestHandComputedReductions pins the
// reductions with hand-computed bits.

func init() {
	kernels.Register(kernels.Module{Name: "coll_ll", File: "coll_ll.cu",
		Kernels: []string{abi.KernelARLL1, abi.KernelARLL2, abi.KernelAGLL, abi.KernelRSLL, abi.KernelFPSync}})
	kernels.Register(kernels.Module{Name: "coll_bulk", File: "coll_bulk.cu",
		Kernels: []string{abi.KernelARRSAG, abi.KernelAGScratch, abi.KernelRSScratch, abi.KernelARZC, abi.KernelAGZC, abi.KernelRSZC}})
	kernels.Register(kernels.Module{Name: "coll_util", File: "coll_util.cu", Kernels: []string{abi.KernelFill, abi.KernelCheck}})

	// goep_coll_ar_ll1(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelARLL1, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(6)) {
			return nil
		}
		dt, op := DataType(a.GetU32(4)), Op(a.GetU32(5))
		return c.arLL1(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ar_ll2(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelARLL2, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(6)) {
			return nil
		}
		dt, op := DataType(a.GetU32(4)), Op(a.GetU32(5))
		return c.arLL2(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ag_ll(ctx, in, out, u64 bytes)
	device.RegisterHostKernel(abi.KernelAGLL, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(4)) {
			return nil
		}
		return c.agLL(a.GetPtr(1), a.GetPtr(2), a.GetU64(3))
	})
	// goep_coll_rs_ll(ctx, in, out, u64 count, u32 dtype, u32 op)
	device.RegisterHostKernel(abi.KernelRSLL, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(6)) {
			return nil
		}
		dt, op := DataType(a.GetU32(4)), Op(a.GetU32(5))
		return c.rsLL(a.GetPtr(1), a.GetPtr(2), a.GetU64(3)*uint64(dt.Size()), dt, op)
	})
	// goep_coll_ar_rsag(ctx, in, out, u64 count, u32 dtype, u32 op, u64 cell)
	device.RegisterHostKernel(abi.KernelARRSAG, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(7)) {
			return nil
		}
		return c.blocks(l, func(b, nb uint32) bool {
			return c.arRSAG(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), DataType(a.GetU32(4)), Op(a.GetU32(5)), a.GetU64(6))
		})
	})
	// goep_coll_ag_scratch(ctx, in, out, u64 bytes, u64 cell)
	device.RegisterHostKernel(abi.KernelAGScratch, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(5)) {
			return nil
		}
		return c.blocks(l, func(b, nb uint32) bool {
			return c.agScratch(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), a.GetU64(4))
		})
	})
	// goep_coll_rs_scratch(ctx, in, out, u64 count, u32 dtype, u32 op, u64 cell)
	device.RegisterHostKernel(abi.KernelRSScratch, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(7)) {
			return nil
		}
		return c.blocks(l, func(b, nb uint32) bool {
			return c.rsScratch(b, nb, a.GetPtr(1), a.GetPtr(2), a.GetU64(3), DataType(a.GetU32(4)), Op(a.GetU32(5)), a.GetU64(6))
		})
	})
	// goep_coll_ar_zc(ctx, in, out, u64 count, u32 dtype, u32 op, u32 in_reg, u64 in_off, u32 out_reg, u64 out_off)
	device.RegisterHostKernel(abi.KernelARZC, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(10)) {
			return nil
		}
		in, out, count := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		dt, op := DataType(a.GetU32(4)), Op(a.GetU32(5))
		return c.zeroCopy(l, twinDesc{a.GetU32(6), a.GetU32(8), a.GetU64(7), a.GetU64(9)}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			c.arZC(b, nb, ins, outs, count, dt, op)
		})
	})
	// goep_coll_ag_zc(ctx, in, out, u64 bytes, u32 out_reg, u64 out_off)
	device.RegisterHostKernel(abi.KernelAGZC, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(6)) {
			return nil
		}
		in, out, n := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		return c.zeroCopy(l, twinDesc{twinNoReg, a.GetU32(4), 0, a.GetU64(5)}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			lo, hi := twinBlockShare(n, b, nb, 16)
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
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(8)) {
			return nil
		}
		in, out, count := a.GetPtr(1), a.GetPtr(2), a.GetU64(3)
		dt, op := DataType(a.GetU32(4)), Op(a.GetU32(5))
		return c.zeroCopy(l, twinDesc{a.GetU32(6), twinNoReg, a.GetU64(7), 0}, in, out, func(b, nb uint32, ins, outs []uintptr) {
			lo, hi := twinBlockShare(count, b, nb, uint64(16/dt.Size()))
			e := uint64(dt.Size())
			srcs := make([]uintptr, c.World)
			for q := range srcs {
				srcs[q] = ins[q] + uintptr((uint64(c.Rank)*count+lo)*e)
			}
			twinReduceRange(dt, op, srcs, []uintptr{out + uintptr(lo*e)}, hi-lo)
		})
	})
	// goep_coll_fp_sync(ctx, u64 shape)
	device.RegisterHostKernel(abi.KernelFPSync, func(l *device.HostLaunch) error {
		a := l.Args
		c := twinCtxAt(a.GetPtr(0))
		if !c.begin(a.GetU64(1)) {
			return nil
		}
		c.publish()
		for p := range c.World {
			if p != c.Rank && !c.settle(p) {
				return nil
			}
		}
		c.end()
		return nil
	})
	// goep_coll_fill(buf, u64 count, u32 dtype, u32 fill, u32 seed, u32 rank, u64 first)
	device.RegisterHostKernel(abi.KernelFill, func(l *device.HostLaunch) error {
		a := l.Args
		dt := DataType(a.GetU32(2))
		buf, count, fill, seed, rank, first := a.GetPtr(0), a.GetU64(1), a.GetU32(3), a.GetU32(4), a.GetU32(5), a.GetU64(6)
		v := make([]uint32, count)
		for i := range v {
			v[i] = twinFillValue(dt, fill, seed, rank, first+uint64(i))
		}
		twinStoreAll(dt, buf, v)
		return nil
	})
	// goep_coll_check(buf, u64 count, u32 dtype, u32 op, u32 fill, u32 seed, u32 kind, u32 world, u32 rank, u64 n, u64* out)
	device.RegisterHostKernel(abi.KernelCheck, twinCheck)
}

const twinNoReg = math.MaxUint32

// twinBlocks is the number of blocks of a grid.
func twinBlocks(g device.Dim3) int { return max(g.X, 1) * max(g.Y, 1) * max(g.Z, 1) }

// twinCtx is a decoded goep_coll_ctx with the twins' helpers, and the
// launch's call fingerprint (begin).
type twinCtx struct {
	abi.Ctx
	fp uint64
}

func twinCtxAt(p uintptr) twinCtx {
	return twinCtx{Ctx: abi.DecodeCtx(device.HostSlice[byte](p, abi.CtxSize))}
}

// ---------------------------------------------------------------------------
// Call fingerprints (coll_common.cuh, fingerprint.go).

// fpSlot is fp[src] in rank p's control block.
func (c twinCtx) fpSlot(p, src uint32) uintptr { return c.Ctrl[p] + abi.CtrlFP + uintptr(8*src) }

// begin is goep_coll_begin: this launch's fingerprint from the shape and
// the launch counter; false when an earlier launch of this rank failed (the
// twin then returns at once, like the kernel).
func (c *twinCtx) begin(shape uint64) bool {
	if devapi.U64(c.Self+abi.CtxFailed).Load() != 0 {
		return false
	}
	seq := devapi.U64(c.Self+abi.CtxSeq).Load() + 1
	c.fp = shape&^abi.FPSeqMask | seq&abi.FPSeqMask
	return true
}

// publish is the twins' publication (the kernels' protocol before their tags
// moved into the LL flags: every launch writes its word): the fingerprint into every peer's
// fp[rank].
func (c twinCtx) publish() {
	for p := range c.World {
		if p != c.Rank {
			devapi.U64(c.fpSlot(p, c.Rank)).Store(c.fp)
		}
	}
}

// end advances the launch counter (goep_coll_end; the twin ran the whole
// grid).
func (c twinCtx) end() { devapi.U64(c.Self + abi.CtxSeq).Add(1) }

func (c twinCtx) setFailed() { devapi.U64(c.Self + abi.CtxFailed).Store(1) }

// mismatch is goep_coll_mismatch.
func (c twinCtx) mismatch(peer uint32, theirs uint64) {
	devapi.Expire(c.Watchdog, devapi.OpValue, c.LLID[peer], peer, abi.StageMismatch, 0, c.fp, theirs)
	c.setFailed()
}

// Results of twinFPCompare (as the kernels' GOEP_COLL_FP_*).
const (
	twinFPBehind = iota
	twinFPSame
	twinFPAhead
	twinFPMismatch
)

func twinFPCompare(mine, theirs uint64) int {
	if d := (theirs - mine) & abi.FPSeqMask; d != 0 {
		if d < (abi.FPSeqMask+1)/2 {
			return twinFPAhead
		}
		return twinFPBehind
	}
	if theirs == mine {
		return twinFPSame
	}
	return twinFPMismatch
}

// fpWatch is goep_coll_fp_watch: one look at every peer's word.
func (c twinCtx) fpWatch() bool {
	for q := range c.World {
		if q == c.Rank {
			continue
		}
		if f := devapi.U64(c.fpSlot(c.Rank, q)).Load(); twinFPCompare(c.fp, f) == twinFPMismatch {
			c.mismatch(q, f)
			return false
		}
	}
	return true
}

// settle is goep_coll_fp_settle: waits until peer's word is this launch's
// (or ahead).
func (c twinCtx) settle(peer uint32) bool {
	slot := c.fpSlot(c.Rank, peer)
	var s devapi.Spin
	for {
		f := devapi.U64(slot).Load()
		switch twinFPCompare(c.fp, f) {
		case twinFPSame, twinFPAhead:
			return true
		case twinFPMismatch:
			c.mismatch(peer, f)
			return false
		}
		if !s.OK(c.Watchdog, devapi.OpValue, c.LLID[peer], peer, abi.StageFP, c.fp, f) {
			c.setFailed()
			return false
		}
	}
}

// semWaitFP is goep_coll_sem_wait_fp: a semaphore wait that watches the
// peer's word, and fails on a signal whose sender's word is behind.
func (c twinCtx) semWaitFP(s devapi.Semaphore, peer, stage uint32) bool {
	slot := c.fpSlot(c.Rank, peer)
	want := devapi.U64(s.Expected).Load() + 1
	var sp devapi.Spin
	var f uint64
	for {
		got := devapi.U64(s.Inbound).Load()
		f = devapi.U64(slot).Load()
		if got >= want {
			break
		}
		if twinFPCompare(c.fp, f) == twinFPMismatch {
			c.mismatch(peer, f)
			return false
		}
		if !sp.OK(s.Watchdog, devapi.OpSemWait, s.ID, s.Peer, stage, want, got) {
			c.setFailed()
			return false
		}
	}
	devapi.U64(s.Expected).Store(want)
	r := twinFPCompare(c.fp, f)
	if r == twinFPBehind {
		f = devapi.U64(slot).Load()
		r = twinFPCompare(c.fp, f)
	}
	if r == twinFPBehind || r == twinFPMismatch {
		c.mismatch(peer, f)
		return false
	}
	return true
}

// llFinish is goep_coll_ll_finish: unless a wait gave up, every peer's
// word must be this launch's; then the packet flag and the launch counter
// advance.
func (c twinCtx) llFinish(ok bool, flag uint32) {
	for p := uint32(0); ok && p < c.World; p++ {
		if p != c.Rank {
			ok = c.settle(p)
		}
	}
	devapi.FlagEnd(c.Flag, flag)
	c.end()
}

// peer is goep_coll_peer: (rank + j) mod world.
func (c twinCtx) peer(j uint32) uint32 { return (c.Rank + j) % c.World }

func (c twinCtx) waiter(from, stage uint32) devapi.Waiter {
	return devapi.Waiter{Watchdog: c.Watchdog, ID: c.LLID[from], Peer: from, Stage: stage}
}

func (c twinCtx) sem(b, p uint32) devapi.Semaphore {
	at := c.Sems + uintptr(b*abi.MaxRanks+p)*devapi.SemaphoreSize
	return devapi.DecodeSemaphore(device.HostSlice[byte](at, devapi.SemaphoreSize))
}

// barrier is goep_coll_barrier for block b: signal every peer (the entry
// barrier writes the fingerprint into the peer's fp[rank] first), then wait
// for every peer, watching its fingerprint.
func (c twinCtx) barrier(b, stage uint32, entry bool) bool {
	for p := range c.World {
		if p != c.Rank {
			if entry {
				devapi.U64(c.fpSlot(p, c.Rank)).Store(c.fp)
			}
			devapi.SemSignal(c.sem(b, p))
		}
	}
	for p := range c.World {
		if p != c.Rank && !c.semWaitFP(c.sem(b, p), p, stage) {
			return false
		}
	}
	return true
}

// blocks runs fn for every block of the grid in order, stopping at the first
// block whose waits gave up (the kernel's blocks all leave then too); when
// all succeed the launch counter advances.
func (c twinCtx) blocks(l *device.HostLaunch, fn func(b, nb uint32) bool) error {
	nb := uint32(twinBlocks(l.Grid))
	if nb > c.SemBlocks {
		return fmt.Errorf("grid of %d blocks, the communicator has semaphores for %d", nb, c.SemBlocks)
	}
	for b := range nb {
		if !fn(b, nb) {
			return nil
		}
	}
	c.end()
	return nil
}

// pkt is the address of packet k of slot `slot` (slots of `words`
// packets) in the half at base of rank p's packet buffer.
func (c twinCtx) pkt(p uint32, base, slot, words, k uint64) uintptr {
	return c.Packets[p] + uintptr(base+(slot*words+k)*devapi.LL16Size)
}

func twinHalf(flag uint32, size uint64) uint64 { return uint64(flag&1) * size }

// word8 is goep_ll_gather for 8-byte words: word k of b, zero-padded.
func twinWord8(b []byte, k uint64) uint64 {
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
func twinPutWord8(b []byte, k, v uint64) {
	at := k * 8
	if at+8 <= uint64(len(b)) {
		binary.LittleEndian.PutUint64(b[at:], v)
		return
	}
	for i := uint64(0); at+i < uint64(len(b)); i++ {
		b[at+i] = byte(v >> (8 * i))
	}
}

// twinReduceWords is goep_coll_acc8: 8-byte words (rank order) reduced
// lane by lane, each lane widened to float32, combined, rounded once.
func twinReduceWords(dt DataType, op Op, words []uint64) uint64 {
	sz := uint64(dt.Size())
	bits := 8 * sz
	mask := uint64(1)<<bits - 1
	var r uint64
	for lane := range 8 / sz {
		acc := twinToF32(dt, uint32(words[0]>>(bits*lane)&mask))
		for _, w := range words[1:] {
			acc = twinCombine(op, acc, twinToF32(dt, uint32(w>>(bits*lane)&mask)))
		}
		r |= uint64(twinFromF32(dt, acc)) << (bits * lane)
	}
	return r
}

// getWord is goep_coll_get_word: a packet read whose slow path watches
// every peer's fingerprint each time it looks at the timer.
func (c twinCtx) getWord(p uintptr, flag, from, stage uint32) (uint64, bool) {
	w := c.waiter(from, stage)
	var s devapi.Spin
	for polls := uint32(1); ; polls++ {
		d1, d2, seen, ok := devapi.LL16Try(p, flag)
		if ok {
			return uint64(d1) | uint64(d2)<<32, true
		}
		if !s.OK(w.Watchdog, devapi.OpPacket, w.ID, w.Peer, w.Stage, uint64(flag), uint64(seen)) {
			c.setFailed()
			return 0, false
		}
		if polls%devapi.SpinCheckEvery == 0 && !c.fpWatch() {
			return 0, false
		}
	}
}

func (c twinCtx) putWord(p uintptr, v uint64, flag uint32) {
	devapi.LL16Store(p, uint32(v), uint32(v>>32), flag)
}

func (c twinCtx) arLL1(in, out uintptr, bytes uint64, dt DataType, op Op) error {
	c.publish()
	flag := devapi.FlagBegin(c.Flag)
	done := false
	defer func() { c.llFinish(done, flag) }()
	me, words, base := c.Rank, (bytes+7)/8, twinHalf(flag, c.PacketHalf)
	src, dst := devapi.Bytes(in, bytes), devapi.Bytes(out, bytes)
	own := make([]uint64, words)
	for k := range words {
		own[k] = twinWord8(src, k)
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
		twinPutWord8(dst, k, twinReduceWords(dt, op, xs))
	}
	done = true
	return nil
}

func (c twinCtx) arLL2(in, out uintptr, bytes uint64, dt DataType, op Op) error {
	c.publish()
	f1 := devapi.FlagBegin(c.Flag)
	f2 := devapi.FlagNext(f1)
	done := false
	defer func() { c.llFinish(done, f2) }()
	me, W := c.Rank, c.World
	words := (bytes + 7) / 8
	P := (words + uint64(W) - 1) / uint64(W)
	b1, b2 := twinHalf(f1, c.PacketHalf), twinHalf(f2, c.PacketHalf)
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
			c.putWord(c.pkt(p, b1, uint64(me), P, kk), twinWord8(src, lo+kk), f1)
		}
	}
	lo, n := piece(me)
	xs := make([]uint64, W)
	for kk := range n {
		for q := range W {
			if q == me {
				xs[q] = twinWord8(src, lo+kk)
				continue
			}
			v, ok := c.getWord(c.pkt(me, b1, uint64(q), P, kk), f1, q, abi.StageLL1)
			if !ok {
				return nil
			}
			xs[q] = v
		}
		r := twinReduceWords(dt, op, xs)
		twinPutWord8(dst, lo+kk, r)
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
			twinPutWord8(dst, lo+kk, v)
		}
	}
	done = true
	return nil
}

func (c twinCtx) agLL(in, out uintptr, bytes uint64) error {
	c.publish()
	flag := devapi.FlagBegin(c.Flag)
	done := false
	defer func() { c.llFinish(done, flag) }()
	me, words, base := c.Rank, (bytes+7)/8, twinHalf(flag, c.PacketHalf)
	src := devapi.Bytes(in, bytes)
	for k := range words {
		v := twinWord8(src, k)
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
			twinPutWord8(dst, k, v)
		}
	}
	done = true
	return nil
}

func (c twinCtx) rsLL(in, out uintptr, part uint64, dt DataType, op Op) error {
	c.publish()
	flag := devapi.FlagBegin(c.Flag)
	done := false
	defer func() { c.llFinish(done, flag) }()
	me, words, base := c.Rank, (part+7)/8, twinHalf(flag, c.PacketHalf)
	for j := uint32(1); j < c.World; j++ {
		p := c.peer(j)
		src := devapi.Bytes(in+uintptr(uint64(p)*part), part)
		for k := range words {
			c.putWord(c.pkt(p, base, uint64(me), words, k), twinWord8(src, k), flag)
		}
	}
	own, dst := devapi.Bytes(in+uintptr(uint64(me)*part), part), devapi.Bytes(out, part)
	xs := make([]uint64, c.World)
	for k := range words {
		for q := range c.World {
			if q == me {
				xs[q] = twinWord8(own, k)
				continue
			}
			v, ok := c.getWord(c.pkt(me, base, uint64(q), words, k), flag, q, abi.StageLL1)
			if !ok {
				return nil
			}
			xs[q] = v
		}
		twinPutWord8(dst, k, twinReduceWords(dt, op, xs))
	}
	done = true
	return nil
}

// rounds mirrors goep_coll_plan / goep_coll_round.
type twinRounds struct{ abi.Rounds }

func twinPlan(total, parts, cell, vec uint64) twinRounds {
	return twinRounds{abi.PlanRounds(total, parts, cell, vec)}
}

func (r twinRounds) round(parts, k uint64) (base, cs uint64) {
	if k < r.Full {
		return k * parts * r.Cell, r.Cell
	}
	return r.Full * parts * r.Cell, r.LastCell
}

func twinCellLen(start, cs, total uint64) uint64 {
	if start >= total {
		return 0
	}
	return min(cs, total-start)
}

func (c twinCtx) arRSAG(b, nblocks uint32, in, out uintptr, count uint64, dt DataType, op Op, cell uint64) bool {
	e := uint64(dt.Size())
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	parts := uint64(W) * nb
	r := twinPlan(count, parts, cell, 16/e)
	slot := cell * e
	mine := c.Scratch[me]
	if !c.barrier(b, abi.StageEntry, true) {
		return false
	}
	cellAt := func(rb, cs uint64, p uint32) (uint64, uint64) {
		st := rb + (uint64(p)*nb+uint64(b))*cs
		return st, twinCellLen(st, cs, count)
	}
	for k := range r.Total {
		rb, cs := r.round(parts, k)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			st, n := cellAt(rb, cs, p)
			devapi.Copy(c.Scratch[p]+uintptr((uint64(me)*nb+uint64(b))*slot), in+uintptr(st*e), n*e)
		}
		if !c.barrier(b, abi.StageRSData, false) {
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
		twinReduceRange(dt, op, srcs, dsts, n)
		if !c.barrier(b, abi.StageAGData, false) {
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

func (c twinCtx) agScratch(b, nblocks uint32, in, out uintptr, bytes, cell uint64) bool {
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	r := twinPlan(bytes, nb, cell, 16)
	mine, own := c.Scratch[me], out+uintptr(uint64(me)*bytes)
	if !c.barrier(b, abi.StageEntry, true) {
		return false
	}
	slotAt := func(h uint64, q uint32) uintptr {
		return uintptr(((h*uint64(W)+uint64(q))*nb + uint64(b)) * cell)
	}
	for k := range r.Total {
		h := k & 1
		rb, cs := r.round(nb, k)
		st := rb + uint64(b)*cs
		n := twinCellLen(st, cs, bytes)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			devapi.Copy(c.Scratch[p]+slotAt(h, me), in+uintptr(st), n)
		}
		if own != in {
			devapi.Copy(own+uintptr(st), in+uintptr(st), n)
		}
		if !c.barrier(b, abi.StageAGData, false) {
			return false
		}
		for j := uint32(1); j < W; j++ {
			p := c.peer(W - j)
			devapi.Copy(out+uintptr(uint64(p)*bytes+st), mine+slotAt(h, p), n)
		}
	}
	return true
}

func (c twinCtx) rsScratch(b, nblocks uint32, in, out uintptr, count uint64, dt DataType, op Op, cell uint64) bool {
	e := uint64(dt.Size())
	me, W, nb := c.Rank, c.World, uint64(nblocks)
	r := twinPlan(count, nb, cell, 16/e)
	slot := cell * e
	mine, own := c.Scratch[me], in+uintptr(uint64(me)*count*e)
	if !c.barrier(b, abi.StageEntry, true) {
		return false
	}
	slotAt := func(h uint64, q uint32) uintptr {
		return uintptr(((h*uint64(W)+uint64(q))*nb + uint64(b)) * slot)
	}
	for k := range r.Total {
		h := k & 1
		rb, cs := r.round(nb, k)
		st := rb + uint64(b)*cs
		n := twinCellLen(st, cs, count)
		for j := uint32(1); j < W; j++ {
			p := c.peer(j)
			devapi.Copy(c.Scratch[p]+slotAt(h, me), in+uintptr((uint64(p)*count+st)*e), n*e)
		}
		if !c.barrier(b, abi.StageRSData, false) {
			return false
		}
		srcs := make([]uintptr, W)
		for q := range W {
			srcs[q] = mine + slotAt(h, q)
		}
		srcs[me] = own + uintptr(st*e)
		twinReduceRange(dt, op, srcs, []uintptr{out + uintptr(st*e)}, n)
	}
	return true
}

// desc is a zero-copy kernel's mailbox descriptor.
type twinDesc struct {
	inReg, outReg   uint32
	inOff, outOffst uint64
}

// zeroCopy runs a zero-copy kernel: per block, the descriptor exchange
// (with the fingerprint, checked before the descriptor is read), then body
// with every rank's send and recv pointers, then the exit barrier.
func (c twinCtx) zeroCopy(l *device.HostLaunch, d twinDesc, in, out uintptr, body func(b, nb uint32, ins, outs []uintptr)) error {
	nb := uint32(twinBlocks(l.Grid))
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
			devapi.U64(c.fpSlot(p, me)).Store(c.fp)
			devapi.SemSignal(c.sem(b, p))
		}
		ins, outs := make([]uintptr, W), make([]uintptr, W)
		ins[me], outs[me] = in, out
		for p := range W {
			if p == me {
				continue
			}
			if !c.semWaitFP(c.sem(b, p), p, abi.StageEntry) {
				return nil
			}
			box := devapi.Bytes(c.Mailbox[me]+uintptr((b*abi.MaxRanks+p)*abi.DescSize), abi.DescSize)
			ins[p] = c.resolve(binary.LittleEndian.Uint32(box[abi.DescInReg:]), p, binary.LittleEndian.Uint64(box[abi.DescInOff:]))
			outs[p] = c.resolve(binary.LittleEndian.Uint32(box[abi.DescOutReg:]), p, binary.LittleEndian.Uint64(box[abi.DescOutOff:]))
		}
		body(b, nb, ins, outs)
		if !c.barrier(b, abi.StageExit, false) {
			return nil
		}
	}
	c.end()
	return nil
}

// resolve is rank p's registration reg at offset off, as mapped here.
func (c twinCtx) resolve(reg, p uint32, off uint64) uintptr {
	if reg >= c.MaxRegs {
		return 0
	}
	return uintptr(devapi.U64(c.Regs+uintptr((reg*abi.MaxRanks+p)*8)).Load() + off)
}

// blockShare is block b's share of n elements dealt in units of unit
// elements over nb blocks (the twins' stand-in for a grid-stride loop).
func twinBlockShare(n uint64, b, nb uint32, unit uint64) (lo, hi uint64) {
	units := (n + unit - 1) / unit
	per := (units + uint64(nb) - 1) / uint64(nb)
	lo = min(uint64(b)*per*unit, n)
	hi = min(lo+per*unit, n)
	return lo, hi
}

func (c twinCtx) arZC(b, nb uint32, ins, outs []uintptr, count uint64, dt DataType, op Op) {
	e, V := uint64(dt.Size()), uint64(16/dt.Size())
	W := uint64(c.World)
	P := ((count+W-1)/W + V - 1) / V * V
	lo := uint64(c.Rank) * P
	n := twinCellLen(lo, P, count)
	blo, bhi := twinBlockShare(n, b, nb, V)
	srcs := make([]uintptr, W)
	dsts := make([]uintptr, W)
	for q := range W {
		srcs[q] = ins[q] + uintptr((lo+blo)*e)
		dsts[q] = outs[c.peer(uint32(q))] + uintptr((lo+blo)*e)
	}
	twinReduceRange(dt, op, srcs, dsts, bhi-blo)
}

// twinReduceRange is goep_coll_reduce_range: dsts[d][k] = reduce over
// srcs in rank order, for n elements. The sources are read in full before
// the first store, which is what the kernel's threads do for every element
// they own (a destination may be a source: in-place calls). The loops run
// rank by rank over all elements, which combines each element in rank
// order as the kernel does.
func twinReduceRange(dt DataType, op Op, srcs, dsts []uintptr, n uint64) {
	if n == 0 {
		return
	}
	acc, x := make([]float32, n), make([]float32, n)
	twinWiden(dt, srcs[0], acc)
	for _, s := range srcs[1:] {
		twinWiden(dt, s, x)
		for k, v := range x {
			acc[k] = twinCombine(op, acc[k], v)
		}
	}
	res := make([]uint32, n)
	for k, v := range acc {
		res[k] = twinFromF32(dt, v)
	}
	for _, d := range dsts {
		twinStoreAll(dt, d, res)
	}
}

// twinWiden is goep_coll_to_f32 over len(dst) elements at p.
func twinWiden(dt DataType, p uintptr, dst []float32) {
	switch dt {
	case BF16:
		for k, h := range device.HostSlice[uint16](p, len(dst)) {
			dst[k] = kernels.BF16ToFloat32(h)
		}
	case FP16:
		for k, h := range device.HostSlice[uint16](p, len(dst)) {
			dst[k] = ref.FP16ToFloat32(h)
		}
	case FP8E4M3:
		for k, b := range device.HostSlice[uint8](p, len(dst)) {
			dst[k] = kernels.FP8E4M3ToFloat32(b)
		}
	default:
		copy(dst, device.HostSlice[float32](p, len(dst)))
	}
}

// twinLoadAll reads n elements at p as bits (goep_coll_ld_elem).
func twinLoadAll(dt DataType, p uintptr, n uint64) []uint32 {
	out := make([]uint32, n)
	switch dt.Size() {
	case 1:
		for k, v := range device.HostSlice[uint8](p, int(n)) {
			out[k] = uint32(v)
		}
	case 2:
		for k, v := range device.HostSlice[uint16](p, int(n)) {
			out[k] = uint32(v)
		}
	default:
		copy(out, device.HostSlice[uint32](p, int(n)))
	}
	return out
}

// twinStoreAll writes elements (bits) at p (goep_coll_st_elem).
func twinStoreAll(dt DataType, p uintptr, v []uint32) {
	switch dt.Size() {
	case 1:
		d := device.HostSlice[uint8](p, len(v))
		for k := range d {
			d[k] = uint8(v[k])
		}
	case 2:
		d := device.HostSlice[uint16](p, len(v))
		for k := range d {
			d[k] = uint16(v[k])
		}
	default:
		copy(device.HostSlice[uint32](p, len(v)), v)
	}
}

// twinCombine is goep_coll_combine: one step acc op x in float32.
func twinCombine(op Op, acc, x float32) float32 {
	switch op {
	case Min:
		if x < acc {
			return x
		}
		return acc
	case Max:
		if x > acc {
			return x
		}
		return acc
	}
	return float32(acc + x)
}

// twinToF32 is goep_coll_to_f32.
func twinToF32(dt DataType, b uint32) float32 {
	switch dt {
	case BF16:
		return kernels.BF16ToFloat32(uint16(b))
	case FP16:
		return ref.FP16ToFloat32(uint16(b))
	case FP8E4M3:
		return kernels.FP8E4M3ToFloat32(uint8(b))
	}
	return math.Float32frombits(b)
}

// twinFromF32 is goep_coll_from_f32.
func twinFromF32(dt DataType, f float32) uint32 {
	switch dt {
	case BF16:
		return uint32(kernels.Float32ToBF16(f))
	case FP16:
		return uint32(ref.Float32ToFP16(f))
	case FP8E4M3:
		return uint32(kernels.Float32ToFP8E4M3(f))
	}
	return math.Float32bits(f)
}

// twinFillValue is goep_coll_fill_value: element i of rank's generated
// data.
func twinFillValue(dt DataType, fill, seed, rank uint32, i uint64) uint32 {
	h := kernels.PatternValue(i, seed^((rank+1)*0x9e3779b9))
	if fill == uint32(ref.FillSmallInt) {
		return twinFromF32(dt, float32(int32(h%17)-8))
	}
	if dt == FP8E4M3 {
		b := h & 0xff
		if b&0x7f == 0x7f {
			b ^= 1
		}
		return b
	}
	return twinFromF32(dt, float32(int32(h>>8)-(1<<23))*4.76837158203125e-07) // * 2^-21
}

// twinExpectedReduce is goep_coll_expected_reduce.
func twinExpectedReduce(dt DataType, op Op, fill, seed, world uint32, i uint64) uint32 {
	acc := twinToF32(dt, twinFillValue(dt, fill, seed, 0, i))
	for r := uint32(1); r < world; r++ {
		acc = twinCombine(op, acc, twinToF32(dt, twinFillValue(dt, fill, seed, r, i)))
	}
	return twinFromF32(dt, acc)
}

// twinCheck is goep_coll_check(buf, u64 count, u32 dtype, u32 op, u32 fill,
// u32 seed, u32 kind, u32 world, u32 rank, u64 n, u64* out): out[0] += wrong
// elements, out[1] = min(out[1], first wrong index).
func twinCheck(l *device.HostLaunch) error {
	a := l.Args
	buf, count, dt, op := a.GetPtr(0), a.GetU64(1), DataType(a.GetU32(2)), Op(a.GetU32(3))
	fill, seed, kind := a.GetU32(4), a.GetU32(5), a.GetU32(6)
	world, rank, n, out := a.GetU32(7), a.GetU32(8), a.GetU64(9), a.GetPtr(10)
	var bad uint64
	first := uint64(math.MaxUint64)
	got := twinLoadAll(dt, buf, count)
	for i := range count {
		var want uint32
		switch kind {
		case abi.KindAllGather:
			want = twinFillValue(dt, fill, seed, uint32(i/n), i%n)
		case abi.KindReduceScatter:
			want = twinExpectedReduce(dt, op, fill, seed, world, uint64(rank)*n+i)
		default:
			want = twinExpectedReduce(dt, op, fill, seed, world, i)
		}
		if got[i] != want {
			bad++
			first = min(first, i)
		}
	}
	if bad != 0 {
		devapi.U64(out).Add(bad)
		if f := devapi.U64(out + 8); first < f.Load() {
			f.Store(first)
		}
	}
	return nil
}
