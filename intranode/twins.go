package intranode

import (
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Twins of kernels/intranode.cu. Each runs one rank's launch in that rank's
// goroutine and follows the kernel's protocol on the same memory: entry
// flags, arrival counters and epochs in the workspace control blocks, read
// and written with sync/atomic (so the plain row copies before a release are
// visible after the matching acquire, as on the GPU), and waits bounded by
// the same goep_watchdog (devapi). A twin whose wait gives up returns nil
// after the record is written, like the kernel, which just exits; the host
// reads the record (Rank.Check).
//
// A launch's blocks add shares summing to ArrivalUnit to each
// peer's counter; a twin adds the whole unit at once.
func init() {
	device.RegisterHostKernel(KernelNotify, notifyTwin)
	device.RegisterHostKernel(KernelDispatch, dispatchTwin)
	device.RegisterHostKernel(KernelDispatchWide, dispatchTwin)
	device.RegisterHostKernel(KernelDispatchTMA, dispatchTMATwin)
	device.RegisterHostKernel(KernelCombine, combineTwin)
	device.RegisterHostKernel(KernelCopyRows, copyRowsTwin)
}

// inCtrl addresses the control block of one workspace.
type inCtrl uintptr

func (c inCtrl) epoch(kind int) uintptr { return uintptr(c) + uintptr(EpochOffset(kind)) }
func (c inCtrl) arrive(kind, src int) uintptr {
	return uintptr(c) + uintptr(ArriveOffset(kind, src))
}
func (c inCtrl) entered(kind, src int) uintptr {
	return uintptr(c) + uintptr(EnteredOffset(kind, src))
}
func (c inCtrl) fingerprint(src int) uintptr {
	return uintptr(c) + uintptr(FingerprintOffset(src))
}
func (c inCtrl) combineInput(src int) uintptr {
	return uintptr(c) + uintptr(CombineInputOffset(src))
}

// inGroup is what every twin needs: the peer workspaces and this rank.
type inGroup struct {
	peers   []uintptr
	offCtrl uintptr
	rank    int
	wd      uintptr
	waitID  uint32
	fp      uint64 // this launch's call fingerprint (setFingerprint)
}

func newInGroup(peerTable uintptr, offCtrl uint64, ranks, rank int, wd uintptr, waitID uint32) inGroup {
	g := inGroup{peers: make([]uintptr, ranks), offCtrl: uintptr(offCtrl), rank: rank, wd: wd, waitID: waitID}
	for i, p := range device.HostSlice[uint64](peerTable, ranks) {
		g.peers[i] = uintptr(p)
	}
	return g
}

func (g inGroup) ctrl(r int) inCtrl { return inCtrl(g.peers[r] + g.offCtrl) }
func (g inGroup) own() inCtrl       { return g.ctrl(g.rank) }

// setFingerprint is goep_in_fingerprint: the launcher's shape word with the
// launch's sequence number (sum of the epochs + 1).
//
// It reports false when an earlier launch of this rank failed: the twin
// then returns at once, like the kernel.
func (g *inGroup) setFingerprint(shape uint64) bool {
	if devapi.U64(uintptr(g.own())+CtrlFailed).Load() != 0 {
		return false
	}
	seq := uint64(1)
	for k := KindNotify; k <= KindCombine; k++ {
		seq += devapi.U64(g.own().epoch(k)).Load()
	}
	g.fp = shape&^(1<<fpSeqBits-1) | seq&(1<<fpSeqBits-1)
	return true
}

// publishFingerprint is goep_in_publish_fp: this launch's fingerprint into
// every rank's fp[rank], before the signal that releases it.
func (g inGroup) publishFingerprint() {
	for d := range g.peers {
		devapi.U64(g.ctrl(d).fingerprint(g.rank)).Store(g.fp)
	}
}

// Results of fpCompare (goep_in_fp_cmp).
const (
	fpBehind = iota
	fpSame
	fpAhead
	fpMismatch
)

func fpCompare(mine, theirs uint64) int {
	switch d := int16(uint16(theirs) - uint16(mine)); {
	case d < 0:
		return fpBehind
	case d > 0:
		return fpAhead
	case theirs == mine:
		return fpSame
	}
	return fpMismatch
}

// waitFP is goep_in_wait_ge_fp: waits for *p >= target from peer while
// comparing the peer's fingerprint with this launch's; a failure marks
// this rank's control block failed.
func (g inGroup) waitFP(p uintptr, target uint64, peer int, stage uint32) bool {
	if g.waitFPInner(p, target, peer, stage) {
		return true
	}
	devapi.U64(uintptr(g.own()) + CtrlFailed).Store(1)
	return false
}

func (g inGroup) waitFPInner(p uintptr, target uint64, peer int, stage uint32) bool {
	slot := g.own().fingerprint(peer)
	var s devapi.Spin
	var f uint64
	for {
		v := devapi.U64(p).Load()
		f = devapi.U64(slot).Load()
		if v >= target {
			break
		}
		if fpCompare(g.fp, f) == fpMismatch {
			devapi.Expire(g.wd, devapi.OpValue, g.waitID, uint32(peer), StageMismatch, 0, g.fp, f)
			return false
		}
		if !s.OK(g.wd, devapi.OpValue, g.waitID, uint32(peer), stage, target, v) {
			return false
		}
	}
	c := fpCompare(g.fp, f)
	if c == fpBehind {
		f = devapi.U64(slot).Load()
		c = fpCompare(g.fp, f)
	}
	if c == fpBehind || c == fpMismatch {
		devapi.Expire(g.wd, devapi.OpValue, g.waitID, uint32(peer), StageMismatch, 0, g.fp, f)
		return false
	}
	return true
}

// nextEpoch is the epoch this launch of kind runs as.
func (g inGroup) nextEpoch(kind int) uint64 { return devapi.U64(g.own().epoch(kind)).Load() + 1 }

func (g inGroup) finish(kind int, e uint64) { devapi.U64(g.own().epoch(kind)).Store(e) }

// announce tells every rank that this rank entered epoch e of kind.
func (g inGroup) announce(kind int, e uint64) {
	for d := range g.peers {
		devapi.U64(g.ctrl(d).entered(kind, g.rank)).Store(e)
	}
}

// enter announces epoch e of kind to every rank and waits until every rank
// announced it.
func (g inGroup) enter(kind int, e uint64, stage uint32) bool {
	g.announce(kind, e)
	return g.waitEntered(kind, e, stage)
}

// waitEntered waits until every rank announced epoch e of kind.
func (g inGroup) waitEntered(kind int, e uint64, stage uint32) bool {
	for d := range g.peers {
		if !g.waitFP(g.own().entered(kind, d), e, d, stage) {
			return false
		}
	}
	return true
}

// arrive releases this rank's writes of epoch e to every rank and waits for
// every rank's.
func (g inGroup) arrive(kind int, e uint64, stage uint32) bool {
	for d := range g.peers {
		devapi.U64(g.ctrl(d).arrive(kind, g.rank)).Add(ArrivalUnit)
	}
	for s := range g.peers {
		if !g.waitFP(g.own().arrive(kind, s), e*ArrivalUnit, s, stage) {
			return false
		}
	}
	return true
}

// notifyTwin is goep_intranode_notify:
//
//	(const u64* peers, u64 off_ctrl, u64 off_counts, u64 off_expert_counts,
//	 const i64* topk_idx, int num_tokens, int k, int num_experts,
//	 int num_ranks, int rank, int expert_alignment, i32* send_pos,
//	 i32* rank_prefix, i32* recv_base, i32* num_recv, i32* mapped_num_recv,
//	 i32* expert_counts, i32* invalid, goep_watchdog* wd, u32 wait_id,
//	 u64 fp_shape)
func notifyTwin(l *device.HostLaunch) error {
	a := l.Args
	offCounts, offEC := uintptr(a.GetU64(2)), uintptr(a.GetU64(3))
	t, k, experts := int(a.GetI32(5)), int(a.GetI32(6)), int(a.GetI32(7))
	ranks, rank, align := int(a.GetI32(8)), int(a.GetI32(9)), int(a.GetI32(10))
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(18), a.GetU32(19))
	le := experts / ranks
	e := g.nextEpoch(KindNotify)
	parity := int(e & 1)
	if !g.setFingerprint(a.GetU64(20)) {
		return nil
	}
	g.publishFingerprint()

	ids := device.HostSlice[int64](a.GetPtr(4), t*k)
	sendPos := device.HostSlice[int32](a.GetPtr(11), t*ranks)
	row := make([]int32, ranks)
	perExpert := make([]int32, experts)
	bad := int32(0)
	for tok := 0; tok < t; tok++ {
		mask := 0
		for _, x := range ids[tok*k : (tok+1)*k] {
			if x >= 0 && x < int64(experts) {
				mask |= 1 << (int(x) / le)
				perExpert[x]++
			} else if x != -1 {
				bad++
			}
		}
		for d := 0; d < ranks; d++ {
			if mask>>d&1 != 0 {
				sendPos[tok*ranks+d] = row[d]
				row[d]++
			} else {
				sendPos[tok*ranks+d] = -1
			}
		}
	}
	for d, p := range g.peers {
		copy(device.HostSlice[int32](p+offCounts, 2*ranks*ranks)[(parity*ranks+rank)*ranks:], row)
		copy(device.HostSlice[int32](p+offEC, 2*ranks*le)[(parity*ranks+rank)*le:], perExpert[d*le:(d+1)*le])
	}
	if !g.arrive(KindNotify, e, StageNotifyBarrier) {
		return nil
	}
	m := device.HostSlice[int32](g.peers[rank]+offCounts, 2*ranks*ranks)[parity*ranks*ranks:]
	prefix := device.HostSlice[int32](a.GetPtr(12), ranks)
	base := device.HostSlice[int32](a.GetPtr(13), ranks)
	total := int32(0)
	for s := 0; s < ranks; s++ {
		total += m[s*ranks+rank]
		prefix[s] = total
		b := int32(0)
		for src := 0; src < rank; src++ {
			b += m[src*ranks+s]
		}
		base[s] = b
	}
	if p := a.GetPtr(16); p != 0 {
		ec := device.HostSlice[int32](g.peers[rank]+offEC, 2*ranks*le)[parity*ranks*le:]
		out := device.HostSlice[int32](p, le)
		for i := range out {
			n := int32(0)
			for s := 0; s < ranks; s++ {
				n += ec[s*le+i]
			}
			if align > 1 {
				n = (n + int32(align) - 1) / int32(align) * int32(align)
			}
			out[i] = n
		}
	}
	device.HostSlice[int32](a.GetPtr(14), 1)[0] = total
	if p := a.GetPtr(17); p != 0 {
		device.HostSlice[int32](p, 1)[0] = bad
	}
	if p := a.GetPtr(15); p != 0 {
		devapi.U32(p).Store(uint32(total)) // last: the host polls it
	}
	g.finish(KindNotify, e)
	return nil
}

// dispatchTwin is goep_intranode_dispatch and goep_intranode_dispatch_wide:
//
//	(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales,
//	 u64 off_recv_src, u64 off_recv_topk, u64 off_recv_weights, const u8* x,
//	 const float* scales, const i64* topk_idx, const float* topk_weights,
//	 const i32* send_pos, const i32* recv_base, int num_tokens, int k,
//	 int num_ranks, int rank, int local_experts, int row_bytes,
//	 int num_scales, int num_slices, int skip_entry, goep_watchdog* wd,
//	 u32 wait_id, i64 scale_token_stride, i64 scale_hidden_stride,
//	 u64 fp_shape)
func dispatchTwin(l *device.HostLaunch) error { return dispatchRows(l.Args, 22) }

// dispatchTMATwin is goep_intranode_dispatch_tma: the same parameters with
// int piece_bytes, int stages before wd (how rows move is the kernel's
// business; what lands where is the same).
func dispatchTMATwin(l *device.HostLaunch) error { return dispatchRows(l.Args, 24) }

// dispatchRows runs a dispatch whose watchdog and wait id are parameters
// wdArg and wdArg+1, the scales' element strides wdArg+2 and wdArg+3, and
// the fingerprint's shape word wdArg+4.
func dispatchRows(a *device.Args, wdArg int) error {
	offX, offScales, offSrc := uintptr(a.GetU64(2)), uintptr(a.GetU64(3)), uintptr(a.GetU64(4))
	offTopK, offW := uintptr(a.GetU64(5)), uintptr(a.GetU64(6))
	t, k, ranks, rank := int(a.GetI32(13)), int(a.GetI32(14)), int(a.GetI32(15)), int(a.GetI32(16))
	le, rowBytes, ns := int64(a.GetI32(17)), int(a.GetI32(18)), int(a.GetI32(19))
	skipEntry := a.GetI32(21) != 0
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(wdArg), a.GetU32(wdArg+1))
	e := g.nextEpoch(KindDispatch)
	if !g.setFingerprint(a.GetU64(wdArg + 4)) {
		return nil
	}
	g.publishFingerprint()
	g.announce(KindDispatch, e)
	if !skipEntry && !g.waitEntered(KindDispatch, e, StageDispatchEntry) {
		return nil
	}
	x := device.HostSlice[byte](a.GetPtr(7), t*rowBytes)
	var weights []float32
	var scales []float32 // row-major copy of the strided scales, [t][ns]
	if ns > 0 && t > 0 {
		st, sc := a.GetI64(wdArg+2), a.GetI64(wdArg+3)
		span := int64(t-1)*st + int64(ns-1)*sc + 1
		src := device.HostSlice[float32](a.GetPtr(8), int(span))
		scales = make([]float32, t*ns)
		for tok := 0; tok < t; tok++ {
			for c := 0; c < ns; c++ {
				scales[tok*ns+c] = src[int64(tok)*st+int64(c)*sc]
			}
		}
	}
	ids := device.HostSlice[int64](a.GetPtr(9), t*k)
	if p := a.GetPtr(10); p != 0 {
		weights = device.HostSlice[float32](p, t*k)
	}
	sendPos := device.HostSlice[int32](a.GetPtr(11), t*ranks)
	base := device.HostSlice[int32](a.GetPtr(12), ranks)
	for tok := 0; tok < t; tok++ {
		for d := 0; d < ranks; d++ {
			pos := sendPos[tok*ranks+d]
			if pos < 0 {
				continue
			}
			j := int(base[d] + pos)
			p := g.peers[d]
			copy(device.HostSlice[byte](p+offX+uintptr(j*rowBytes), rowBytes), x[tok*rowBytes:(tok+1)*rowBytes])
			if ns > 0 {
				copy(device.HostSlice[float32](p+offScales+uintptr(4*j*ns), ns), scales[tok*ns:(tok+1)*ns])
			}
			device.HostSlice[int32](p+offSrc+uintptr(4*j), 1)[0] = int32(tok)
			rt := device.HostSlice[int64](p+offTopK+uintptr(8*j*k), k)
			var rw []float32
			if weights != nil {
				rw = device.HostSlice[float32](p+offW+uintptr(4*j*k), k)
			}
			lo := int64(d) * le
			for i, id := range ids[tok*k : (tok+1)*k] {
				mine := id >= lo && id < lo+le
				rt[i] = -1
				if mine {
					rt[i] = id - lo
				}
				if rw != nil {
					rw[i] = 0
					if mine {
						rw[i] = weights[tok*k+i]
					}
				}
			}
		}
	}
	if !g.arrive(KindDispatch, e, StageDispatchArrival) {
		return nil
	}
	g.finish(KindDispatch, e)
	return nil
}

// combineTwin is goep_intranode_combine (pull):
//
//	(const u64* peers, u64 off_ctrl, u64 off_y, u64 off_w,
//	 const i32* recv_base, const i32* send_pos, const u8* bias0,
//	 const u8* bias1, u8* out, float* out_weights, int num_tokens, int k,
//	 int num_ranks, int rank, int hidden, int num_slices,
//	 goep_watchdog* wd, u32 wait_id, u64 fp_shape)
//
// Entry publishes this rank's input descriptor and then its entry flag;
// once every rank's flag is here, the twin reads every peer's input where
// its descriptor says, sums, and then tells every rank it is done reading
// and waits until every rank is done with its own input.
func combineTwin(l *device.HostLaunch) error {
	a := l.Args
	offY, offW := a.GetU64(2), a.GetU64(3)
	t, k, ranks, rank, h := int(a.GetI32(10)), int(a.GetI32(11)), int(a.GetI32(12)), int(a.GetI32(13)), int(a.GetI32(14))
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(16), a.GetU32(17))
	e := g.nextEpoch(KindCombine)
	if !g.setFingerprint(a.GetU64(18)) {
		return nil
	}
	g.publishFingerprint()
	for d := range g.peers {
		desc := g.ctrl(d).combineInput(rank)
		devapi.U64(desc).Store(offY)
		devapi.U64(desc + 8).Store(offW)
	}
	if !g.enter(KindCombine, e, StageCombineEntry) {
		return nil
	}
	ys := make([]uintptr, ranks)
	ws := make([]uintptr, ranks)
	for d, p := range g.peers {
		desc := g.own().combineInput(d)
		ys[d] = p + uintptr(devapi.U64(desc).Load())
		if o := devapi.U64(desc + 8).Load(); o != NoOffset {
			ws[d] = p + uintptr(o)
		}
	}
	base := device.HostSlice[int32](a.GetPtr(4), ranks)
	sendPos := device.HostSlice[int32](a.GetPtr(5), t*ranks)
	var b0, b1 []uint16
	if p := a.GetPtr(6); p != 0 {
		b0 = device.HostSlice[uint16](p, t*h)
	}
	if p := a.GetPtr(7); p != 0 {
		b1 = device.HostSlice[uint16](p, t*h)
	}
	out := device.HostSlice[uint16](a.GetPtr(8), t*h)
	outW := a.GetPtr(9)
	acc := make([]float32, h)
	for tok := 0; tok < t; tok++ {
		clear(acc)
		for d := 0; d < ranks; d++ { // ascending: the reference's order
			pos := int(sendPos[tok*ranks+d])
			if pos < 0 {
				continue
			}
			row := int(base[d]) + pos
			for j, v := range device.HostSlice[uint16](ys[d]+uintptr(2*row*h), h) {
				acc[j] += kernels.BF16ToFloat32(v)
			}
		}
		for j, v := range acc {
			if b0 != nil {
				v += kernels.BF16ToFloat32(b0[tok*h+j])
			}
			if b1 != nil {
				v += kernels.BF16ToFloat32(b1[tok*h+j])
			}
			out[tok*h+j] = kernels.Float32ToBF16(v)
		}
		if outW != 0 {
			ow := device.HostSlice[float32](outW+uintptr(4*tok*k), k)
			for i := range ow {
				s := float32(0)
				for d := 0; d < ranks; d++ {
					if pos := int(sendPos[tok*ranks+d]); pos >= 0 && ws[d] != 0 {
						s += device.HostSlice[float32](ws[d]+uintptr(4*((int(base[d])+pos)*k+i)), 1)[0]
					}
				}
				ow[i] = s
			}
		}
	}
	// Done reading every peer's input; wait until every rank is done with
	// this rank's.
	if !g.arrive(KindCombine, e, StageCombineArrival) {
		return nil
	}
	g.finish(KindCombine, e)
	return nil
}

// copyRowsTwin is goep_intranode_copy_rows:
//
//	(const u8* src, u8* dst, const i32* num_rows, int max_rows,
//	 u64 row_bytes)
func copyRowsTwin(l *device.HostLaunch) error {
	a := l.Args
	n := min(int(device.HostSlice[int32](a.GetPtr(2), 1)[0]), int(a.GetI32(3)))
	bytes := max(n, 0) * int(a.GetU64(4))
	if bytes > 0 {
		copy(device.HostSlice[byte](a.GetPtr(1), bytes), device.HostSlice[byte](a.GetPtr(0), bytes))
	}
	return nil
}
