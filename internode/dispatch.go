package internode

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goep-dev/goep/channels/devapi"
)

// Dispatch's data path on the host backend (DESIGN.md, "Dispatch"): the Go
// twin of the dispatch kernel (kernels/internode.cu, launched instead where
// kernels run: kernel.go), on the memory NewNotify allocates
// when NotifyConfig.MaxTokens > 0, following a notify round whose counts
// it uses.
//
// Memory added after notify's (M = MaxTokens, rows padded to 16 bytes):
//
//	RDMA buffer:
//	  dispatch counters [N]  counter a: dispatch rounds landed from node a
//	  relay [N][M] rows      source node a, slot: rows of source (a, i)
//	send memory (an allocation of its own, NotifyConfig.SendMemory: device
//	memory, or pinned host memory):
//	  send  [N][M] rows      the rows packed per destination node, the
//	                         source of the puts
//	  relay row: x (BF16 2H, or FP8 H + scales 4H/128), top-k ids int64
//	  [K], weights float32 [K], source token int32, target mask uint32,
//	  per target local rank its slot at that receiver int32 [P]
//	NVLink workspace:
//	  dispatch counters [P]  counter f: dispatch rounds from forwarder f
//	  ready counter          this rank's receive bases are published
//	  bases [W] int32        first row of each source rank here
//	  recv [W*M] rows        x, local top-k ids int64 [K], weights [K],
//	                         source rank, source token (int32 each)
//
// Dispatch round d of rank s = (a, i):
//  1. publish its receive bases (RankPrefix shifted by one) and
//     release-add its ready counter;
//  2. as source: per destination node n, pack its tokens for n in token
//     order (slot = prefix over its tokens to n) with the per-target slots
//     (index among its tokens to that rank), then put them into forwarder
//     (n, i)'s relay[a] and add 1 to its dispatch counter a, on the same
//     port channel (n != a); for n = a it packs straight into its own
//     relay[a] (the forwarder is itself) and adds to its own counter;
//  3. as forwarder: wait for every dispatch counter and every local rank's
//     ready counter, then copy each relayed row to each target local rank
//     l at base_l[source] + slot, ids remapped to l's experts (-1
//     elsewhere, weight 0), and release-add 1 to l's counter i;
//  4. as receiver: wait for every forwarder's counter and read its rows.
//
// One copy of every region suffices: the notify round between two
// dispatch rounds orders them. A rank rewrites a peer's relay or receive
// rows in dispatch d+1 only after its notify round d+1 has passed its
// waits, which need that peer's notify writes of round d+1, which the
// peer issues only after returning from dispatch d (done reading). The
// same holds for the staging and the published bases.

type dispatchLayout struct {
	maxTokens, relayRow, recvRow int
	// offsets in the RDMA buffer
	netCounters, relay int
	// offsets in the send memory (the puts' source: NewNotify's sendMem)
	send int
	// offsets in the NVLink workspace
	nvlCounters, ready, bases, recv int
	// combine (combine.go): partial rows fp32 x [H] + weights [K], padded;
	// counters and regions in the RDMA buffer, a ready counter in the
	// NVLink workspace (combine input lives in the receive region).
	partialRow             int
	combCounters, combRecv int // RDMA buffer
	combSend               int // send memory
	combReady              int
	// Step completion counters (the kernels only: a dispatch with no
	// notify round before it waits on them, devptr.go's cached dispatch):
	// doneNet[n] in the RDMA buffer counts the dispatch and combine
	// kernels finished by forwarder (n, own local index), added over the
	// port channel; doneNVL[l] in the NVLink workspace those of local rank
	// l, added over NVLink.
	doneNet, doneNVL int
	// unitWords in the RDMA buffer: u64 [Nodes][maxBlocks], dispatch's
	// landed units when forwarding by block (ForwardBlocks; internode.cu's
	// goep_inn_unit_word), then u32 [Nodes][maxBlocks], the rows of each
	// that this rank's forwarder blocks claimed, and u32 [Nodes][maxBlocks/32],
	// a bit per unit whose rows are all claimed; 0 between rounds.
	unitWords int
	// combUnitWords in the RDMA buffer: the combine's landed units of
	// partials when reducing by units (ReduceUnits; internode.cu's
	// goep_inn_comb_plan): u64 [Nodes][maxCombUnits] words, u32
	// [Nodes][maxCombUnits] claims, u32 [Nodes][maxCombUnits/32] done bits;
	// 0 between rounds.
	combUnitWords                  int
	rdmaBytes, nvlBytes, sendBytes int
	// The send memory's base, where kernels and twins write the rows, and
	// its id in the Notify's proxy (the puts' source id): set by NewNotify
	// once the memory is allocated (0 without network peers).
	sendBase uintptr
	sendID   uint32
}

func align16(n int64) int64 { return (n + 15) &^ 15 }

func newDispatchLayout(s Shape, m int) (dispatchLayout, error) {
	dl := dispatchLayout{maxTokens: m, rdmaBytes: s.rdmaBytes(), nvlBytes: s.nvlBytes()}
	if m == 0 {
		return dl, nil
	}
	h, k, p, n, w := int64(s.Hidden), int64(s.TopK), int64(s.RanksPerNode), int64(s.Nodes), int64(s.World())
	// BF16 rows are the larger (2H >= H + 4H/128), so they size both.
	relayRow := align16(2*h + 12*k + 8 + 4*p)
	recvRow := align16(2*h + 12*k + 8)
	mt := int64(m)
	const limit = 1 << 40 // every term below is at most ~2^6 * 2^30 * row: checked in int64
	if relayRow > limit/(2*n*mt) || recvRow > limit/(w*mt) {
		return dl, fmt.Errorf("dispatch buffers for %d tokens of %d x %d bytes: too large", m, relayRow, recvRow)
	}
	r := align16(int64(s.rdmaBytes()))
	netCounters := r
	relay := align16(r + 8*n)
	partialRow := align16(4*h + 4*k)
	if partialRow > limit/(2*n*mt) {
		return dl, fmt.Errorf("combine buffers for %d tokens of %d bytes: too large", m, partialRow)
	}
	combCounters := relay + n*mt*relayRow
	combRecv := align16(combCounters + 8*n)
	doneNet := combRecv + n*mt*partialRow
	unitWords := align16(doneNet + 8*n)
	combUnitWords := align16(unitWords + 12*n*maxBlocks + 4*n*(maxBlocks/32))
	rdmaBytes := combUnitWords + 12*n*maxCombUnits + 4*n*(maxCombUnits/32)
	// The send memory: dispatch's rows, then combine's partials.
	send := int64(0)
	combSend := send + n*mt*relayRow
	sendBytes := combSend + n*mt*partialRow
	v := align16(int64(s.nvlBytes()))
	nvlCounters := v
	ready := v + 8*p
	bases := ready + 8
	recv := align16(bases + 4*w)
	combReady := recv + w*mt*recvRow
	doneNVL := combReady + 8
	nvlBytes := doneNVL + 8*p
	if rdmaBytes > math.MaxInt || nvlBytes > math.MaxInt || sendBytes > math.MaxInt {
		return dl, fmt.Errorf("dispatch buffers of %d, %d and %d bytes do not fit an int", rdmaBytes, nvlBytes, sendBytes)
	}
	dl.sendBytes = int(sendBytes)
	dl.relayRow, dl.recvRow = int(relayRow), int(recvRow)
	dl.netCounters, dl.relay, dl.send, dl.rdmaBytes = int(netCounters), int(relay), int(send), int(rdmaBytes)
	dl.nvlCounters, dl.ready, dl.bases, dl.recv, dl.nvlBytes = int(nvlCounters), int(ready), int(bases), int(recv), int(nvlBytes)
	dl.partialRow, dl.combCounters, dl.combRecv, dl.combSend, dl.combReady = int(partialRow), int(combCounters), int(combRecv), int(combSend), int(combReady)
	dl.doneNet, dl.doneNVL, dl.unitWords, dl.combUnitWords = int(doneNet), int(doneNVL), int(unitWords), int(combUnitWords)
	return dl, nil
}

// Stages of dispatch's waits (TimeoutError.Stage).
const (
	stageDispatchNet = 50 + iota
	stageDispatchReady
	stageDispatchNVL
	stageDispatchPut
	stageDispatchDone // a cached dispatch's wait for its peers' earlier steps (kernels only)
)

// Dispatch moves this rank's rows for the last notify round (Run's ids
// must be in.TopK): collective over every rank, once per notify round,
// which must have been set up with NotifyConfig.MaxTokens >= the tokens
// of every rank. Every rank passes BF16 (in.X) or every rank FP8 (XFP8 and
// Scales), and weights on every rank or on none (a rank with no tokens
// passes empty, non-nil slices of the format the others use: XFP8 and
// Scales for FP8, Weights when the others pass weights). A call refused
// for its arguments moves nothing and leaves the Notify usable, but the
// peers, which went ahead, wait until the watchdog gives up.
//
// The result is the reference's RankOutput (ReferenceDispatch) for this
// rank: rows in its order, ids remapped to local experts, weights, sources,
// RankPrefix, NodePrefix, TokensPerLocalExpert and, as a forwarder,
// Relayed; Traffic is left zero (the reference's figures are counts, not
// something this data path measures). A wait that gives up returns the
// communicator's *channels.TimeoutError naming the peer, and the Notify
// refuses further calls.
func (nt *Notify) Dispatch(in RankInput) (*RankOutput, error) {
	if nt == nil {
		return nil, fmt.Errorf("internode: dispatch: nil notify")
	}
	if nt.err != nil {
		return nil, nt.err
	}
	s := nt.shape
	fail := func(format string, a ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: dispatch after notify round %d: "+format, append([]any{nt.rank, nt.round}, a...)...))
	}
	if nt.cfg.MaxTokens == 0 {
		return nil, fail("no dispatch buffers: set NotifyConfig.MaxTokens")
	}
	if nt.last == nil || nt.dispatched {
		return nil, fail("run a notify round first (one dispatch per round)")
	}
	fp8 := in.XFP8 != nil
	tokens, err := checkInput(s, nt.rank, in, fp8)
	if err != nil {
		return nil, fail("%w", err)
	}
	if tokens > nt.cfg.MaxTokens {
		return nil, fail("%d tokens, more than the %d the buffers hold", tokens, nt.cfg.MaxTokens)
	}
	if len(in.TopK) != len(nt.lastIDs) {
		return nil, fail("%d top-k ids, the notify round had %d", len(in.TopK), len(nt.lastIDs))
	}
	for j, x := range in.TopK {
		if x != nt.lastIDs[j] {
			return nil, fail("top-k id %d is %d, the notify round had %d", j, x, nt.lastIDs[j])
		}
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nil, nt.err
	}
	nt.dispatched = true
	nt.dispRound++
	var out *RankOutput
	var ok bool
	var bad error
	if nt.kern != nil {
		var err error
		if out, ok, bad, err = nt.dispatchKernel(in, tokens, fp8); err != nil {
			nt.err = fail("%w", err)
			return nil, nt.err
		}
	} else {
		out, ok, bad = nt.dispatchTwin(in, tokens, fp8, nt.dispRound)
	}
	if err := nt.twinFailed(fail, ok, bad); err != nil {
		return nil, err
	}
	return out, nil
}

// dispatchTwin is the kernel's work for dispatch round d; ok false when a
// wait gave up (the watchdog holds the record), bad for a relayed row
// whose place lies outside the receive region (the kernel would trap).
func (nt *Notify) dispatchTwin(in RankInput, tokens int, fp8 bool, d uint64) (out *RankOutput, ok bool, bad error) {
	s, dl, res := nt.shape, nt.dl, nt.last
	w, p, nodes, le, k, h := s.World(), s.RanksPerNode, s.Nodes, s.LocalExperts(), s.TopK, s.Hidden
	a, i := s.Node(nt.rank), s.Local(nt.rank)
	wd := nt.comm.Watchdog()
	rdma, nvl := nt.rdma.Ptr, nt.nvl.Ptr
	xBytes := 2 * h
	if fp8 {
		xBytes = h + 4*(h/FP8Block)
	}
	le32 := binary.LittleEndian
	nt.dispXBytes = xBytes // combine finds the relay rows' metadata after x

	// 1. Publish the receive bases.
	bases := devapi.Bytes(nvl+uintptr(dl.bases), uint64(4*w))
	for r := 0; r < w; r++ {
		var b int32
		if r > 0 {
			b = res.RankPrefix[r-1]
		}
		le32.PutUint32(bases[4*r:], uint32(b))
	}
	devapi.U64(nvl + uintptr(dl.ready)).Add(1)

	// 2. Pack and send, one chunk per destination node.
	slotOf := make([]int32, w) // next slot per target rank
	for n := 0; n < nodes; n++ {
		region := dl.sendBase + uintptr(dl.send+n*dl.maxTokens*dl.relayRow)
		if n == a {
			region = rdma + uintptr(dl.relay+a*dl.maxTokens*dl.relayRow)
		}
		cnt := 0
		for t := 0; t < tokens; t++ {
			var mask uint32
			for _, e := range in.TopK[t*k : (t+1)*k] {
				if r := s.rankOf(e); r >= 0 && s.Node(r) == n {
					mask |= 1 << s.Local(r)
				}
			}
			if mask == 0 {
				continue
			}
			row := devapi.Bytes(region+uintptr(cnt*dl.relayRow), uint64(dl.relayRow))
			cnt++
			o := 0
			if fp8 {
				copy(row, in.XFP8[t*h:(t+1)*h])
				o = h
				for _, sc := range in.Scales[t*h/FP8Block : (t+1)*h/FP8Block] {
					le32.PutUint32(row[o:], math.Float32bits(sc))
					o += 4
				}
			} else {
				for _, x := range in.X[t*h : (t+1)*h] {
					le32.PutUint16(row[o:], x)
					o += 2
				}
			}
			o = xBytes
			for j, e := range in.TopK[t*k : (t+1)*k] {
				le32.PutUint64(row[o+8*j:], uint64(e))
				var wt float32
				if in.Weights != nil {
					wt = in.Weights[t*k+j]
				}
				le32.PutUint32(row[o+8*k+4*j:], math.Float32bits(wt))
			}
			o += 12 * k
			le32.PutUint32(row[o:], uint32(t))
			le32.PutUint32(row[o+4:], mask)
			for l := 0; l < p; l++ {
				var slot int32 = -1
				if mask>>l&1 != 0 {
					r := s.Rank(n, l)
					slot = slotOf[r]
					slotOf[r]++
				}
				le32.PutUint32(row[o+8+4*l:], uint32(slot))
			}
		}
		if n == a {
			devapi.U64(rdma + uintptr(dl.netCounters+8*a)).Add(1)
			continue
		}
		ch := nt.port[n]
		if cnt > 0 && !devapi.PortPutIDs(ch, ch.Dst, uint64(dl.relay+a*dl.maxTokens*dl.relayRow), dl.sendID,
			uint64(dl.send+n*dl.maxTokens*dl.relayRow), uint64(cnt*dl.relayRow), 0, stageDispatchPut) {
			return nil, false, nil
		}
		if !devapi.PortAtomicAdd(ch, ch.Dst, uint64(dl.netCounters+8*a), 1, stageDispatchPut) {
			return nil, false, nil
		}
	}

	// 3. Forward: every source node's rows landed, every local rank's
	// bases published; place each row at its targets.
	for src := 0; src < nodes; src++ {
		if !devapi.WaitGE64(rdma+uintptr(dl.netCounters+8*src), d, wd, nt.dispNetWait[src], uint32(s.Rank(src, i)), stageDispatchNet) {
			return nil, false, nil
		}
	}
	for l := 0; l < p; l++ {
		if !devapi.WaitGE64(nt.peerNVL[l]+uintptr(dl.ready), d, wd, nt.readyWait[l], uint32(s.Rank(a, l)), stageDispatchReady) {
			return nil, false, nil
		}
	}
	out = &RankOutput{}
	capacity := int64(w) * int64(dl.maxTokens)
	for src := 0; src < nodes; src++ {
		srcRank := s.Rank(src, i)
		if res.Relay[src] < 0 || int(res.Relay[src]) > dl.maxTokens {
			return nil, false, fmt.Errorf("%d tokens relayed from rank %d, the relay region holds %d", res.Relay[src], srcRank, dl.maxTokens)
		}
		for j := 0; j < int(res.Relay[src]); j++ {
			row := devapi.Bytes(rdma+uintptr(dl.relay+(src*dl.maxTokens+j)*dl.relayRow), uint64(dl.relayRow))
			o := xBytes + 12*k
			tok := le32.Uint32(row[o:])
			mask := le32.Uint32(row[o+4:])
			out.Relayed = append(out.Relayed, Relay{SrcRank: int32(srcRank), SrcToken: int32(tok), Targets: uint8(mask)})
			for l := 0; l < p; l++ {
				if mask>>l&1 == 0 {
					continue
				}
				dst := s.Rank(a, l)
				slot := int32(le32.Uint32(row[o+8+4*l:]))
				base := int32(le32.Uint32(devapi.Bytes(nt.peerNVL[l]+uintptr(dl.bases+4*srcRank), 4)))
				if pos := int64(base) + int64(slot); slot < 0 || base < 0 || pos >= capacity {
					return nil, false, fmt.Errorf("relayed token %d of rank %d goes to row %d+%d of rank %d, outside its %d rows",
						tok, srcRank, base, slot, dst, capacity)
				}
				rr := devapi.Bytes(nt.peerNVL[l]+uintptr(dl.recv+int(base+slot)*dl.recvRow), uint64(dl.recvRow))
				copy(rr[:xBytes], row[:xBytes])
				for jj := 0; jj < k; jj++ {
					e := int64(le32.Uint64(row[xBytes+8*jj:]))
					local, wt := int64(-1), uint32(0)
					if s.rankOf(e) == dst {
						local = e - int64(dst*le)
						wt = le32.Uint32(row[xBytes+8*k+4*jj:])
					}
					le32.PutUint64(rr[xBytes+8*jj:], uint64(local))
					le32.PutUint32(rr[xBytes+8*k+4*jj:], wt)
				}
				le32.PutUint32(rr[xBytes+12*k:], uint32(srcRank))
				le32.PutUint32(rr[xBytes+12*k+4:], tok)
			}
		}
	}
	for l := 0; l < p; l++ {
		devapi.U64(nt.peerNVL[l] + uintptr(dl.nvlCounters+8*i)).Add(1)
	}

	// 4. Receive: every forwarder of this node has placed its rows.
	for f := 0; f < p; f++ {
		if !devapi.WaitGE64(nvl+uintptr(dl.nvlCounters+8*f), d, wd, nt.dispNVLWait[f], uint32(s.Rank(a, f)), stageDispatchNVL) {
			return nil, false, nil
		}
	}
	rows := devapi.Bytes(nvl+uintptr(dl.recv), uint64(res.Received*dl.recvRow))
	nt.readRecv(out, rows, in.Weights != nil, fp8, xBytes)
	return out, true, nil
}

// readRecv fills out's rows, sources, prefixes and per-expert counts from
// this rank's receive rows (a copy of the region on a GPU, the region
// itself on the host backend) after a dispatch round.
func (nt *Notify) readRecv(out *RankOutput, rows []byte, weights, fp8 bool, xBytes int) {
	s, dl, res := nt.shape, nt.dl, nt.last
	k, h := s.TopK, s.Hidden
	le32 := binary.LittleEndian
	n := res.Received
	out.RankPrefix = append([]int32(nil), res.RankPrefix...)
	out.NodePrefix = append([]int32(nil), res.NodePrefix...)
	out.TokensPerLocalExpert = append([]int(nil), res.TokensPerLocalExpert...)
	out.RecvSrcRank = make([]int32, n)
	out.RecvSrcToken = make([]int32, n)
	out.RecvTopK = make([]int64, n*k)
	if weights {
		out.RecvWeights = make([]float32, n*k)
	}
	if fp8 {
		out.RecvXFP8 = make([]uint8, n*h)
		out.RecvScales = make([]float32, n*h/FP8Block)
	} else {
		out.RecvX = make([]uint16, n*h)
	}
	for r := 0; r < n; r++ {
		rr := rows[r*dl.recvRow : (r+1)*dl.recvRow]
		if fp8 {
			copy(out.RecvXFP8[r*h:], rr[:h])
			for j := 0; j < h/FP8Block; j++ {
				out.RecvScales[r*h/FP8Block+j] = math.Float32frombits(le32.Uint32(rr[h+4*j:]))
			}
		} else {
			getU16s(out.RecvX[r*h:(r+1)*h], rr)
		}
		for j := 0; j < k; j++ {
			out.RecvTopK[r*k+j] = int64(le32.Uint64(rr[xBytes+8*j:]))
			if out.RecvWeights != nil {
				out.RecvWeights[r*k+j] = math.Float32frombits(le32.Uint32(rr[xBytes+8*k+4*j:]))
			}
		}
		out.RecvSrcRank[r] = int32(le32.Uint32(rr[xBytes+12*k:]))
		out.RecvSrcToken[r] = int32(le32.Uint32(rr[xBytes+12*k+4:]))
	}
}
