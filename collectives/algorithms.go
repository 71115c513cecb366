package collectives

import (
	"fmt"
	"strings"

	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/internal/device"
)

// Algorithm names. Every collective has the same set; what each does:
//
//	ll       allreduce: one-shot all-pairs LL (every rank sends its whole
//	         input to every peer as LL16 packets and reduces all of them);
//	         allgather: all-pairs LL; reduce-scatter: all-pairs LL (part p to
//	         rank p). Small messages: one NVLink trip, no semaphores.
//	ll2      allreduce only: reduce-scatter then allgather, both as LL
//	         packets (two trips, 1/W of the packet traffic of ll). Medium
//	         messages.
//	scratch  through the registered scratch buffers, with per-block
//	         semaphores: allreduce = reduce-scatter + allgather (push into the
//	         owner's scratch, reduce, push the result into every peer's
//	         scratch, copy out); allgather and reduce-scatter push into the
//	         peers' scratch. Any buffers, any size.
//	zc       zero-copy on registered user buffers (Register): allreduce
//	         reads every rank's input and writes every rank's output
//	         directly; allgather writes the peers' outputs; reduce-scatter
//	         reads the peers' inputs.
//	nccl     NCCL, loaded at run time (collectives/nccl); also the fallback
//	         for what the native algorithms do not cover.
const (
	AlgoLL      = "ll"
	AlgoLL2     = "ll2"
	AlgoScratch = "scratch"
	AlgoZC      = "zc"
	AlgoNCCL    = "nccl"
)

// Algorithms lists the algorithm names of kind k.
func Algorithms(k Kind) []string {
	if k == AllReduce {
		return []string{AlgoLL, AlgoLL2, AlgoScratch, AlgoZC, AlgoNCCL}
	}
	return []string{AlgoLL, AlgoScratch, AlgoZC, AlgoNCCL}
}

// call is one collective call, validated.
type call struct {
	kind      Kind
	send      uintptr
	recv      uintptr
	count     int // allreduce: elements; allgather: sent per rank; reduce-scatter: received per rank
	dt        DataType
	op        Op
	stream    device.Stream
	captured  bool
	sendReg   *Registration
	recvReg   *Registration
	sendOff   uint64
	recvOff   uint64
	blocks    int // forced or tuned grid of a bulk algorithm (0: default)
	algo      string
	forced    bool
	sendBytes int
	recvBytes int
}

// size is the per-rank message size the selector and the tuning table use:
// the whole buffer for allreduce, one rank's part for allgather and
// reduce-scatter.
func (x *call) size() int {
	n, ok := mulBytes(x.count, x.dt.Size())
	if !ok {
		return maxInt // validate refuses such calls; the selector only ranks sizes
	}
	return n
}

func (x *call) mode() string {
	if x.captured {
		return "graph"
	}
	return "eager"
}

func (x *call) String() string {
	s := fmt.Sprintf("%s of %d %s elements", x.kind, x.count, x.dt)
	if x.kind != AllGather {
		s += " (" + x.op.String() + ")"
	}
	return s
}

// nativeType reports why the native algorithms cannot run x's type and
// reduction ("" when they can).
func nativeType(x *call) string {
	if x.kind == AllGather {
		return "" // bytes are bytes: every type
	}
	if x.dt == FP8E4M3 {
		return fmt.Sprintf("%s of %s is not implemented natively (fp8 is native for allgather only)", x.kind, x.dt)
	}
	if !x.op.Native() {
		return fmt.Sprintf("%s with %s is not implemented natively (sum, min and max are)", x.kind, x.op)
	}
	return ""
}

// whyNot reports why algorithm name cannot run x on c ("" when it can).
func (c *Communicator) whyNot(name string, x *call) string {
	if name == AlgoNCCL {
		return c.ncclWhyNot()
	}
	if !c.native {
		return fmt.Sprintf("the native algorithms need 2..%d ranks, this world has %d", abi.MaxRanks, c.size)
	}
	if s := nativeType(x); s != "" {
		return s
	}
	W := uint64(c.size)
	n := uint64(x.size())
	half := uint64(c.cfg.PacketBytes)
	words := (n + 7) / 8
	switch name {
	case AlgoLL:
		if W*words*16 > half {
			return fmt.Sprintf("%d bytes per rank need %d bytes of LL packets, the packet buffer's half has %d (Config.PacketBytes)", n, W*words*16, half)
		}
	case AlgoLL2:
		if x.kind != AllReduce {
			return "ll2 is an allreduce algorithm"
		}
		P := (words + W - 1) / W
		if W*P*16 > half {
			return fmt.Sprintf("%d bytes need %d bytes of LL packets per round, the packet buffer's half has %d (Config.PacketBytes)", n, W*P*16, half)
		}
	case AlgoScratch:
		if c.cell(x, c.bulkBlocks(x)) == 0 {
			return fmt.Sprintf("the scratch (%d bytes) is too small for %d blocks", c.scrBytes, c.bulkBlocks(x))
		}
	case AlgoZC:
		if x.kind != AllGather && x.sendReg == nil {
			return fmt.Sprintf("zero-copy %s needs the send buffer registered (Register) on every rank", x.kind)
		}
		if x.kind != ReduceScatter && x.recvReg == nil {
			return fmt.Sprintf("zero-copy %s needs the recv buffer registered (Register) on every rank", x.kind)
		}
	default:
		return fmt.Sprintf("no %s algorithm %q (have %s)", x.kind, name, strings.Join(Algorithms(x.kind), ", "))
	}
	return ""
}

// bulkBlocks is the grid of a scratch or zero-copy kernel for x: the tuned
// or forced value, else one block per 256 KiB moved per rank, 1..MaxBlocks.
func (c *Communicator) bulkBlocks(x *call) int {
	if x.blocks > 0 {
		return min(x.blocks, c.cfg.MaxBlocks)
	}
	moved := x.size()
	if x.kind != AllReduce {
		moved *= c.size
	}
	return max(1, min(c.cfg.MaxBlocks, (moved+(256<<10)-1)>>18))
}

// cell is the per-(part, block) cell of a scratch kernel, in elements (bytes
// for allgather): what fits 2 * W * blocks cells in the scratch, whole
// 16-byte vectors. 0 when not even one vector fits.
func (c *Communicator) cell(x *call, blocks int) uint64 {
	e := uint64(x.dt.Size())
	if x.kind == AllGather {
		e = 1
	}
	slots := 2 * uint64(c.size) * uint64(blocks)
	cell := uint64(c.scrBytes) / (slots * e)
	vec := 16 / e
	return cell / vec * vec
}

// llGrid is the grid of an LL kernel dealing items words.
func (c *Communicator) llGrid(items uint64) int {
	t := uint64(c.cfg.Threads)
	return int(max(1, min(uint64(c.cfg.LLMaxBlocks), (items+t-1)/t)))
}

// shape is x's call-fingerprint shape (abi.Shape) for an algorithm code and
// a bulk grid. Allgather has no reduction: its op bits stay 0.
func (x *call) shape(algo uint32, grid int) uint64 {
	op := uint32(x.op)
	if x.kind == AllGather {
		op = 0
	}
	return abi.Shape(x.kind.ABICode(), uint32(x.dt), op, algo, grid, uint64(x.count))
}

// launchSync runs goep_coll_fp_sync for a call of count 0: it moves nothing
// but takes the call's place in the fingerprint sequence, so that count 0
// on one rank against data on another is a mismatch on both.
func (c *Communicator) launchSync(x *call) error {
	a := c.args.Reset()
	a.Ptr(c.ctxBuf.Ptr).U64(x.shape(abi.FPAlgoNone, 0))
	if err := c.dev.Launch(abi.KernelFPSync, device.D1(1), device.D1(c.cfg.Threads), 0, x.stream, a); err != nil {
		return c.errorf("%s: %w", x, err)
	}
	return nil
}

// launch runs native algorithm name for x.
func (c *Communicator) launch(name string, x *call) error {
	a := c.args.Reset()
	W := uint64(c.size)
	n := uint64(x.count)
	bytes := uint64(x.size())
	words := (bytes + 7) / 8
	var kernel string
	var grid int
	a.Ptr(c.ctxBuf.Ptr).Ptr(x.send).Ptr(x.recv)
	switch x.kind {
	case AllReduce:
		switch name {
		case AlgoLL:
			kernel, grid = abi.KernelARLL1, c.llGrid(words)
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op))
		case AlgoLL2:
			kernel, grid = abi.KernelARLL2, c.llGrid((words+W-1)/W)
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op))
		case AlgoScratch:
			grid = c.bulkBlocks(x)
			kernel = abi.KernelARRSAG
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op)).U64(c.cell(x, grid))
		case AlgoZC:
			kernel, grid = abi.KernelARZC, c.bulkBlocks(x)
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op)).U32(uint32(x.sendReg.id)).U64(x.sendOff).
				U32(uint32(x.recvReg.id)).U64(x.recvOff)
		}
	case AllGather:
		switch name {
		case AlgoLL:
			kernel, grid = abi.KernelAGLL, c.llGrid(words)
			a.U64(bytes)
		case AlgoScratch:
			grid = c.bulkBlocks(x)
			kernel = abi.KernelAGScratch
			a.U64(bytes).U64(c.cell(x, grid))
		case AlgoZC:
			kernel, grid = abi.KernelAGZC, c.bulkBlocks(x)
			a.U64(bytes).U32(uint32(x.recvReg.id)).U64(x.recvOff)
		}
	case ReduceScatter:
		switch name {
		case AlgoLL:
			kernel, grid = abi.KernelRSLL, c.llGrid(words)
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op))
		case AlgoScratch:
			grid = c.bulkBlocks(x)
			kernel = abi.KernelRSScratch
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op)).U64(c.cell(x, grid))
		case AlgoZC:
			kernel, grid = abi.KernelRSZC, c.bulkBlocks(x)
			a.U64(n).U32(uint32(x.dt)).U32(uint32(x.op)).U32(uint32(x.sendReg.id)).U64(x.sendOff)
		}
	}
	if kernel == "" {
		return c.errorf("%s: no native algorithm %q", x.kind, name)
	}
	// The call fingerprint's shape, the kernels' last argument. LL kernels
	// leave the grid out: each rank sizes its own and they need not agree.
	code, fpGrid := uint32(abi.FPAlgoLL), 0
	switch name {
	case AlgoLL2:
		code = abi.FPAlgoLL2
	case AlgoScratch:
		code, fpGrid = abi.FPAlgoScratch, grid
	case AlgoZC:
		code, fpGrid = abi.FPAlgoZC, grid
	}
	a.U64(x.shape(code, fpGrid))
	if err := c.dev.Launch(kernel, device.D1(grid), device.D1(c.cfg.Threads), 0, x.stream, a); err != nil {
		return c.errorf("%s (%s): %w", x, name, err)
	}
	return nil
}
