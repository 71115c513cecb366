package plan

// The resolved form: what an interpreter runs. Resolve turns one rank's
// part of a validated plan, for one message size and in-place mode, into
// blocks of instructions whose operands are plain byte ranges. Both the
// host interpreter (host*.go) and the GPU interpreter consume it; every
// count is bounded by the limits in ops.go so that a block packs into a
// fixed-size C struct (arrays of MaxOperands operands, MaxChannelsPerOp
// channel indices, MaxSemaphores semaphore ids; a pipeline's Body is
// flattened after its loop instruction, at most MaxOpsPerBlock in all).
//
// # Layout
//
// Message size S is the size of one rank's piece: the input (output for
// allgather-like plans, where the input has fewer chunks) cut into c chunks,
// c the smaller nonzero of input_chunks and output_chunks. Chunks are
// uniform: C = ceil(S / (c*align)) * align bytes. Chunk k of the input or
// output lies in piece k/c at byte (k/c)*S + (k%c)*C; scratch chunk k at
// k*C. When c*align divides S this is upstream's layout exactly. Otherwise
// the last chunks of each piece reach past its end: such operands carry
// Valid < Size, and interpreters read zeros past Valid and drop writes past
// it, so every op still moves whole chunks (packets included) and producers
// and consumers agree on sizes whatever the plan's chunk mapping.
// (Upstream's own remainder-spread offsets give chunks of different sizes,
// which breaks plans that map data chunk i to scratch chunk j != i.)
//
// tbg_info splits an op's range across a group of blocks with upstream's
// formula, in align units with the remainder spread over the first parts:
// part t starts at (t*floor(n/g) + min(t, n%g))*align.
//
// # Packets (protocol LL)
//
// Packet operands (Operand.Packets) address packets: Offset is already the
// packet byte offset (twice the data offset) and Size the payload bytes; the
// packets take 2*Size bytes for LL16 (8-byte payload + two 4-byte flags per
// 16 bytes) and for LL8 (4-byte payload + flag per 8 bytes). LL16 or LL8 is
// a launch argument, not part of the plan. The flag of launch n (n = 1, 2,
// ...) is n; with double scratch, launch n uses scratch half (n+1)%2 (half
// 1 when n is even), as upstream. Every scratch access, packet or not,
// local or remote, adds the half's offset ScratchHalf*half.
type Resolved struct {
	Plan       string
	Collective string
	Rank       int
	World      int
	LL         bool
	InPlace    bool
	Threads    int // per block

	InputBytes  uint64 // this rank's input (send) buffer
	OutputBytes uint64 // this rank's output (recv) buffer
	PieceBytes  uint64 // S
	PieceChunks int    // c
	ChunkBytes  uint64 // C
	Align       uint64

	// ScratchBytes is the whole scratch allocation: both halves with
	// double scratch, packets (2x) with LL. ScratchHalf is the offset of the
	// second half (0 without double scratch).
	ScratchBytes uint64
	ScratchHalf  uint64
	// ScratchWrap, when nonzero (reuse_resources with chunks larger than
	// the fixed scratch allows), is the size of a scratch chunk: scratch
	// chunk k starts at k*ScratchWrap and pipeline offsets into scratch wrap
	// modulo it.
	ScratchWrap uint64

	MemoryChannels []Channel // rank-level list, in plan order
	PortChannels   []Channel
	SwitchChannels []SwitchChannel
	RemoteBuffers  []PeerBuffer
	Semaphores     []int64 // initial values
	Blocks         []Block
}

// Channel is one memory or port channel of a rank: to Peer, the Tag-th
// channel of its type from this rank to Peer. It pairs with the Tag-th
// channel of the same type from Peer back to this rank: a signal here
// bumps that channel's inbound counter on Peer, and a wait here waits for
// Peer's signals on it.
type Channel struct {
	Peer int
	Tag  int
}

// SwitchChannel is an NVLS group bound to one buffer (refused at execution).
type SwitchChannel struct {
	Buffer BufKind
	Ranks  []int
}

// PeerBuffer is a peer's buffer this rank accesses.
type PeerBuffer struct {
	Rank int
	Kind BufKind // BufInput, BufOutput or BufScratch
}

// Block is one threadblock's program and tables. Channel and buffer
// indices in instructions index these lists.
type Block struct {
	ID             int
	MemoryChannels []int // indices into Resolved.MemoryChannels (<= MaxChannelsPerBlock)
	PortChannels   []int // indices into Resolved.PortChannels
	SwitchChannels []int // indices into Resolved.SwitchChannels
	MemoryBuffers  []int // indices into Resolved.RemoteBuffers, through memory channels
	PortBuffers    []int // indices into Resolved.RemoteBuffers, through port channels
	Instrs         []Instr
}

// Instr is one resolved op.
type Instr struct {
	Code    Opcode
	Channel ChannelType
	Reduce  ReduceOp

	// Channels: indices into the block's channel list of type Channel
	// (thread i of the op uses Channels[i]).
	NChannels uint8
	Channels  [MaxChannelsPerOp]uint8

	NSrc, NDst uint8
	Src, Dst   [MaxOperands]Operand

	// Barrier: its id and how many blocks meet there.
	BarrierID     uint8
	BarrierBlocks uint16

	// Semaphores (sem_acquire, sem_release): indices into Resolved.Semaphores.
	NSems uint8
	Sems  [MaxSemaphores]uint8

	// Pipeline: Body runs Iterations times; iteration i offsets every
	// non-packet operand by i*UnitBytes and caps its size at UnitBytes.
	UnitBytes  uint64
	Iterations uint64
	Body       []Instr

	// Where the op came from, for errors: index in the threadblock's ops,
	// and in the pipeline's body (-1 outside a pipeline).
	OpIndex   int
	BodyIndex int
}

// Operand is a byte range of a buffer.
type Operand struct {
	Kind BufKind // BufInput, BufOutput, BufScratch, BufRemoteMemory, BufRemotePort
	// Remote: for BufRemoteMemory, an index into Block.MemoryBuffers; for
	// BufRemotePort, into Block.PortBuffers. Target is the remote buffer's
	// kind (input, output or scratch); for local operands Target == Kind.
	Remote uint8
	Target BufKind
	// Packets: the range holds LL packets (Offset is the packet byte
	// offset; the packets span 2*Size bytes).
	Packets bool
	Offset  uint64 // bytes from the buffer's start (scratch: from the current half's start)
	Size    uint64 // bytes the op moves (payload bytes for packets)
	Valid   uint64 // bytes from Offset that exist; past them reads are zero and writes dropped
}

// SrcOps and DstOps are the used operands.
func (in *Instr) SrcOps() []Operand {
	if in == nil {
		return nil
	}
	return in.Src[:min(int(in.NSrc), len(in.Src))]
}

// DstOps are the used destination operands.
func (in *Instr) DstOps() []Operand {
	if in == nil {
		return nil
	}
	return in.Dst[:min(int(in.NDst), len(in.Dst))]
}

// ChannelList is the used channel indices.
func (in *Instr) ChannelList() []uint8 {
	if in == nil {
		return nil
	}
	return in.Channels[:min(int(in.NChannels), len(in.Channels))]
}

// Slice narrows every operand of a data instruction to [off, off+n) of its
// range (a tbg part or a pipeline iteration); packet operands move by 2*off.
// wrap, when nonzero, is Resolved.ScratchWrap: scratch offsets wrap modulo
// it (the chunk's base is kept).
func (in *Instr) Slice(off, n, wrap uint64) Instr {
	if in == nil {
		return Instr{}
	}
	out := *in
	cut := func(o *Operand) {
		if off >= o.Size {
			o.Size, o.Valid = 0, 0
			return
		}
		step := off
		if o.Target == BufScratch && wrap != 0 {
			step = off % wrap
		}
		if o.Packets {
			o.Offset += 2 * step
		} else {
			o.Offset += step
		}
		o.Size = min(n, o.Size-off)
		if o.Valid > off {
			o.Valid = min(o.Valid-off, o.Size)
		} else {
			o.Valid = 0
		}
	}
	for i := range out.NSrc {
		cut(&out.Src[i])
	}
	for i := range out.NDst {
		cut(&out.Dst[i])
	}
	return out
}

// Size is the bytes a data instruction moves (its first operand's size).
func (in *Instr) Size() uint64 {
	if in == nil {
		return 0
	}
	if in.NSrc > 0 {
		return in.Src[0].Size
	}
	if in.NDst > 0 {
		return in.Dst[0].Size
	}
	return 0
}
