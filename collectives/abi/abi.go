// Package abi is the Go side of the collectives' device ABI
// (kernels/coll_common.cuh): the goep_coll_ctx struct every collective
// kernel receives, the layout of the scratch, packet and mailbox buffers,
// stage numbers of timeout records, and the kernel names. The launchers in
// package collectives and its host-backend twins (twins.go) both use
// it; a test compiles these constants against the header with NVRTC.

package abi

import "encoding/binary"

// MaxRanks is the largest world the native algorithms serve (one NVLink
// domain of 8 GPUs); larger worlds go to NCCL.
const MaxRanks = 8

// goep_coll_ctx layout (CtxSize bytes, little endian).
const (
	CtxRank        = 0   // u32
	CtxWorld       = 4   // u32
	CtxSemBlocks   = 8   // u32: blocks that own semaphores
	CtxMaxRegs     = 12  // u32: rows of the registration table
	CtxFlag        = 16  // goep_ll_flag*: the packet buffer's flag counter
	CtxWatchdog    = 24  // goep_watchdog*
	CtxSems        = 32  // const goep_semaphore*: [SemBlocks][MaxRanks], own slot zero
	CtxRegs        = 40  // const u64*: [MaxRegs][MaxRanks] base of each rank's registration, as mapped here
	CtxPacketHalf  = 48  // u64: bytes of one half of the packet buffer
	CtxScratchSize = 56  // u64: bytes of the scratch data area
	CtxPackets     = 64  // char*[MaxRanks]: every rank's packet buffer as mapped here
	CtxScratch     = 128 // char*[MaxRanks]: every rank's scratch data area
	CtxMailbox     = 192 // char*[MaxRanks]: every rank's mailbox
	CtxLLID        = 256 // u32[MaxRanks]: wait id of LL packet reads from each rank
	CtxCtrl        = 288 // char*[MaxRanks]: every rank's control block (call fingerprints)
	// Written by this rank's kernels through Self (zero at setup).
	CtxSeq     = 352 // u64: launches completed (the kernels advance it)
	CtxFailed  = 360 // u64: nonzero once a wait of a launch gave up
	CtxArrived = 368 // u32: blocks of the running bulk launch that finished
	CtxSelf    = 376 // goep_coll_ctx*: the struct's own device address
	CtxSize    = 384
)

// Control block (CtrlBytes per rank, in its scratch buffer after the
// mailboxes, zeroed at setup, written by peers): see
// kernels/coll_common.cuh.
const (
	CtrlFP    = 0  // u64[MaxRanks]: the host kernel twins' fp[src], the fingerprint of src's latest launch
	CtrlPub   = 64 // LL16 packets [MaxRanks]: pub[src], the fingerprint src published last (flag: its launch number)
	CtrlBytes = 192
)

// Mailbox: DescSize-byte descriptors at [block][source rank] in each rank's
// mailbox, written by the source during a zero-copy kernel's entry barrier.
const (
	DescSize   = 32
	DescInReg  = 0  // u32: registration id of the source's send buffer
	DescOutReg = 4  // u32: registration id of its recv buffer
	DescInOff  = 8  // u64: offset of the send pointer in that registration
	DescOutOff = 16 // u64: offset of the recv pointer
)

// MailboxSize is the mailbox bytes for blocks semaphore blocks.
func MailboxSize(blocks int) int { return blocks * MaxRanks * DescSize }

// Stages written into timeout records (goep_timeout_record.stage).
const (
	StageEntry  = 1 // entry barrier of a scratch or zero-copy kernel
	StageRSData = 2 // waiting for a peer's reduce-scatter data
	StageAGData = 3 // waiting for a peer's allgather data
	StageExit   = 4 // exit barrier of a zero-copy kernel
	StageLL1    = 5 // LL packets of the first (or only) round
	StageLL2    = 6 // LL packets of the second round
	// StageMismatch is not a timeout: a peer's call fingerprint differed
	// (Expected: this rank's fingerprint, Observed: the peer's).
	StageMismatch = 7
	StageFP       = 8 // waiting for a peer's fingerprint of this launch (it has not made the call)
)

// Kernel names.
const (
	KernelARLL1      = "goep_coll_ar_ll1"
	KernelARLL2      = "goep_coll_ar_ll2"
	KernelAGLL       = "goep_coll_ag_ll"
	KernelRSLL       = "goep_coll_rs_ll"
	KernelARRSAG     = "goep_coll_ar_rsag"
	KernelAGScratch  = "goep_coll_ag_scratch"
	KernelRSScratch  = "goep_coll_rs_scratch"
	KernelARZC       = "goep_coll_ar_zc"
	KernelAGZC       = "goep_coll_ag_zc"
	KernelRSZC       = "goep_coll_rs_zc"
	KernelFPSync     = "goep_coll_fp_sync"
	KernelFill       = "goep_coll_fill"
	KernelCheck      = "goep_coll_check"
	KernelMaxThreads = 512 // __launch_bounds__ of every collective kernel (GOEP_COLL_MAX_THREADS)
)

// Collective kinds as goep_coll_check takes them.
const (
	KindAllReduce     = 0
	KindAllGather     = 1
	KindReduceScatter = 2
)

// Ctx is goep_coll_ctx.
type Ctx struct {
	Rank, World, SemBlocks, MaxRegs uint32
	Flag, Watchdog, Sems, Regs      uintptr
	PacketHalf, ScratchSize         uint64
	Packets, Scratch, Mailbox       [MaxRanks]uintptr
	LLID                            [MaxRanks]uint32
	Ctrl                            [MaxRanks]uintptr
	Seq, Failed                     uint64
	Arrived                         uint32
	Self                            uintptr
}

var le = binary.LittleEndian

// Encode writes c into b (CtxSize bytes).
func (c Ctx) Encode(b []byte) {
	_ = b[CtxSize-1]
	le.PutUint32(b[CtxRank:], c.Rank)
	le.PutUint32(b[CtxWorld:], c.World)
	le.PutUint32(b[CtxSemBlocks:], c.SemBlocks)
	le.PutUint32(b[CtxMaxRegs:], c.MaxRegs)
	le.PutUint64(b[CtxFlag:], uint64(c.Flag))
	le.PutUint64(b[CtxWatchdog:], uint64(c.Watchdog))
	le.PutUint64(b[CtxSems:], uint64(c.Sems))
	le.PutUint64(b[CtxRegs:], uint64(c.Regs))
	le.PutUint64(b[CtxPacketHalf:], c.PacketHalf)
	le.PutUint64(b[CtxScratchSize:], c.ScratchSize)
	le.PutUint64(b[CtxSeq:], c.Seq)
	le.PutUint64(b[CtxFailed:], c.Failed)
	le.PutUint32(b[CtxArrived:], c.Arrived)
	le.PutUint32(b[CtxArrived+4:], 0)
	le.PutUint64(b[CtxSelf:], uint64(c.Self))
	for i := 0; i < MaxRanks; i++ {
		le.PutUint64(b[CtxPackets+8*i:], uint64(c.Packets[i]))
		le.PutUint64(b[CtxScratch+8*i:], uint64(c.Scratch[i]))
		le.PutUint64(b[CtxMailbox+8*i:], uint64(c.Mailbox[i]))
		le.PutUint32(b[CtxLLID+4*i:], c.LLID[i])
		le.PutUint64(b[CtxCtrl+8*i:], uint64(c.Ctrl[i]))
	}
}

// DecodeCtx reads a goep_coll_ctx.
func DecodeCtx(b []byte) Ctx {
	_ = b[CtxSize-1]
	c := Ctx{
		Rank: le.Uint32(b[CtxRank:]), World: le.Uint32(b[CtxWorld:]),
		SemBlocks: le.Uint32(b[CtxSemBlocks:]), MaxRegs: le.Uint32(b[CtxMaxRegs:]),
		Flag: uintptr(le.Uint64(b[CtxFlag:])), Watchdog: uintptr(le.Uint64(b[CtxWatchdog:])),
		Sems: uintptr(le.Uint64(b[CtxSems:])), Regs: uintptr(le.Uint64(b[CtxRegs:])),
		PacketHalf: le.Uint64(b[CtxPacketHalf:]), ScratchSize: le.Uint64(b[CtxScratchSize:]),
		Seq: le.Uint64(b[CtxSeq:]), Failed: le.Uint64(b[CtxFailed:]), Arrived: le.Uint32(b[CtxArrived:]),
		Self: uintptr(le.Uint64(b[CtxSelf:])),
	}
	for i := 0; i < MaxRanks; i++ {
		c.Packets[i] = uintptr(le.Uint64(b[CtxPackets+8*i:]))
		c.Scratch[i] = uintptr(le.Uint64(b[CtxScratch+8*i:]))
		c.Mailbox[i] = uintptr(le.Uint64(b[CtxMailbox+8*i:]))
		c.LLID[i] = le.Uint32(b[CtxLLID+4*i:])
		c.Ctrl[i] = uintptr(le.Uint64(b[CtxCtrl+8*i:]))
	}
	return c
}

// ---------------------------------------------------------------------------
// Work decomposition shared by the launchers and the kernels (the kernels
// compute the same from their arguments).

// VecElems is the number of elements of size esize in 16 bytes.
func VecElems(esize int) int { return 16 / esize }

// Rounds describes how a bulk kernel walks its data: full rounds of Cell
// elements per (part, block), then one last round whose cell LastCell is
// the remainder spread evenly (rounded up to whole 16-byte vectors).
type Rounds struct {
	Cell, LastCell uint64
	Full           uint64 // rounds with Cell
	Total          uint64 // Full, plus one when there is a remainder
}

// PlanRounds splits total elements into rounds of parts*cell elements
// (parts cells per round), vec elements per vector.
func PlanRounds(total, parts, cell, vec uint64) Rounds {
	r := Rounds{Cell: cell}
	per := parts * cell
	r.Full = total / per
	rem := total - r.Full*per
	r.Total = r.Full
	if rem > 0 {
		c := (rem + parts - 1) / parts
		r.LastCell = (c + vec - 1) / vec * vec
		r.Total++
	}
	return r
}

// CellOf returns the cell size of round k.
func (r Rounds) CellOf(k uint64) uint64 {
	if k < r.Full {
		return r.Cell
	}
	return r.LastCell
}
