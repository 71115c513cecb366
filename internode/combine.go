package internode

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/kernels"
)

// Combine's data path on the host backend (DESIGN.md, "Combine"): the Go
// twin of the combine kernel (kernels/internode.cu, launched instead where
// kernels run: kernel.go), the reverse of Dispatch, on memory
// NewNotify allocates next to dispatch's when NotifyConfig.MaxTokens > 0.
//
// Memory added after dispatch's (M = MaxTokens, partial rows padded to 16
// bytes: x BF16 [H] or fp32 [H], then weights fp32 [K]):
//
//	RDMA buffer:
//	  combine counters [N]   counter n: combine rounds landed from node n
//	  partials [N][M] rows   node n, slot: partial of the token with that
//	                         relay slot at forwarder (n, i)
//	send memory (after dispatch's send rows):
//	  send [N][M] rows       the partials packed per source node
//	NVLink workspace:
//	  combine ready counter  this rank's expert outputs are in place
//	  (the outputs themselves overwrite its receive region: y BF16 [H],
//	  weights fp32 [K] per received row, in receive order)
//
// Combine round c of rank s = (a, i):
//  1. write its expert outputs into its receive region and release-add
//     its combine ready counter;
//  2. as forwarder: wait for every local rank's ready counter; for each
//     source node n and relay slot j (the rows of source (n, i) that
//     dispatch left in relay[n]), sum from +0 in fp32 the outputs of the
//     target local ranks l in ascending l, each read at base_l[source] +
//     slot_l (both left by dispatch); for n = a write the fp32 partial
//     into its own partials[a][j] and add to its own counter a; else pack
//     it (BF16 RNE or fp32) into send[n][j], put the slots into source
//     (n, i)'s partials[a] and add 1 to its combine counter a, on the
//     same port channel;
//  3. as source: wait for every combine counter, then per token sum the
//     partials of the nodes it went to in ascending node from +0, add
//     bias0, bias1, round to BF16 once (weights: fp32 sums).
//
// One copy of every region suffices for the reason dispatch gives: the
// next notify round orders a round's combine before the next round's
// writes. The relay rows, bases and receive region dispatch left stay
// untouched until the next dispatch, which comes after that notify.

// Stages of combine's waits (TimeoutError.Stage).
const (
	stageCombineReady = 60 + iota
	stageCombineNet
	stageCombinePut
)

// Combine sums the expert outputs of this round's dispatch back into this
// rank's tokens: collective over every rank, once per round, after
// Dispatch. in.Y holds BF16 [Received*Hidden] in Dispatch's output order,
// in.Weights fp32 [Received*TopK] on every rank or on none (a rank that
// received nothing passes an empty, non-nil slice when the others pass
// weights), Bias0 and Bias1 BF16 [Tokens*Hidden] or nil. Every rank passes
// the same opt. The result is ReferenceCombine's for this rank, bit for
// bit (Traffic is left zero). A wait that gives up returns the
// communicator's *channels.TimeoutError naming the peer, and the Notify
// refuses further calls.
func (nt *Notify) Combine(in CombineInput, opt CombineOptions) (*CombineOutput, error) {
	if nt == nil {
		return nil, fmt.Errorf("internode: combine: nil notify")
	}
	if nt.err != nil {
		return nil, nt.err
	}
	s := nt.shape
	fail := func(format string, a ...any) error {
		return nt.withPeerNode(fmt.Errorf("internode: rank %d: combine after notify round %d: "+format, append([]any{nt.rank, nt.round}, a...)...))
	}
	if nt.cfg.MaxTokens == 0 {
		return nil, fail("no combine buffers: set NotifyConfig.MaxTokens")
	}
	if nt.last == nil || !nt.dispatched || nt.combined {
		return nil, fail("run a notify round and its dispatch first (one combine per round)")
	}
	if opt.Partial != PartialBF16 && opt.Partial != PartialFP32 {
		return nil, fail("partial format %d", opt.Partial)
	}
	h, k := s.Hidden, s.TopK
	n, tokens := nt.last.Received, len(nt.lastIDs)/k
	if len(in.Y) != n*h {
		return nil, fail("%d output values for %d received rows of hidden %d", len(in.Y), n, h)
	}
	if in.Weights != nil && len(in.Weights) != n*k {
		return nil, fail("%d weights for %d received rows of top-k %d", len(in.Weights), n, k)
	}
	for _, b := range [][]uint16{in.Bias0, in.Bias1} {
		if b != nil && len(b) != tokens*h {
			return nil, fail("bias of %d values for %d tokens of hidden %d", len(b), tokens, h)
		}
	}
	if err := nt.comm.Check(); err != nil {
		nt.err = fail("%w", err)
		return nil, nt.err
	}
	nt.combined = true
	nt.combRound++
	var out *CombineOutput
	var ok bool
	var bad error
	if nt.kern != nil {
		var err error
		if out, ok, bad, err = nt.combineKernel(in, opt, tokens); err != nil {
			nt.err = fail("%w", err)
			return nil, nt.err
		}
	} else {
		out, ok, bad = nt.combineTwin(in, opt, tokens, nt.combRound)
	}
	if err := nt.twinFailed(fail, ok, bad); err != nil {
		return nil, err
	}
	return out, nil
}

// combineTwin is the kernel's work for combine round c; ok false when a
// wait gave up (the watchdog holds the record), bad for a relayed row
// whose place lies outside a receive region (the kernel would trap).
func (nt *Notify) combineTwin(in CombineInput, opt CombineOptions, tokens int, c uint64) (out *CombineOutput, ok bool, bad error) {
	s, dl, res := nt.shape, nt.dl, nt.last
	w, p, nodes, k, h := s.World(), s.RanksPerNode, s.Nodes, s.TopK, s.Hidden
	a, i := s.Node(nt.rank), s.Local(nt.rank)
	wd := nt.comm.Watchdog()
	rdma, nvl := nt.rdma.Ptr, nt.nvl.Ptr
	le32 := binary.LittleEndian
	weights := in.Weights != nil
	// Partial rows: x fp32 for the own node (never rounded) and under
	// PartialFP32, BF16 otherwise, then weights fp32; the stride follows
	// so that a put moves no padding beyond 16 bytes a row.
	xBytes := func(n int) int {
		if n == a || opt.Partial == PartialFP32 {
			return 4 * h
		}
		return 2 * h
	}
	stride := func(n int) int { return int(align16(int64(xBytes(n) + 4*k))) }

	// 1. Expert outputs into the receive region.
	for r := 0; r < res.Received; r++ {
		rr := devapi.Bytes(nvl+uintptr(dl.recv+r*dl.recvRow), uint64(2*h+4*k))
		putU16s(rr, in.Y[r*h:(r+1)*h])
		if weights {
			for j := 0; j < k; j++ {
				le32.PutUint32(rr[2*h+4*j:], math.Float32bits(in.Weights[r*k+j]))
			}
		}
	}
	devapi.U64(nvl + uintptr(dl.combReady)).Add(1)

	// 2. Forward: reduce each relayed token over its target local ranks.
	for l := 0; l < p; l++ {
		if !devapi.WaitGE64(nt.peerNVL[l]+uintptr(dl.combReady), c, wd, nt.combReady[l], uint32(s.Rank(a, l)), stageCombineReady) {
			return nil, false, nil
		}
	}
	capacity := int64(w) * int64(dl.maxTokens)
	xs := make([]float32, h)
	ws := make([]float32, k)
	for src := 0; src < nodes; src++ {
		srcRank := s.Rank(src, i)
		cnt := int(res.Relay[src])
		if cnt < 0 || cnt > dl.maxTokens {
			return nil, false, fmt.Errorf("%d tokens relayed from rank %d, the relay region holds %d", cnt, srcRank, dl.maxTokens)
		}
		// The partials' memory: the send memory, or for the own node the
		// RDMA buffer's partials[a] (no put).
		base, region := dl.sendBase, dl.combSend+src*dl.maxTokens*dl.partialRow
		if src == a {
			base, region = rdma, dl.combRecv+a*dl.maxTokens*dl.partialRow
		}
		for j := 0; j < cnt; j++ {
			row := devapi.Bytes(rdma+uintptr(dl.relay+(src*dl.maxTokens+j)*dl.relayRow), uint64(dl.relayRow))
			clear(xs)
			clear(ws)
			o := nt.dispXBytes + 12*k // source token, mask, slots
			mask := le32.Uint32(row[o+4:])
			for l := 0; l < p; l++ {
				if mask>>l&1 == 0 {
					continue
				}
				slot := int32(le32.Uint32(row[o+8+4*l:]))
				base := int32(le32.Uint32(devapi.Bytes(nt.peerNVL[l]+uintptr(dl.bases+4*srcRank), 4)))
				if pos := int64(base) + int64(slot); slot < 0 || base < 0 || pos >= capacity {
					return nil, false, fmt.Errorf("relayed token of rank %d lies at row %d+%d of rank %d, outside its %d rows",
						srcRank, base, slot, s.Rank(a, l), capacity)
				}
				rr := devapi.Bytes(nt.peerNVL[l]+uintptr(dl.recv+int(base+slot)*dl.recvRow), uint64(2*h+4*k))
				for jj := 0; jj < h; jj++ {
					xs[jj] += kernels.BF16ToFloat32(le32.Uint16(rr[2*jj:]))
				}
				if weights {
					for jj := 0; jj < k; jj++ {
						ws[jj] += math.Float32frombits(le32.Uint32(rr[2*h+4*jj:]))
					}
				}
			}
			pr := devapi.Bytes(base+uintptr(region+j*stride(src)), uint64(stride(src)))
			if xBytes(src) == 4*h {
				for jj, v := range xs {
					le32.PutUint32(pr[4*jj:], math.Float32bits(v))
				}
			} else {
				for jj, v := range xs {
					le32.PutUint16(pr[2*jj:], kernels.Float32ToBF16(v))
				}
			}
			for jj, v := range ws {
				le32.PutUint32(pr[xBytes(src)+4*jj:], math.Float32bits(v))
			}
		}
		if src == a {
			devapi.U64(rdma + uintptr(dl.combCounters+8*a)).Add(1)
			continue
		}
		ch := nt.port[src]
		if cnt > 0 && !devapi.PortPutIDs(ch, ch.Dst, uint64(dl.combRecv+a*dl.maxTokens*dl.partialRow), dl.sendID,
			uint64(region), uint64(cnt*stride(src)), 0, stageCombinePut) {
			return nil, false, nil
		}
		if !devapi.PortAtomicAdd(ch, ch.Dst, uint64(dl.combCounters+8*a), 1, stageCombinePut) {
			return nil, false, nil
		}
	}

	// 3. Reduce the partials of every node in ascending node.
	for n := 0; n < nodes; n++ {
		if !devapi.WaitGE64(rdma+uintptr(dl.combCounters+8*n), c, wd, nt.combNetWait[n], uint32(s.Rank(n, i)), stageCombineNet) {
			return nil, false, nil
		}
	}
	out = &CombineOutput{}
	out.X = make([]uint16, tokens*h)
	if weights {
		out.Weights = make([]float32, tokens*k)
	}
	slotOf := make([]int, nodes)
	for t := 0; t < tokens; t++ {
		clear(xs)
		for n := 0; n < nodes; n++ {
			hit := false
			for _, e := range nt.lastIDs[t*k : (t+1)*k] {
				if r := s.rankOf(e); r >= 0 && s.Node(r) == n {
					hit = true
				}
			}
			if !hit {
				continue
			}
			j := slotOf[n]
			slotOf[n]++
			if j >= dl.maxTokens {
				return nil, false, fmt.Errorf("token %d is number %d to node %d, the partial region holds %d", t, j, n, dl.maxTokens)
			}
			pr := devapi.Bytes(rdma+uintptr(dl.combRecv+n*dl.maxTokens*dl.partialRow+j*stride(n)), uint64(stride(n)))
			if xBytes(n) == 4*h {
				for jj := range xs {
					xs[jj] += math.Float32frombits(le32.Uint32(pr[4*jj:]))
				}
			} else {
				for jj := range xs {
					xs[jj] += kernels.BF16ToFloat32(le32.Uint16(pr[2*jj:]))
				}
			}
			if weights {
				for jj := 0; jj < k; jj++ {
					out.Weights[t*k+jj] += math.Float32frombits(le32.Uint32(pr[xBytes(n)+4*jj:]))
				}
			}
		}
		for jj, v := range xs {
			if b := in.Bias0; b != nil {
				v += kernels.BF16ToFloat32(b[t*h+jj])
			}
			if b := in.Bias1; b != nil {
				v += kernels.BF16ToFloat32(b[t*h+jj])
			}
			out.X[t*h+jj] = kernels.Float32ToBF16(v)
		}
	}
	return out, true, nil
}
