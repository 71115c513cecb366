package plan

import "fmt"

// Opcode is an operation of the resolved form. The values are stable: the
// GPU interpreter switches on them.
type Opcode uint8

const (
	OpNop                   Opcode = iota // block barrier
	OpBarrier                             // grid barrier among NumTBs blocks
	OpSignal                              // thread i: signal channel i
	OpWait                                // thread i: wait on channel i
	OpRelaxedSignal                       // memory: relaxed signal
	OpRelaxedWait                         // memory: relaxed wait
	OpFlush                               // port: wait until the proxy has done every trigger
	OpPut                                 // memory: copy to peer; port: put trigger
	OpPutWithSignal                       // port: put + signal
	OpPutWithSignalAndFlush               // port: put + signal + flush
	OpGet                                 // memory: copy from peer
	OpCopy                                // local copy
	OpReduce                              // re: dst0 = src0 op src1..
	OpReduceSend                          // res: re, and the result to remote dst1..
	OpReadReduce                          // rre: dst0 = src0 op remote src1..
	OpReadReduceSend                      // rres: rre, and the result to remote dst1..
	OpPutPackets                          // ppkt
	OpReadPutPackets                      // rppkt
	OpCopyPackets                         // cpkt
	OpUnpackPackets                       // upkt
	OpReducePackets                       // repkt
	OpReduceSendPackets                   // respkt
	OpReduceCopyPackets                   // recpkt
	OpReduceCopySendPackets               // recspkt
	OpMultiLoadReduceStore                // glres (switch; refused at execution)
	OpMultiStore                          // gstore (switch; refused at execution)
	OpMultiStorePackets                   // gstorepkt (switch; refused at execution)
	OpSemAcquire                          // thread i: acquire semaphore i
	OpSemRelease                          // thread i: release semaphore i
	OpPipeline                            // loop over Body
	numOpcodes
)

var opNames = [numOpcodes]string{
	OpNop: "nop", OpBarrier: "barrier", OpSignal: "signal", OpWait: "wait", OpRelaxedSignal: "rlxsignal",
	OpRelaxedWait: "rlxwait", OpFlush: "flush", OpPut: "put", OpPutWithSignal: "pws", OpPutWithSignalAndFlush: "pwsf",
	OpGet: "get", OpCopy: "copy", OpReduce: "re", OpReduceSend: "res", OpReadReduce: "rre", OpReadReduceSend: "rres",
	OpPutPackets: "ppkt", OpReadPutPackets: "rppkt", OpCopyPackets: "cpkt", OpUnpackPackets: "upkt",
	OpReducePackets: "repkt", OpReduceSendPackets: "respkt", OpReduceCopyPackets: "recpkt",
	OpReduceCopySendPackets: "recspkt", OpMultiLoadReduceStore: "glres", OpMultiStore: "gstore",
	OpMultiStorePackets: "gstorepkt", OpSemAcquire: "sem_acquire", OpSemRelease: "sem_release", OpPipeline: "pipeline",
}

func (o Opcode) String() string {
	if o < numOpcodes {
		return opNames[o]
	}
	return fmt.Sprintf("opcode(%d)", uint8(o))
}

// ParseOpcode maps a JSON op name to its opcode.
func ParseOpcode(name string) (Opcode, error) {
	for i, n := range opNames {
		if n == name {
			return Opcode(i), nil
		}
	}
	if name == "glre" {
		return 0, fmt.Errorf("op %q: a standalone multimem load-reduce is not supported (the DSL fuses it into glres)", clip(name))
	}
	return 0, fmt.Errorf("unknown op %q", clip(name))
}

// Packet reports whether o moves LL packets (such ops ignore pipeline
// offsets, as upstream).
func (o Opcode) Packet() bool {
	switch o {
	case OpPutPackets, OpReadPutPackets, OpCopyPackets, OpUnpackPackets, OpReducePackets, OpReduceSendPackets,
		OpReduceCopyPackets, OpReduceCopySendPackets, OpMultiStorePackets:
		return true
	}
	return false
}

// Reduces reports whether o combines values (and so honours reduce_op and
// the data type).
func (o Opcode) Reduces() bool {
	switch o {
	case OpReduce, OpReduceSend, OpReadReduce, OpReadReduceSend, OpReducePackets, OpReduceSendPackets,
		OpReduceCopyPackets, OpReduceCopySendPackets, OpMultiLoadReduceStore:
		return true
	}
	return false
}

// Switch reports whether o needs NVLink multicast.
func (o Opcode) Switch() bool {
	return o == OpMultiLoadReduceStore || o == OpMultiStore || o == OpMultiStorePackets
}

// ChannelType of an op or a channel.
type ChannelType uint8

const (
	ChanNone ChannelType = iota
	ChanMemory
	ChanPort
	ChanSwitch
)

func (c ChannelType) String() string {
	switch c {
	case ChanNone:
		return "none"
	case ChanMemory:
		return "memory"
	case ChanPort:
		return "port"
	case ChanSwitch:
		return "switch"
	}
	return fmt.Sprintf("channel(%d)", uint8(c))
}

func parseChannelType(s string) (ChannelType, error) {
	switch s {
	case "memory":
		return ChanMemory, nil
	case "port":
		return ChanPort, nil
	case "switch":
		return ChanSwitch, nil
	case "none", "":
		return ChanNone, nil
	}
	return 0, fmt.Errorf("unknown channel type %q (want memory, port or switch)", clip(s))
}

// BufKind is what an operand addresses.
type BufKind uint8

const (
	BufInput        BufKind = iota // this rank's input (the send buffer)
	BufOutput                      // this rank's output (the recv buffer)
	BufScratch                     // this rank's scratch
	BufRemoteMemory                // a peer buffer through a memory channel (peer pointer)
	BufRemotePort                  // a peer buffer through a port channel (proxy memory id)
	BufNone         BufKind = 255
)

func (k BufKind) String() string {
	switch k {
	case BufInput:
		return "i"
	case BufOutput:
		return "o"
	case BufScratch:
		return "s"
	case BufRemoteMemory:
		return "remote-memory"
	case BufRemotePort:
		return "remote-port"
	}
	return fmt.Sprintf("buffer(%d)", uint8(k))
}

func parseBufType(s string) (BufKind, error) {
	switch s {
	case "i":
		return BufInput, nil
	case "o":
		return BufOutput, nil
	case "s":
		return BufScratch, nil
	}
	return BufNone, fmt.Errorf("unknown buffer type %q (want i, o or s)", clip(s))
}

// ReduceOp is an op's reduction.
type ReduceOp uint8

const (
	ReduceSum ReduceOp = iota
	ReduceMin
	ReduceMax
)

func (r ReduceOp) String() string {
	switch r {
	case ReduceSum:
		return "sum"
	case ReduceMin:
		return "min"
	case ReduceMax:
		return "max"
	}
	return fmt.Sprintf("reduce(%d)", uint8(r))
}

// parseReduceOp accepts the DSL's names; "" is sum (upstream's only one).
func parseReduceOp(s string) (ReduceOp, error) {
	switch s {
	case "", "sum":
		return ReduceSum, nil
	case "min":
		return ReduceMin, nil
	case "max":
		return ReduceMax, nil
	}
	return 0, fmt.Errorf("unknown reduce_op %q (want sum, min or max)", clip(s))
}

// Limits, as upstream's device structures have them; the GPU interpreter
// packs the resolved form into fixed arrays of these sizes.
const (
	MaxChannelsPerOp     = 8  // channel_ids of one op
	MaxChannelsPerBlock  = 16 // channels of one type in one threadblock; also remote buffers per type
	MaxOpsPerBlock       = 64 // after pipelines are flattened
	MaxOperands          = 10 // src or dst operands of one op (2 local + 8 remote)
	MaxBarriers          = 16 // barrier ids
	MaxSemaphores        = 16 // semaphores of one GPU
	MaxPipelineBody      = 16 // ops inside one pipeline
	MaxThreadblocks      = 1024
	MaxWorld             = 1024
	maxChunks            = 1 << 20
	predefinedScratchCap = 64 << 20 // reuse_resources scratch slice
)

// Bounds of the scratch a plan implies, checked by Resolve so that a plan
// file cannot make an executor allocate without limit: a scratch_chunks
// inside the validator's range would otherwise, at a small message, ask
// for up to 2^20 chunks (each at least buffer_alignment bytes) per rank.
const (
	// ScratchChunksPerRank bounds scratch_chunks against the data:
	// scratch_chunks <= ScratchChunksPerRank * world * max(input_chunks,
	// output_chunks). The densest shipped plans use world-1 scratch chunks
	// per data chunk (an all-pairs LL allreduce).
	ScratchChunksPerRank = 4
	// MaxScratchBytes bounds one rank's whole scratch allocation (both
	// halves, packets included): 8 GiB.
	MaxScratchBytes = 8 << 30
)
