package plan

import (
	"fmt"
	"math/bits"
)

// Sizes are a call's buffer sizes as a plan sees them.
type Sizes struct {
	Input, Output uint64 // bytes of this rank's send and recv buffers
	Piece         uint64 // S: bytes of the buffer with fewer chunks, per piece
	PieceChunks   int    // c
	Chunk         uint64 // C
}

// SizesFor derives the buffer sizes of a call with msgBytes: the input
// (send) bytes per rank, or the output bytes when the plan's input has no
// chunks. The output is input * output_chunks / input_chunks (allgather:
// world x input; reduce-scatter: input / world), which must be exact.
func (p *Plan) SizesFor(msgBytes uint64) (Sizes, error) {
	if p == nil {
		var r0 Sizes
		return r0, ErrNil
	}
	g := &p.GPUs[0]
	ci, co := uint64(g.InputChunks), uint64(g.OutputChunks)
	var s Sizes
	if msgBytes == 0 {
		return s, fmt.Errorf("%s: message size 0", p.label())
	}
	switch {
	case ci == 0:
		s.Output = msgBytes
	case co == 0:
		s.Input = msgBytes
	default:
		s.Input = msgBytes
		hi, lo := bits.Mul64(msgBytes, co)
		if hi != 0 || lo%ci != 0 {
			return s, fmt.Errorf("%s: input of %d bytes does not cut into %d chunks of the output's %d", p.label(), msgBytes, ci, co)
		}
		s.Output = lo / ci
	}
	// The piece is the buffer with fewer chunks; the other one holds a
	// whole number of pieces.
	switch {
	case ci == 0 || (co != 0 && co < ci):
		s.Piece, s.PieceChunks = s.Output, int(co)
		if ci%co != 0 && ci != 0 {
			return s, fmt.Errorf("%s: input_chunks %d is not a multiple of output_chunks %d", p.label(), ci, co)
		}
	default:
		s.Piece, s.PieceChunks = s.Input, int(ci)
		if co%ci != 0 && co != 0 {
			return s, fmt.Errorf("%s: output_chunks %d is not a multiple of input_chunks %d", p.label(), co, ci)
		}
	}
	unit := uint64(s.PieceChunks) * p.BufferAlignment
	s.Chunk = (s.Piece + unit - 1) / unit * p.BufferAlignment
	if s.Piece == 0 || s.Chunk > 1<<40 {
		return s, fmt.Errorf("%s: message size %d is out of range", p.label(), msgBytes)
	}
	return s, nil
}

// RangeSize is the size min/max_message_size bound: the output for
// allgather, the input otherwise (as upstream).
func (p *Plan) RangeSize(s Sizes) uint64 {
	if p == nil {
		var r0 uint64
		return r0
	}
	if p.Collective == "allgather" || s.Input == 0 {
		return s.Output
	}
	return s.Input
}

// CheckWorld fails when the plan is written for another number of ranks.
func (p *Plan) CheckWorld(world int) error {
	if p == nil {
		return ErrNil
	}
	if world != len(p.GPUs) {
		return fmt.Errorf("%s: written for %d GPUs, the world has %d ranks", p.label(), len(p.GPUs), world)
	}
	return nil
}

// Resolve resolves rank's part of p for a call of msgBytes (see SizesFor)
// in the given in-place mode. It fails when the plan does not take such a
// call: size outside [min, max], in-place mode other than the plan's,
// operands past a buffer.
func Resolve(p *Plan, rank int, msgBytes uint64, inPlace bool) (*Resolved, error) {
	if rank < 0 || rank >= len(p.GPUs) {
		return nil, fmt.Errorf("%s: rank %d out of range (plan has %d GPUs)", p.label(), rank, len(p.GPUs))
	}
	if inPlace != p.InPlace {
		mode := map[bool]string{true: "in-place", false: "out-of-place"}
		return nil, fmt.Errorf("%s: the plan is %s, the call %s", p.label(), mode[p.InPlace], mode[inPlace])
	}
	sz, err := p.SizesFor(msgBytes)
	if err != nil {
		return nil, err
	}
	if n := p.RangeSize(sz); n < p.MinMessageSize || n > p.MaxMessageSize {
		return nil, fmt.Errorf("%s: size %d outside the plan's [%d, %d]", p.label(), n, p.MinMessageSize, p.MaxMessageSize)
	}
	gpu := &p.GPUs[rank]
	r := &Resolved{
		Plan: p.Name, Collective: p.Collective, Rank: rank, World: len(p.GPUs), LL: p.IsLL(), InPlace: inPlace,
		Threads: p.NumThreadsPerBlock, InputBytes: sz.Input, OutputBytes: sz.Output, PieceBytes: sz.Piece,
		PieceChunks: sz.PieceChunks, ChunkBytes: sz.Chunk, Align: p.BufferAlignment,
	}
	if err := r.layoutScratch(p, gpu); err != nil {
		return nil, err
	}
	r.channels(gpu)
	for _, rb := range gpu.RemoteBuffers {
		k, _ := parseBufType(rb.Type)
		r.RemoteBuffers = append(r.RemoteBuffers, PeerBuffer{Rank: rb.Rank, Kind: k})
	}
	for _, s := range gpu.Semaphores {
		r.Semaphores = append(r.Semaphores, s.InitValue)
	}
	for t := range gpu.Threadblocks {
		b, err := r.block(p, gpu, t)
		if err != nil {
			return nil, err
		}
		r.Blocks = append(r.Blocks, b)
	}
	return r, nil
}

// layoutScratch sizes the scratch (see Resolved).
func (r *Resolved) layoutScratch(p *Plan, gpu *GPU) error {
	sc := uint64(gpu.ScratchChunks)
	if sc == 0 {
		return nil
	}
	A := p.BufferAlignment
	dataChunks := uint64(max(gpu.InputChunks, gpu.OutputChunks))
	if limit := uint64(ScratchChunksPerRank) * uint64(len(p.GPUs)) * dataChunks; sc > limit {
		return fmt.Errorf("%s: gpu %d: field \"scratch_chunks\": %d scratch chunks for %d data chunks and %d ranks (at most %d x ranks x data chunks = %d)",
			p.label(), r.Rank, sc, dataChunks, len(p.GPUs), ScratchChunksPerRank, limit)
	}
	if p.ReuseResources {
		capBytes := uint64(predefinedScratchCap)
		if p.UseDoubleScratchBuffer {
			capBytes /= 2
		}
		if p.IsLL() {
			capBytes /= 2 // the slice holds packets
		}
		wrap := (capBytes/sc + A - 1) / A * A
		if wrap < r.ChunkBytes {
			r.ScratchWrap = wrap
			r.ScratchBytes = predefinedScratchCap
			if p.UseDoubleScratchBuffer {
				r.ScratchHalf = predefinedScratchCap / 2
			}
			return nil
		}
	}
	hi, data := bits.Mul64(sc, r.ChunkBytes)
	if hi != 0 || data > MaxScratchBytes {
		return fmt.Errorf("%s: gpu %d: scratch of %d chunks of %d bytes is too large", p.label(), r.Rank, sc, r.ChunkBytes)
	}
	if p.IsLL() {
		data *= 2
	}
	data = (data + A - 1) / A * A
	r.ScratchBytes = data
	if p.UseDoubleScratchBuffer {
		r.ScratchHalf = data
		r.ScratchBytes = 2 * data
	}
	if r.ScratchBytes > MaxScratchBytes {
		return fmt.Errorf("%s: gpu %d: a scratch of %d bytes for a message of %d (at most %d bytes, plan.MaxScratchBytes)",
			p.label(), r.Rank, r.ScratchBytes, r.PieceBytes, MaxScratchBytes)
	}
	return nil
}

// channels builds the rank-level channel lists, tagging each channel with
// its ordinal among this rank's channels of that type to the same peer.
func (r *Resolved) channels(gpu *GPU) {
	count := map[[2]int]int{} // (type, peer) -> channels so far
	for _, ch := range gpu.Channels {
		ct, _ := parseChannelType(ch.ChannelType)
		if ct == ChanSwitch {
			bt, _ := parseBufType(ch.BufferType)
			for _, g := range ch.RankGroups {
				r.SwitchChannels = append(r.SwitchChannels, SwitchChannel{Buffer: bt, Ranks: append([]int(nil), g.Ranks...)})
			}
			continue
		}
		for _, peer := range ch.ConnectedTo {
			key := [2]int{int(ct), peer}
			c := Channel{Peer: peer, Tag: count[key]}
			count[key]++
			if ct == ChanMemory {
				r.MemoryChannels = append(r.MemoryChannels, c)
			} else {
				r.PortChannels = append(r.PortChannels, c)
			}
		}
	}
}

func (r *Resolved) block(p *Plan, gpu *GPU, t int) (Block, error) {
	tb := &gpu.Threadblocks[t]
	b := Block{
		ID:             t,
		MemoryChannels: tbChannels(tb, ChanMemory),
		PortChannels:   tbChannels(tb, ChanPort),
		SwitchChannels: tbChannels(tb, ChanSwitch),
		MemoryBuffers:  tbRemoteBuffers(tb, ChanMemory),
		PortBuffers:    tbRemoteBuffers(tb, ChanPort),
	}
	for i := range tb.Ops {
		in, err := r.instr(p, &b, &tb.Ops[i], i, -1)
		if err != nil {
			return b, fmt.Errorf("%s: gpu %d: threadblock %d: op %d (%s): %w", p.label(), r.Rank, t, i, tb.Ops[i].Name, err)
		}
		b.Instrs = append(b.Instrs, in)
	}
	return b, nil
}

func (r *Resolved) instr(p *Plan, b *Block, op *Op, index, body int) (Instr, error) {
	code, err := ParseOpcode(op.Name)
	if err != nil {
		return Instr{}, err
	}
	ct, _ := parseChannelType(op.ChannelType)
	red, _ := parseReduceOp(op.ReduceOp)
	in := Instr{Code: code, Channel: ct, Reduce: red, OpIndex: index, BodyIndex: body}
	in.NChannels = uint8(len(op.ChannelIDs))
	for i, c := range op.ChannelIDs {
		in.Channels[i] = uint8(c)
	}
	if op.BarrierID != nil {
		in.BarrierID = uint8(*op.BarrierID)
	}
	if op.NumTBs != nil {
		in.BarrierBlocks = uint16(*op.NumTBs)
	}
	in.NSems = uint8(len(op.SemaphoreIDs))
	for i, s := range op.SemaphoreIDs {
		in.Sems[i] = uint8(s)
	}
	if code == OpPipeline {
		ic := op.IterContext
		total := uint64(ic.NumChunks) * r.ChunkBytes
		in.UnitBytes = ic.UnitSize
		in.Iterations = (total + ic.UnitSize - 1) / ic.UnitSize
		for j := range op.Ops {
			sub, err := r.instr(p, b, &op.Ops[j], index, j)
			if err != nil {
				return in, fmt.Errorf("body op %d (%s): %w", j, op.Ops[j].Name, err)
			}
			in.Body = append(in.Body, sub)
		}
		return in, nil
	}
	in.NSrc, in.NDst = uint8(len(op.Src)), uint8(len(op.Dst))
	for i, ref := range op.Src {
		if in.Src[i], err = r.operand(b, ct, ref, packetSrc(code, ct, i)); err != nil {
			return in, fmt.Errorf("src %d: %w", i, err)
		}
	}
	for i, ref := range op.Dst {
		if in.Dst[i], err = r.operand(b, ct, ref, packetDst(code, ct, i)); err != nil {
			return in, fmt.Errorf("dst %d: %w", i, err)
		}
	}
	if g := op.TBGInfo; g != nil && (in.NSrc > 0 || in.NDst > 0) {
		off, n := splitAligned(in.Size(), uint64(g.TBID), uint64(g.TBGSize), r.Align)
		in = in.Slice(off, n, 0)
	}
	return in, nil
}

// packetSrc says whether source i of op code is in packet format.
func packetSrc(code Opcode, ct ChannelType, i int) bool {
	switch code {
	case OpUnpackPackets, OpReadPutPackets:
		return true
	case OpReducePackets, OpReduceSendPackets, OpReduceCopyPackets, OpReduceCopySendPackets:
		return i >= 1
	case OpPutPackets:
		// The memory form packs data; the port form forwards packets
		// already in local scratch.
		return ct == ChanPort
	}
	return false
}

// packetDst says whether destination i of op code is in packet format.
func packetDst(code Opcode, ct ChannelType, i int) bool {
	switch code {
	case OpPutPackets, OpReadPutPackets, OpCopyPackets:
		return true
	case OpReduceSendPackets:
		return i >= 1
	case OpReduceCopyPackets, OpReduceCopySendPackets:
		return i >= 1
	case OpMultiStorePackets:
		return true
	}
	return false
}

// operand resolves one buffer ref.
func (r *Resolved) operand(b *Block, ct ChannelType, ref BufRef, packets bool) (Operand, error) {
	var o Operand
	switch {
	case ref.Type != "":
		k, _ := parseBufType(ref.Type)
		o.Kind, o.Target = k, k
	case ref.BufferID != nil:
		list, kind := b.MemoryBuffers, BufRemoteMemory
		if ct == ChanPort {
			list, kind = b.PortBuffers, BufRemotePort
		}
		id := *ref.BufferID
		o.Kind, o.Remote, o.Target = kind, uint8(id), r.RemoteBuffers[list[id]].Kind
	default:
		// A switch channel: the bound buffer's range (never executed).
		id := *ref.SwitchChannelID
		o.Kind, o.Remote, o.Target = BufNone, uint8(id), r.SwitchChannels[b.SwitchChannels[id]].Buffer
	}
	C, S, c := r.ChunkBytes, r.PieceBytes, uint64(r.PieceChunks)
	k, n := uint64(ref.Index), uint64(ref.Size)
	o.Size = n * C
	o.Packets = packets
	if o.Target == BufScratch {
		o.Offset, o.Valid = k*C, o.Size
		if r.ScratchWrap != 0 {
			o.Offset = k * r.ScratchWrap
		}
	} else {
		piece, j := k/c, k%c
		o.Offset = piece*S + j*C
		exact := S == c*C
		if !exact && n > 0 && j+n > c {
			return o, fmt.Errorf("chunks [%d, %d) of %s span two ranks' pieces; with this plan the message size must be a multiple of %d bytes",
				k, k+n, o.Target, c*r.Align)
		}
		o.Valid = o.Size
		if !exact {
			o.Valid = min(o.Size, S-min(S, j*C))
		}
		end := r.bufBytes(o.Target)
		if o.Valid > 0 && o.Offset+o.Valid > end {
			return o, fmt.Errorf("chunks [%d, %d) of %s reach byte %d, past the buffer's %d", k, k+n, o.Target, o.Offset+o.Valid, end)
		}
	}
	if packets {
		if o.Target != BufScratch && o.Valid != o.Size {
			return o, fmt.Errorf("packets in %s need whole chunks; use a message size that is a multiple of %d bytes", o.Target, c*r.Align)
		}
		o.Offset *= 2
		if o.Target != BufScratch && o.Offset+2*o.Size > r.bufBytes(o.Target) {
			return o, fmt.Errorf("packets for chunks [%d, %d) take bytes up to %d of %s, which has %d", k, k+n, o.Offset+2*o.Size, o.Target, r.bufBytes(o.Target))
		}
	}
	return o, nil
}

// bufBytes is the size of a rank's input or output (peers' are the same).
func (r *Resolved) bufBytes(k BufKind) uint64 {
	if k == BufInput {
		return r.InputBytes
	}
	return r.OutputBytes
}

// splitAligned is part t of g of a size-byte range, in align units with the
// remainder spread over the first parts (upstream's calcOffset). Sizes are
// whole chunks, so multiples of align.
func splitAligned(size, t, g, align uint64) (off, n uint64) {
	units := size / align
	q, rem := units/g, units%g
	at := func(i uint64) uint64 { return (i*q + min(i, rem)) * align }
	return at(t), at(t+1) - at(t)
}
