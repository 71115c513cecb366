package lowlatency

import (
	"math"
	"time"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// Twins of kernels/lowlatency.cu for the host backend: each runs one
// rank's launch in its goroutine and follows the kernel's protocol on the
// same memory (epochs, freed and arrival counters, the receive gate's mask),
// with sync/atomic for the counters, so that the rows written before an
// Add are visible after the matching Load. A launch adds the whole
// ArrivalUnit at once where the kernel's blocks add shares. A wait that
// gives up returns nil after the record is written, as the kernel exits.
func init() {
	// The specialised kernels compute what the general ones do.
	for _, k := range []string{KernelDispatch, KernelDispatchBF16, KernelDispatchFP8, KernelDispatchUE8M0} {
		device.RegisterHostKernel(k, dispatchTwin)
	}
	for _, k := range []string{KernelCombine, KernelCombineCommon} {
		device.RegisterHostKernel(k, combineTwin)
	}
	device.RegisterHostKernel(KernelSetMask, setMaskTwin)
}

type llGroup struct {
	peers   []uintptr
	offCtrl uintptr
	rank    int
	wd      uintptr
	waitID  uint32
	elastic bool
	// Across nodes: the ranks of this node (direct stores) and the port
	// channels to the others (zero handles for this node's ranks).
	nodeMask uint32
	ports    []devapi.PortChannel
}

// remote is the ranks on other nodes.
func (g llGroup) remote() uint32 { return all(len(g.peers)) &^ g.nodeMask }

// row is goep_ll_row: d's staging row srow when d is on this node, else
// row drow of this rank's send region.
func (g llGroup) row(d int, offStage, offSend uintptr, srow, drow, rowBytes int) uintptr {
	if g.nodeMask>>uint(d)&1 != 0 {
		return g.peers[d] + offStage + uintptr(srow*rowBytes)
	}
	return g.peers[g.rank] + offSend + uintptr(drow*rowBytes)
}

// portRows is goep_ll_port_rows.
func (g llGroup) portRows(d int, offStage, offSend uintptr, maxT, rows, rowBytes int) bool {
	if rows <= 0 {
		return true
	}
	return devapi.PortPut(g.ports[d], uint64(offStage)+uint64(g.rank*maxT*rowBytes), uint64(offSend)+uint64(d*maxT*rowBytes),
		uint64(rows*rowBytes), 0, StagePortPush)
}

// portAdd adds the unit to counter off(set, this rank) of rank d.
func (g llGroup) portAdd(d int, off func(b, r int) int, set int) bool {
	return devapi.PortAtomicAdd(g.ports[d], g.ports[d].Dst, uint64(g.offCtrl)+uint64(off(set, g.rank)), ArrivalUnit, StagePortPush)
}

// remoteFreed is goep_ll_finish's part across nodes.
func (g llGroup) remoteFreed(off func(b, r int) int, set int) {
	for d := range g.peers {
		if g.remote()>>uint(d)&1 != 0 && !g.portAdd(d, off, set) {
			return
		}
	}
}

func (g llGroup) ctrl(r int) uintptr { return g.peers[r] + g.offCtrl }
func (g llGroup) own() uintptr       { return g.ctrl(g.rank) }
func (g llGroup) mask() uint32       { return devapi.U32(g.own() + CtrlMask).Load() }

func (g llGroup) active() uint32 {
	m := g.mask()
	if m>>uint(g.rank)&1 != 0 {
		return 0
	}
	// (1<<R - 1) &^ m: Go's &^ binds tighter than -, so the parentheses
	// of all() matter.
	return all(len(g.peers)) &^ m
}

// wait is goep_ll_wait: 0 reached, 1 peer masked, 2 failed.
func (g llGroup) wait(p uintptr, target uint64, peer int, stage uint32) int {
	if !g.elastic {
		if devapi.WaitGE64(p, target, g.wd, g.waitID, uint32(peer), stage) {
			return 0
		}
		return 2
	}
	var start time.Time
	for n := 1; devapi.U64(p).Load() < target; n++ {
		time.Sleep(time.Microsecond)
		if n%devapi.SpinCheckEvery != 0 {
			continue
		}
		if devapi.Aborted(g.wd) {
			return 2
		}
		if g.mask()>>uint(peer)&1 != 0 {
			return 1
		}
		if start.IsZero() {
			start = time.Now()
		} else if uint64(time.Since(start)) >= devapi.U64(g.wd+devapi.WatchdogTimeoutNS).Load() {
			m := devapi.U32(g.own() + CtrlMask)
			for old := m.Load(); !m.CompareAndSwap(old, old|1<<uint(peer)); old = m.Load() {
			}
			return 1
		}
	}
	return 0
}

// waitRanks waits for counter(set, r) >= target for every r in want.
func (g llGroup) waitRanks(off func(b, r int) int, set int, want uint32, target uint64, stage uint32) bool {
	for r := range g.peers {
		if want>>uint(r)&1 != 0 && g.wait(g.own()+uintptr(off(set, r)), target, r, stage) == 2 {
			return false
		}
	}
	return true
}

func (g llGroup) signal(off func(b, r int) int, set int, to uint32) {
	for d := range g.peers {
		if to>>uint(d)&1 != 0 && g.nodeMask>>uint(d)&1 != 0 {
			devapi.U64(g.ctrl(d) + uintptr(off(set, g.rank))).Add(ArrivalUnit)
		}
	}
}

// effective is the mask a receive uses after its waits (all masked when
// this rank itself is).
func (g llGroup) effective() uint32 {
	m := g.mask()
	if m>>uint(g.rank)&1 != 0 {
		m = math.MaxUint32
	}
	return m
}

func newLLGroup(a *device.Args, ranks, rank int, elastic bool, wdArg int) llGroup {
	g := llGroup{peers: make([]uintptr, ranks), offCtrl: uintptr(a.GetU64(1)), rank: rank, wd: a.GetPtr(wdArg),
		waitID: a.GetU32(wdArg + 1), elastic: elastic, nodeMask: a.GetU32(wdArg + 3)}
	for i, p := range device.HostSlice[uint64](a.GetPtr(0), ranks) {
		g.peers[i] = uintptr(p)
	}
	if g.remote() != 0 {
		ports := a.GetPtr(wdArg + 2)
		g.ports = make([]devapi.PortChannel, ranks)
		for d := range g.ports {
			if g.remote()>>uint(d)&1 != 0 {
				g.ports[d] = devapi.DecodePortChannel(device.HostSlice[byte](ports+uintptr(d*devapi.PortChannelSize), devapi.PortChannelSize))
			}
		}
	}
	return g
}

// dispatchTwin is goep_ll_dispatch (parameter order in launch.go).
func dispatchTwin(l *device.HostLaunch) error {
	a := l.Args
	off := func(i int) uintptr { return uintptr(a.GetU64(i)) }
	oStageX, oStageS, oStageIDs, oStageW := off(2), off(3), off(4), off(5)
	oRecvX, oRecvS, oRecvSrc, oRecvRange, oRecvCount := off(6), off(7), off(8), off(9), off(10)
	oTabPos, oTabW, oTabT, oTabRow, oOwnMask := off(11), off(12), off(13), off(14), off(15)
	x, topk, ids64, weights := a.GetPtr(16), a.GetPtr(17), a.GetI32(18) != 0, a.GetPtr(19)
	t, k, ranks, rank := int(a.GetI32(20)), int(a.GetI32(21)), int(a.GetI32(22)), int(a.GetI32(23))
	le, maxT, h := int(a.GetI32(24)), int(a.GetI32(25)), int(a.GetI32(26))
	format, rankMajor, set := Format(a.GetI32(27)), a.GetI32(28) != 0, int(a.GetI32(29))
	phases, elastic := Phase(a.GetI32(30)), a.GetI32(31) != 0
	g := newLLGroup(a, ranks, rank, elastic, 33)
	oSendX, oSendS, oSendIDs, oSendW := off(37), off(38), off(39), off(40)
	own := g.peers[rank]
	epoch := devapi.U64(g.own() + CtrlDispEpoch + uintptr(8*set))
	e := epoch.Load() + 1
	ns := h / FP8Block
	row2 := 2 * h

	if phases&Send != 0 {
		if !g.waitRanks(DispFreedOffset, set, g.active(), (e-1)*ArrivalUnit, StageDispatchFreed) {
			return nil
		}
		active := g.active()
		var ids []int64
		if ids64 {
			ids = device.HostSlice[int64](topk, t*k)
		} else {
			ids = make([]int64, t*k)
			for i, v := range device.HostSlice[int32](topk, t*k) {
				ids[i] = int64(v)
			}
		}
		var w []float32
		if weights != 0 {
			w = device.HostSlice[float32](weights, t*k)
		}
		xs := device.HostSlice[uint16](x, t*h)
		ownMask := device.HostSlice[uint32](own+oOwnMask, maxT)
		invalid := devapi.U32(g.own() + CtrlInvalidAcc + uintptr(4*set))
		for tok := 0; tok < t; tok++ {
			tmask := uint32(0)
			for _, id := range ids[tok*k : (tok+1)*k] {
				if id >= 0 && id < int64(ranks*le) {
					tmask |= 1 << uint(id/int64(le))
				} else if id != -1 {
					invalid.Add(1)
				}
			}
			tmask &= active
			ownMask[tok] = tmask
			srow := rank*maxT + tok
			var q []uint8
			var sc []float32
			row := xs[tok*h : (tok+1)*h]
			if format.Quantized() && tmask != 0 {
				q, sc, _ = QuantizeRow(row, format)
			}
			for d := 0; d < ranks; d++ {
				if active>>uint(d)&1 == 0 {
					continue
				}
				drow := d*maxT + tok
				sid := device.HostSlice[int32](g.row(d, oStageIDs, oSendIDs, srow, drow, 4*k), k)
				sw := device.HostSlice[float32](g.row(d, oStageW, oSendW, srow, drow, 4*k), k)
				here := tmask>>uint(d)&1 != 0
				for j, id := range ids[tok*k : (tok+1)*k] {
					sid[j], sw[j] = -1, 0
					if here && id >= int64(d*le) && id < int64((d+1)*le) {
						sid[j], sw[j] = int32(id-int64(d*le)), 1
						if w != nil {
							sw[j] = w[tok*k+j]
						}
					}
				}
				if !here {
					continue
				}
				dst := g.row(d, oStageX, oSendX, srow, drow, row2)
				if format.Quantized() {
					copy(device.HostSlice[uint8](dst, h), q)
					copy(device.HostSlice[float32](g.row(d, oStageS, oSendS, srow, drow, 4*ns), ns), sc)
				} else {
					copy(device.HostSlice[uint16](dst, h), row)
				}
			}
		}
		for d := 0; d < ranks; d++ {
			n := uint32(0)
			if active>>uint(d)&1 != 0 {
				n = uint32(t)
			}
			if g.nodeMask>>uint(d)&1 != 0 {
				devapi.U32(g.ctrl(d) + uintptr(NTokOffset(set, rank))).Store(n)
			} else {
				devapi.U32(g.own() + uintptr(SendNTokOffset(set, d))).Store(n)
			}
		}
		devapi.U32(g.own() + CtrlOwnT + uintptr(4*set)).Store(uint32(t))
		g.signal(DispArriveOffset, set, all(ranks))
		for d := 0; d < ranks; d++ {
			if g.remote()>>uint(d)&1 == 0 {
				continue
			}
			rows := 0
			if active>>uint(d)&1 != 0 {
				rows = t
			}
			ok := g.portRows(d, oStageX, oSendX, maxT, rows, row2) &&
				(!format.Quantized() || g.portRows(d, oStageS, oSendS, maxT, rows, 4*ns)) &&
				g.portRows(d, oStageIDs, oSendIDs, maxT, rows, 4*k) &&
				g.portRows(d, oStageW, oSendW, maxT, rows, 4*k) &&
				devapi.PortPut(g.ports[d], uint64(g.offCtrl)+uint64(NTokOffset(set, rank)), uint64(g.offCtrl)+uint64(SendNTokOffset(set, d)), 4, 0, StagePortPush) &&
				g.portAdd(d, DispArriveOffset, set)
			if !ok {
				return nil
			}
		}
	}
	if phases&Recv == 0 {
		return nil
	}
	if !g.waitRanks(DispArriveOffset, set, g.active(), e*ArrivalUnit, StageDispatchArrival) {
		return nil
	}
	eff := g.effective()
	devapi.U32(g.own() + CtrlDispEff + uintptr(4*set)).Store(eff)
	tabT := device.HostSlice[int32](own+oTabT, ranks)
	for s := range tabT {
		tabT[s] = 0
		if eff>>uint(s)&1 == 0 {
			tabT[s] = int32(devapi.U32(g.own() + uintptr(NTokOffset(set, s))).Load())
		}
	}
	devapi.U64(g.own() + CtrlDispGate + uintptr(8*set)).Store(e)
	sids := device.HostSlice[int32](own+oStageIDs, ranks*maxT*k)
	sw := device.HostSlice[float32](own+oStageW, ranks*maxT*k)
	tabPos := device.HostSlice[int32](own+oTabPos, ranks*maxT*k)
	tabW := device.HostSlice[float32](own+oTabW, ranks*maxT*k)
	for s := 0; s < ranks; s++ {
		for tok := 0; tok < int(tabT[s]); tok++ {
			for j := 0; j < k; j++ {
				q := (s*maxT+tok)*k + j
				tabW[q] = sw[q]
				if sids[q] < 0 {
					tabPos[q] = -1
				} else if rankMajor {
					tabPos[q] = 0
				}
			}
		}
	}
	if !rankMajor {
		slots := ranks * maxT
		outRow := format.rowBytes(h)
		nw := (ns + 3) / 4
		for l := 0; l < le; l++ {
			n := 0
			rng := device.HostSlice[uint64](own+oRecvRange+uintptr(8*l*ranks), ranks)
			for s := 0; s < ranks; s++ {
				begin := n
				for tok := 0; tok < int(tabT[s]); tok++ {
					for j := 0; j < k; j++ {
						q := (s*maxT+tok)*k + j
						if sids[q] != int32(l) {
							continue
						}
						to := l*slots + n
						from := s*maxT + tok
						tabPos[q] = int32(to)
						device.HostSlice[int32](own+oTabRow, slots*le)[to] = int32(from)
						device.HostSlice[int32](own+oRecvSrc, slots*le)[to] = int32(tok)
						copy(device.HostSlice[byte](own+oRecvX+uintptr(to*outRow), outRow),
							device.HostSlice[byte](own+oStageX+uintptr(from*row2), outRow))
						ss := device.HostSlice[float32](own+oStageS+uintptr(4*from*ns), ns)
						switch format {
						case FP8:
							copy(device.HostSlice[float32](own+oRecvS+uintptr(4*to*ns), ns), ss)
						case UE8M0:
							ws := device.HostSlice[uint32](own+oRecvS+uintptr(4*to*nw), nw)
							clear(ws)
							for gi, v := range ss {
								ws[gi/4] |= (math.Float32bits(v) >> 23 & 0xff) << (8 * uint(gi%4))
							}
						}
						n++
					}
				}
				rng[s] = uint64(uint32(begin)) | uint64(uint32(n-begin))<<32
			}
			device.HostSlice[int32](own+oRecvCount, le)[l] = int32(n)
		}
	}
	g.signal(DispFreedOffset, set, all(ranks))
	acc := devapi.U32(g.own() + CtrlInvalidAcc + uintptr(4*set))
	devapi.U32(g.own() + CtrlInvalidOut + uintptr(4*set)).Store(acc.Swap(0))
	epoch.Store(e)
	g.remoteFreed(DispFreedOffset, set)
	return nil
}

func (f Format) rowBytes(h int) int {
	if f.Quantized() {
		return h
	}
	return 2 * h
}

// all is every rank: counters are signalled to masked ranks too (without
// data), so that they stay in step and a mask can be cleared later.
func all(ranks int) uint32 { return uint32(1)<<uint(ranks) - 1 }

// combineTwin is goep_ll_combine (parameter order in launch.go).
func combineTwin(l *device.HostLaunch) error {
	a := l.Args
	off := func(i int) uintptr { return uintptr(a.GetU64(i)) }
	oTabPos, oTabW, oTabT, oOwnMask, oCStage := off(2), off(3), off(4), off(5), off(6)
	y, ys, yfp8, out := a.GetPtr(7), a.GetPtr(8), a.GetI32(9) != 0, a.GetPtr(10)
	t, k, ranks, rank := int(a.GetI32(11)), int(a.GetI32(12)), int(a.GetI32(13)), int(a.GetI32(14))
	maxT, h := int(a.GetI32(16)), int(a.GetI32(17))
	rankMajor, set, phases, elastic := a.GetI32(18) != 0, int(a.GetI32(19)), Phase(a.GetI32(20)), a.GetI32(21) != 0
	g := newLLGroup(a, ranks, rank, elastic, 23)
	oCSend := off(27)
	own := g.peers[rank]
	epoch := devapi.U64(g.own() + CtrlCombEpoch + uintptr(8*set))
	e := epoch.Load() + 1
	ns := h / FP8Block
	tabT := device.HostSlice[int32](own+oTabT, ranks)

	if phases&Send != 0 {
		if !g.waitRanks(CombFreedOffset, set, g.active(), (e-1)*ArrivalUnit, StageCombineFreed) {
			return nil
		}
		active := g.active()
		tabPos := device.HostSlice[int32](own+oTabPos, ranks*maxT*k)
		tabW := device.HostSlice[float32](own+oTabW, ranks*maxT*k)
		acc := make([]float32, h)
		for s := 0; s < ranks; s++ {
			if active>>uint(s)&1 == 0 {
				continue
			}
			for tok := 0; tok < int(tabT[s]); tok++ {
				i := s*maxT + tok
				local := false
				for j := 0; j < k; j++ {
					local = local || tabPos[i*k+j] >= 0
				}
				if !local {
					continue
				}
				dst := device.HostSlice[uint16](g.row(s, oCStage, oCSend, rank*maxT+tok, s*maxT+tok, 2*h), h)
				if rankMajor {
					copy(dst, device.HostSlice[uint16](y+uintptr(2*i*h), h))
					continue
				}
				clear(acc)
				for j := 0; j < k; j++ {
					p := int(tabPos[i*k+j])
					if p < 0 {
						continue
					}
					w := tabW[i*k+j]
					if yfp8 {
						q := device.HostSlice[uint8](y+uintptr(p*h), h)
						sc := device.HostSlice[float32](ys+uintptr(4*p*ns), ns)
						for x := range acc {
							acc[x] = addRN(acc[x], mulRN(w, mulRN(kernels.FP8E4M3ToFloat32(q[x]), sc[x/FP8Block])))
						}
					} else {
						for x, v := range device.HostSlice[uint16](y+uintptr(2*p*h), h) {
							acc[x] = addRN(acc[x], mulRN(w, kernels.BF16ToFloat32(v)))
						}
					}
				}
				for x, v := range acc {
					dst[x] = kernels.Float32ToBF16(v)
				}
			}
		}
		g.signal(CombArriveOffset, set, all(ranks))
		for s := 0; s < ranks; s++ {
			if g.remote()>>uint(s)&1 == 0 {
				continue
			}
			rows := 0
			if active>>uint(s)&1 != 0 {
				rows = int(tabT[s])
			}
			if !g.portRows(s, oCStage, oCSend, maxT, rows, 2*h) || !g.portAdd(s, CombArriveOffset, set) {
				return nil
			}
		}
	}
	if phases&Recv == 0 {
		return nil
	}
	if !g.waitRanks(CombArriveOffset, set, g.active(), e*ArrivalUnit, StageCombineArrival) {
		return nil
	}
	eff := g.effective()
	devapi.U32(g.own() + CtrlCombEff + uintptr(4*set)).Store(eff)
	devapi.U64(g.own() + CtrlCombGate + uintptr(8*set)).Store(e)
	ownMask := device.HostSlice[uint32](own+oOwnMask, maxT)
	o := device.HostSlice[uint16](out, t*h)
	acc := make([]float32, h)
	for tok := 0; tok < t; tok++ {
		clear(acc)
		dm := ownMask[tok] &^ eff
		for d := 0; d < ranks; d++ {
			if dm>>uint(d)&1 == 0 {
				continue
			}
			for x, v := range device.HostSlice[uint16](own+oCStage+uintptr(2*(d*maxT+tok)*h), h) {
				acc[x] = addRN(acc[x], kernels.BF16ToFloat32(v))
			}
		}
		for x, v := range acc {
			o[tok*h+x] = kernels.Float32ToBF16(v)
		}
	}
	g.signal(CombFreedOffset, set, all(ranks))
	epoch.Store(e)
	g.remoteFreed(CombFreedOffset, set)
	return nil
}

// setMaskTwin is goep_ll_set_mask(u32* mask, u32 value, int op).
func setMaskTwin(l *device.HostLaunch) error {
	a := l.Args
	m := devapi.U32(a.GetPtr(0))
	v := a.GetU32(1)
	switch a.GetI32(2) {
	case 0:
		m.Store(v)
	case 1:
		m.Store(m.Load() | v)
	default:
		m.Store(m.Load() &^ v)
	}
	return nil
}
