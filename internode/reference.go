package internode

import (
	"fmt"
	"sort"

	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/kernels"
)

// The plain-Go semantics of internode high-throughput dispatch and combine
// (DeepEP V1's internode mode, our way), with the route spelled out hop by
// hop so that the GPU protocol's intermediate buffers are pinned down too,
// not just its results. Loops over whole arrays; no channels, rings or SMs.
//
// Route. A token of source rank s = (node a, local i) goes, for every node n
// holding at least one of its experts, once to the forwarder (n, i), the
// rank of n with s's local index (s itself when n = a): the network hop,
// which crosses between nodes only when n != a. The forwarder sends it over
// NVLink to each local rank of n that holds one of its experts (possibly
// itself). Combine runs the route backwards.

// RankInput is one source rank's dispatch input, the intranode format: X
// BF16 bits [T*Hidden], or XFP8 [T*Hidden] with Scales [T*Hidden/128];
// TopK int64 [T*TopK] (-1: no expert; ids outside [-1, E) are ignored like
// -1, as the kernels do, and counted in Layout.Invalid); Weights [T*TopK]
// optional.
type RankInput = intranode.RankInput

// CombineInput is one receiving rank's combine input, the intranode format:
// Y BF16 [N*Hidden] in that rank's receive order, optional Weights
// [N*TopK], optional biases [T*Hidden] for the owner's tokens.
type CombineInput = intranode.CombineInput

// Hop counts rows moved over one kind of link and their payload bytes.
type Hop struct {
	Tokens int
	Bytes  int64
}

// Traffic is one rank's share of a dispatch or combine, per kind of link.
// Payload only (rows and FP8 scales); top-k ids, weights and source
// metadata are not counted, as in DeepEP's figures.
//
// Dispatch: NetworkSend counts (token, node) pairs this rank sends to other
// nodes; NetworkRecv those it receives as a forwarder; NVLinkSend rows this
// forwarder sends to other ranks of its node; NVLinkRecv rows this rank
// receives from another rank's forwarding. Combine: NVLinkSend rows an
// expert rank sends to a forwarder of its node other than itself;
// NVLinkRecv what a forwarder receives so; NetworkSend node partials a
// forwarder sends to other nodes; NetworkRecv those a source rank receives.
//
// RDMASend and NVLRecv are DeepEP's own figures (test_internode.py), which
// count traffic a rank has with itself too: RDMASend every (token,
// destination node) pair, own node included (DeepEP passes those through
// its RDMA buffer as well); NVLRecv every row received (dispatch) or
// reduced by a forwarder (combine), its own included.
type Traffic struct {
	NetworkSend, NetworkRecv Hop
	NVLinkSend, NVLinkRecv   Hop
	RDMASend, NVLRecv        Hop
}

// Relay is one entry of a forwarder's network receive buffer: a token of
// SrcRank (same local index, node a) and the local ranks of this node that
// hold its experts (bit l: local rank l), DeepEP's SourceMeta.
type Relay struct {
	SrcRank, SrcToken int32
	Targets           uint8
}

// RankOutput is what one rank receives in dispatch. The embedded intranode
// output holds the rows: RecvX (or RecvXFP8 and RecvScales), RecvTopK
// (local expert ids, -1 for experts elsewhere, invalid ids and -1),
// RecvWeights (0 where RecvTopK is -1), RecvSrcRank, RecvSrcToken,
// RankPrefix[r] (rows from source ranks 0..r) and TokensPerLocalExpert
// (rounded up to the alignment).
//
// Order: by source node, then forwarding rank, then source rank, then
// token. The forwarding rank of a source's tokens is the one with the
// source's local index, and each node has one source per local index, so
// this is the order by source rank, then token: intranode's order, and
// DeepEP's (its receivers place rows by a global source-rank prefix sum).
type RankOutput struct {
	intranode.RankOutput
	// NodePrefix[n] is the rows received from source nodes 0..n.
	NodePrefix []int32
	// Relayed is this rank's network receive buffer as a forwarder: the
	// tokens of rank (a, own local index) of every node a that have an
	// expert on this node, ordered by source node, then token.
	Relayed []Relay
	Traffic Traffic
}

// DispatchRowBytes is the payload of one dispatched row: 2*Hidden (BF16)
// or Hidden + 4*Hidden/128 (FP8 and its scales).
func (s Shape) DispatchRowBytes(fp8 bool) int64 {
	if fp8 {
		return int64(s.Hidden) + 4*int64(s.Hidden/FP8Block)
	}
	return 2 * int64(s.Hidden)
}

// ReferenceDispatch computes every rank's dispatch output. alignment <= 1
// means no rounding of the per-expert counts.
func ReferenceDispatch(s Shape, in []RankInput, alignment int) ([]RankOutput, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	w, p := s.World(), s.RanksPerNode
	if len(in) != w {
		return nil, fmt.Errorf("internode: %d rank inputs for %d ranks (%v)", len(in), w, s.Topology)
	}
	fp8 := in[0].XFP8 != nil
	tokens := make([]int, w)
	for r, x := range in {
		var err error
		if tokens[r], err = checkInput(s, r, x, fp8); err != nil {
			return nil, err
		}
	}
	out := make([]RankOutput, w)

	// Network hop: each source rank sends a token once per destination
	// node, to the forwarder with its local index.
	masks := make([]uint8, s.Nodes)
	for src, x := range in {
		a, i := s.Node(src), s.Local(src)
		for t := 0; t < tokens[src]; t++ {
			clear(masks)
			for _, e := range x.TopK[t*s.TopK : (t+1)*s.TopK] {
				if r := s.rankOf(e); r >= 0 {
					masks[s.Node(r)] |= 1 << s.Local(r)
				}
			}
			for n, m := range masks {
				if m == 0 {
					continue
				}
				f := s.Rank(n, i)
				out[f].Relayed = append(out[f].Relayed, Relay{SrcRank: int32(src), SrcToken: int32(t), Targets: m})
				out[src].Traffic.RDMASend.Tokens++
				if n != a {
					out[src].Traffic.NetworkSend.Tokens++
					out[f].Traffic.NetworkRecv.Tokens++
				}
			}
		}
	}

	// NVLink hop: each forwarder walks its network receive buffer in order
	// and hands every token to its target local ranks.
	type source struct{ rank, token int32 }
	recv := make([][]source, w)
	for f := range out {
		n, i := s.Node(f), s.Local(f)
		for _, rl := range out[f].Relayed {
			for l := 0; l < p; l++ {
				if rl.Targets>>l&1 == 0 {
					continue
				}
				d := s.Rank(n, l)
				recv[d] = append(recv[d], source{rl.SrcRank, rl.SrcToken})
				out[d].Traffic.NVLRecv.Tokens++
				if l != i {
					out[f].Traffic.NVLinkSend.Tokens++
					out[d].Traffic.NVLinkRecv.Tokens++
				}
			}
		}
	}

	// Receivers place rows by source rank, then token.
	le, h, k := s.LocalExperts(), s.Hidden, s.TopK
	for d := range out {
		o := &out[d]
		sort.Slice(recv[d], func(a, b int) bool {
			x, y := recv[d][a], recv[d][b]
			return x.rank < y.rank || x.rank == y.rank && x.token < y.token
		})
		o.RankPrefix = make([]int32, w)
		o.NodePrefix = make([]int32, s.Nodes)
		perExpert := make([]int, le)
		for _, sr := range recv[d] {
			x, t := in[sr.rank], int(sr.token)
			o.RecvSrcRank = append(o.RecvSrcRank, sr.rank)
			o.RecvSrcToken = append(o.RecvSrcToken, sr.token)
			for j, e := range x.TopK[t*k : (t+1)*k] {
				local, wt := int64(-1), float32(0)
				if s.rankOf(e) == d {
					local = e - int64(d*le)
					perExpert[local]++
					if x.Weights != nil {
						wt = x.Weights[t*k+j]
					}
				}
				o.RecvTopK = append(o.RecvTopK, local)
				if x.Weights != nil {
					o.RecvWeights = append(o.RecvWeights, wt)
				}
			}
			if fp8 {
				o.RecvXFP8 = append(o.RecvXFP8, x.XFP8[t*h:(t+1)*h]...)
				o.RecvScales = append(o.RecvScales, x.Scales[t*h/FP8Block:(t+1)*h/FP8Block]...)
			} else {
				o.RecvX = append(o.RecvX, x.X[t*h:(t+1)*h]...)
			}
			o.RankPrefix[sr.rank]++
			o.NodePrefix[s.Node(int(sr.rank))]++
		}
		for r := 1; r < w; r++ {
			o.RankPrefix[r] += o.RankPrefix[r-1]
		}
		for n := 1; n < s.Nodes; n++ {
			o.NodePrefix[n] += o.NodePrefix[n-1]
		}
		for e, n := range perExpert {
			if alignment > 1 {
				n = (n + alignment - 1) / alignment * alignment
			}
			perExpert[e] = n
		}
		o.TokensPerLocalExpert = perExpert
		o.Traffic.setBytes(s.DispatchRowBytes(fp8), s.DispatchRowBytes(fp8))
	}
	return out, nil
}

func (t *Traffic) setBytes(network, nvlink int64) {
	for _, h := range []*Hop{&t.NetworkSend, &t.NetworkRecv, &t.RDMASend} {
		h.Bytes = int64(h.Tokens) * network
	}
	for _, h := range []*Hop{&t.NVLinkSend, &t.NVLinkRecv, &t.NVLRecv} {
		h.Bytes = int64(h.Tokens) * nvlink
	}
}

func checkInput(s Shape, r int, x RankInput, fp8 bool) (int, error) {
	t, err := s.tokens(x.TopK)
	if err != nil {
		return 0, fmt.Errorf("internode: rank %d: %w", r, err)
	}
	if x.Weights != nil && len(x.Weights) != len(x.TopK) {
		return 0, fmt.Errorf("internode: rank %d: %d weights for %d top-k entries", r, len(x.Weights), len(x.TopK))
	}
	if fp8 {
		if s.Hidden%FP8Block != 0 {
			return 0, fmt.Errorf("internode: FP8 needs hidden %% %d == 0, got %d", FP8Block, s.Hidden)
		}
		if len(x.XFP8) != t*s.Hidden || len(x.Scales) != t*s.Hidden/FP8Block || x.X != nil {
			return 0, fmt.Errorf("internode: rank %d: FP8 input of %d bytes, %d scales and %d BF16 values for %d tokens of hidden %d",
				r, len(x.XFP8), len(x.Scales), len(x.X), t, s.Hidden)
		}
		return t, nil
	}
	if len(x.X) != t*s.Hidden || x.XFP8 != nil {
		return 0, fmt.Errorf("internode: rank %d: %d BF16 values (and %d FP8 bytes) for %d tokens of hidden %d", r, len(x.X), len(x.XFP8), t, s.Hidden)
	}
	return t, nil
}

// Partial is the format of a node's partial sum on the network leg of
// combine.
type Partial int

const (
	// PartialBF16 rounds each node's fp32 partial to BF16 (RNE) before the
	// network, as DeepEP does: half the network bytes, one more rounding.
	PartialBF16 Partial = iota
	// PartialFP32 sends the fp32 partial unrounded.
	PartialFP32
)

func (p Partial) bytes(hidden int) int64 {
	if p == PartialFP32 {
		return 4 * int64(hidden)
	}
	return 2 * int64(hidden)
}

// CombineOptions choose between combine variants.
type CombineOptions struct {
	Partial Partial
}

// CombineOutput is one source rank's combined result for its own tokens:
// X BF16 [T*Hidden], Weights [T*TopK] (nil when no weights were given).
type CombineOutput struct {
	intranode.CombineOutput
	Traffic Traffic
}

// ReferenceCombine reverses dispatch. tokens[r] is rank r's token count,
// dispatched the dispatch outputs (the handle), in[d] rank d's combine
// input in d's receive order.
//
// Like intranode combine it does not multiply by the top-k weights (callers
// weight the expert outputs first, as with DeepEP); it sums rows and sums
// weights. The order of additions, all in fp32:
//
//  1. Forwarder f = (n, i) sums, for each token of source (a, i) that
//     reached node n, the rows of the ranks of n that hold it, in ascending
//     local rank, starting from +0: the node partial P_n (weights likewise).
//  2. P_n goes to the source over the network when n != a, rounded to BF16
//     under PartialBF16 (weights stay fp32). P_a never leaves the source's
//     node and is not rounded: its forwarder is the source itself.
//  3. The source sums P_n in ascending node from +0, then adds bias0, then
//     bias1, and rounds to BF16 (RNE).
//
// Intranode sums all rows in ascending rank in one accumulator; the ranks
// of one node are consecutive, so the two orders agree except that here
// each node's rows are summed apart before they meet (and rounded, under
// PartialBF16). With one node there is one partial, P_a, and the result is
// bit for bit intranode's; with several it is within 2^-6 of the sum of the
// magnitudes involved (three BF16 roundings of at most 2^-8 each), exact
// when every partial sum is a BF16 value (small integers).
func ReferenceCombine(s Shape, tokens []int, dispatched []RankOutput, in []CombineInput, opt CombineOptions) ([]CombineOutput, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if opt.Partial != PartialBF16 && opt.Partial != PartialFP32 {
		return nil, fmt.Errorf("internode: combine partial format %d", opt.Partial)
	}
	w, h, k := s.World(), s.Hidden, s.TopK
	if len(dispatched) != w || len(in) != w || len(tokens) != w {
		return nil, fmt.Errorf("internode: combine needs %d ranks of layout, input and token counts, got %d, %d and %d",
			w, len(dispatched), len(in), len(tokens))
	}
	withWeights := in[0].Weights != nil
	out := make([]CombineOutput, w)
	for r := range out {
		// Caller sizes are checked before any make (K <= 32 < 4*H for
		// the weights too).
		if err := s.checkTokens(tokens[r]); err != nil {
			return nil, fmt.Errorf("internode: rank %d: %w", r, err)
		}
		for _, b := range [][]uint16{in[r].Bias0, in[r].Bias1} {
			if b != nil && len(b) != tokens[r]*h {
				return nil, fmt.Errorf("internode: rank %d: bias of %d values for %d tokens of hidden %d", r, len(b), tokens[r], h)
			}
		}
	}

	// Steps 1 (NVLink leg): partial[f][(src, token)] accumulates in
	// ascending receiving rank, i.e. ascending local rank within a node.
	type key struct{ rank, token int32 }
	type acc struct{ x, w []float32 }
	partial := make([]map[key]*acc, w)
	for f := range partial {
		partial[f] = map[key]*acc{}
	}
	for d, o := range dispatched {
		n := o.Received()
		if len(o.RecvSrcToken) != n {
			return nil, fmt.Errorf("internode: rank %d: handle has %d source ranks and %d source tokens", d, n, len(o.RecvSrcToken))
		}
		if len(in[d].Y) != n*h {
			return nil, fmt.Errorf("internode: rank %d: combine input has %d values for %d received tokens of hidden %d", d, len(in[d].Y), n, h)
		}
		if withWeights && len(in[d].Weights) != n*k {
			return nil, fmt.Errorf("internode: rank %d: %d combine weights for %d tokens of top-k %d", d, len(in[d].Weights), n, k)
		}
		for j := 0; j < n; j++ {
			src, t := int(o.RecvSrcRank[j]), int(o.RecvSrcToken[j])
			if src < 0 || src >= w || t < 0 || t >= tokens[src] {
				return nil, fmt.Errorf("internode: rank %d: handle row %d names token %d of rank %d, outside the %d ranks' tokens", d, j, t, src, w)
			}
			f := s.Forwarder(src, s.Node(d))
			p := partial[f][key{int32(src), int32(t)}]
			if p == nil {
				p = &acc{x: make([]float32, h)}
				if withWeights {
					p.w = make([]float32, k)
				}
				partial[f][key{int32(src), int32(t)}] = p
			}
			for c, v := range in[d].Y[j*h : (j+1)*h] {
				p.x[c] += kernels.BF16ToFloat32(v)
			}
			if withWeights {
				for c, v := range in[d].Weights[j*k : (j+1)*k] {
					p.w[c] += v
				}
			}
			out[f].Traffic.NVLRecv.Tokens++
			if d != f {
				out[d].Traffic.NVLinkSend.Tokens++
				out[f].Traffic.NVLinkRecv.Tokens++
			}
		}
	}

	// Steps 2 and 3 (network leg, final reduce at the source).
	sum := make([]float32, h)
	for src := range out {
		a := s.Node(src)
		o := &out[src]
		o.X = make([]uint16, tokens[src]*h)
		if withWeights {
			o.Weights = make([]float32, tokens[src]*k)
		}
		for t := 0; t < tokens[src]; t++ {
			clear(sum)
			for n := 0; n < s.Nodes; n++ {
				f := s.Forwarder(src, n)
				p := partial[f][key{int32(src), int32(t)}]
				if p == nil {
					continue
				}
				out[f].Traffic.RDMASend.Tokens++
				round := false
				if n != a {
					out[f].Traffic.NetworkSend.Tokens++
					o.Traffic.NetworkRecv.Tokens++
					round = opt.Partial == PartialBF16
				}
				for c, v := range p.x {
					if round {
						v = kernels.BF16ToFloat32(kernels.Float32ToBF16(v))
					}
					sum[c] += v
				}
				if withWeights {
					for c, v := range p.w {
						o.Weights[t*k+c] += v
					}
				}
			}
			for c, v := range sum {
				if b := in[src].Bias0; b != nil {
					v += kernels.BF16ToFloat32(b[t*h+c])
				}
				if b := in[src].Bias1; b != nil {
					v += kernels.BF16ToFloat32(b[t*h+c])
				}
				o.X[t*h+c] = kernels.Float32ToBF16(v)
			}
		}
	}
	for r := range out {
		out[r].Traffic.setBytes(opt.Partial.bytes(h), 2*int64(h))
	}
	return out, nil
}
