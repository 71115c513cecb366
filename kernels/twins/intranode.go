package twins

import (
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/kernels"
)

// Twins of kernels/intranode.cu. Each runs one rank's launch in that rank's
// goroutine and follows the kernel's protocol on the same memory: entry
// flags, arrival counters and epochs in the workspace control blocks, read
// and written with sync/atomic (so the plain row copies before a release are
// visible after the matching acquire, as on the GPU), and waits bounded by
// the same goep_watchdog (devapi). A twin whose wait gives up returns nil
// after the record is written, like the kernel, which just exits; the host
// reads the record (intranode.Rank.Check).
//
// A launch's blocks add shares summing to intranode.ArrivalUnit to each
// peer's counter; a twin adds the whole unit at once.
func init() {
	device.RegisterHostKernel(intranode.KernelNotify, notifyTwin)
	device.RegisterHostKernel(intranode.KernelDispatch, dispatchTwin)
	device.RegisterHostKernel(intranode.KernelCombine, combineTwin)
}

// inCtrl addresses the control block of one workspace.
type inCtrl uintptr

func (c inCtrl) epoch(kind int) uintptr { return uintptr(c) + uintptr(intranode.EpochOffset(kind)) }
func (c inCtrl) arrive(kind, src int) uintptr {
	return uintptr(c) + uintptr(intranode.ArriveOffset(kind, src))
}
func (c inCtrl) entered(kind, src int) uintptr {
	return uintptr(c) + uintptr(intranode.EnteredOffset(kind, src))
}

// inGroup is what every twin needs: the peer workspaces and this rank.
type inGroup struct {
	peers   []uintptr
	offCtrl uintptr
	rank    int
	wd      uintptr
	waitID  uint32
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

// nextEpoch is the epoch this launch of kind runs as.
func (g inGroup) nextEpoch(kind int) uint64 { return devapi.U64(g.own().epoch(kind)).Load() + 1 }

func (g inGroup) finish(kind int, e uint64) { devapi.U64(g.own().epoch(kind)).Store(e) }

// enter announces epoch e of kind to every rank and waits until every rank
// announced it.
func (g inGroup) enter(kind int, e uint64, stage uint32) bool {
	for d := range g.peers {
		devapi.U64(g.ctrl(d).entered(kind, g.rank)).Store(e)
	}
	for d := range g.peers {
		if !devapi.WaitGE64(g.own().entered(kind, d), e, g.wd, g.waitID, uint32(d), stage) {
			return false
		}
	}
	return true
}

// arrive releases this rank's writes of epoch e to every rank and waits for
// every rank's.
func (g inGroup) arrive(kind int, e uint64, stage uint32) bool {
	for d := range g.peers {
		devapi.U64(g.ctrl(d).arrive(kind, g.rank)).Add(intranode.ArrivalUnit)
	}
	for s := range g.peers {
		if !devapi.WaitGE64(g.own().arrive(kind, s), e*intranode.ArrivalUnit, g.wd, g.waitID, uint32(s), stage) {
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
//	 i32* expert_counts, i32* invalid, goep_watchdog* wd, u32 wait_id)
func notifyTwin(l *device.HostLaunch) error {
	a := l.Args
	offCounts, offEC := uintptr(a.GetU64(2)), uintptr(a.GetU64(3))
	t, k, experts := int(a.GetI32(5)), int(a.GetI32(6)), int(a.GetI32(7))
	ranks, rank, align := int(a.GetI32(8)), int(a.GetI32(9)), int(a.GetI32(10))
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(18), a.GetU32(19))
	le := experts / ranks
	e := g.nextEpoch(intranode.KindNotify)
	parity := int(e & 1)

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
	if !g.arrive(intranode.KindNotify, e, intranode.StageNotifyBarrier) {
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
	g.finish(intranode.KindNotify, e)
	return nil
}

// dispatchTwin is goep_intranode_dispatch:
//
//	(const u64* peers, u64 off_ctrl, u64 off_recv_x, u64 off_recv_scales,
//	 u64 off_recv_src, u64 off_recv_topk, u64 off_recv_weights, const u8* x,
//	 const float* scales, const i64* topk_idx, const float* topk_weights,
//	 const i32* send_pos, const i32* recv_base, int num_tokens, int k,
//	 int num_ranks, int rank, int local_experts, int row_bytes,
//	 int num_scales, goep_watchdog* wd, u32 wait_id)
func dispatchTwin(l *device.HostLaunch) error {
	a := l.Args
	offX, offScales, offSrc := uintptr(a.GetU64(2)), uintptr(a.GetU64(3)), uintptr(a.GetU64(4))
	offTopK, offW := uintptr(a.GetU64(5)), uintptr(a.GetU64(6))
	t, k, ranks, rank := int(a.GetI32(13)), int(a.GetI32(14)), int(a.GetI32(15)), int(a.GetI32(16))
	le, rowBytes, ns := int64(a.GetI32(17)), int(a.GetI32(18)), int(a.GetI32(19))
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(20), a.GetU32(21))
	e := g.nextEpoch(intranode.KindDispatch)
	if !g.enter(intranode.KindDispatch, e, intranode.StageDispatchEntry) {
		return nil
	}
	x := device.HostSlice[byte](a.GetPtr(7), t*rowBytes)
	var scales, weights []float32
	if ns > 0 {
		scales = device.HostSlice[float32](a.GetPtr(8), t*ns)
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
	if !g.arrive(intranode.KindDispatch, e, intranode.StageDispatchArrival) {
		return nil
	}
	g.finish(intranode.KindDispatch, e)
	return nil
}

// combineTwin is goep_intranode_combine:
//
//	(const u64* peers, u64 off_ctrl, u64 off_slots, u64 off_wslots,
//	 u64 slot_rows, const u8* y, const float* weights,
//	 const i32* rank_prefix, const i32* send_pos, const u8* bias0,
//	 const u8* bias1, u8* out, float* out_weights, int num_tokens, int k,
//	 int num_ranks, int rank, int hidden, goep_watchdog* wd, u32 wait_id)
func combineTwin(l *device.HostLaunch) error {
	a := l.Args
	offSlots, offW, slotRows := uintptr(a.GetU64(2)), uintptr(a.GetU64(3)), int(a.GetU64(4))
	t, k, ranks, rank, h := int(a.GetI32(13)), int(a.GetI32(14)), int(a.GetI32(15)), int(a.GetI32(16)), int(a.GetI32(17))
	g := newInGroup(a.GetPtr(0), a.GetU64(1), ranks, rank, a.GetPtr(18), a.GetU32(19))
	e := g.nextEpoch(intranode.KindCombine)
	if !g.enter(intranode.KindCombine, e, intranode.StageCombineEntry) {
		return nil
	}
	prefix := device.HostSlice[int32](a.GetPtr(7), ranks)
	n := int(prefix[ranks-1])
	y := device.HostSlice[uint16](a.GetPtr(5), n*h)
	var w []float32
	if p := a.GetPtr(6); p != 0 {
		w = device.HostSlice[float32](p, n*k)
	}
	lo := 0
	for s := 0; s < ranks; s++ {
		hi := int(prefix[s])
		if hi > lo {
			copy(device.HostSlice[uint16](g.peers[s]+offSlots+uintptr(2*rank*slotRows*h), (hi-lo)*h), y[lo*h:hi*h])
			if w != nil {
				copy(device.HostSlice[float32](g.peers[s]+offW+uintptr(4*rank*slotRows*k), (hi-lo)*k), w[lo*k:hi*k])
			}
		}
		lo = hi
	}
	if !g.arrive(intranode.KindCombine, e, intranode.StageCombineArrival) {
		return nil
	}
	g.finish(intranode.KindCombine, e)

	own := g.peers[rank]
	slots := device.HostSlice[uint16](own+offSlots, ranks*slotRows*h)
	var wslots []float32
	outW := a.GetPtr(12)
	if outW != 0 {
		wslots = device.HostSlice[float32](own+offW, ranks*slotRows*k)
	}
	sendPos := device.HostSlice[int32](a.GetPtr(8), t*ranks)
	var b0, b1 []uint16
	if p := a.GetPtr(9); p != 0 {
		b0 = device.HostSlice[uint16](p, t*h)
	}
	if p := a.GetPtr(10); p != 0 {
		b1 = device.HostSlice[uint16](p, t*h)
	}
	out := device.HostSlice[uint16](a.GetPtr(11), t*h)
	acc := make([]float32, h)
	for tok := 0; tok < t; tok++ {
		clear(acc)
		for d := 0; d < ranks; d++ { // ascending: the reference's order
			pos := int(sendPos[tok*ranks+d])
			if pos < 0 {
				continue
			}
			for j, v := range slots[(d*slotRows+pos)*h : (d*slotRows+pos+1)*h] {
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
					if pos := int(sendPos[tok*ranks+d]); pos >= 0 {
						s += wslots[(d*slotRows+pos)*k+i]
					}
				}
				ow[i] = s
			}
		}
	}
	return nil
}
