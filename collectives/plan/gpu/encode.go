// Package gpu runs resolved execution plans (collectives/plan) on GPUs with
// the interpreter in kernels/plan_exec.cu: it packs a rank's Resolved form
// into the structs of kernels/plan_abi.cuh, builds the channels, remote
// buffers and tables a plan needs once per (plan, size, buffers), and
// launches one CUDA block per plan threadblock on the caller's stream.

package gpu

import (
	"encoding/binary"
	"fmt"

	"github.com/goep-dev/goep/collectives/plan"
)

// Sizes of the packed structs (kernels/plan_abi.cuh static_asserts them).
const (
	operandSize = 32
	instrSize   = 704
	blockSize   = 136
	ctxSize     = 19 * 8
	tableLen    = 16
	maxBarriers = 16
	// smemLimit is the dynamic shared memory a launch may take without
	// opting in to more: blocks whose program fits run it from shared
	// memory, the others read it from global memory.
	smemLimit = 48 << 10
)

// program is a rank's packed blocks and instructions.
type program struct {
	blocks    []byte
	instrs    []byte
	maxInstrs int // the longest block's instruction count
}

// encode packs r. Pipelines are flattened: the loop instruction, then its
// body.
func encode(r *plan.Resolved) (*program, error) {
	pr := &program{blocks: make([]byte, 0, len(r.Blocks)*blockSize)}
	n := 0
	for bi := range r.Blocks {
		b := &r.Blocks[bi]
		first := n
		for ii := range b.Instrs {
			in := &b.Instrs[ii]
			pr.instrs = appendInstr(pr.instrs, in, len(in.Body))
			n++
			for j := range in.Body {
				if len(in.Body[j].Body) > 0 {
					return nil, fmt.Errorf("threadblock %d: op %d: nested pipeline", b.ID, in.OpIndex)
				}
				pr.instrs = appendInstr(pr.instrs, &in.Body[j], 0)
				n++
			}
		}
		count := n - first
		if count > plan.MaxOpsPerBlock {
			return nil, fmt.Errorf("threadblock %d: %d instructions after flattening pipelines (at most %d)", b.ID, count, plan.MaxOpsPerBlock)
		}
		pr.maxInstrs = max(pr.maxInstrs, count)
		var blk [blockSize]byte
		binary.LittleEndian.PutUint32(blk[0:], uint32(first))
		binary.LittleEndian.PutUint32(blk[4:], uint32(count))
		for t, list := range [][]int{b.MemoryChannels, b.PortChannels, b.MemoryBuffers, b.PortBuffers} {
			if len(list) > tableLen {
				return nil, fmt.Errorf("threadblock %d: %d entries in a table of %d", b.ID, len(list), tableLen)
			}
			for i, v := range list {
				binary.LittleEndian.PutUint16(blk[8+t*2*tableLen+2*i:], uint16(v))
			}
		}
		pr.blocks = append(pr.blocks, blk[:]...)
	}
	return pr, nil
}

func appendInstr(out []byte, in *plan.Instr, body int) []byte {
	var b [instrSize]byte
	b[0] = byte(in.Code)
	b[1] = byte(in.Channel)
	b[2] = byte(in.Reduce)
	b[3] = in.NChannels
	b[4] = in.NSrc
	b[5] = in.NDst
	b[6] = in.BarrierID
	b[7] = in.NSems
	binary.LittleEndian.PutUint16(b[8:], in.BarrierBlocks)
	binary.LittleEndian.PutUint16(b[10:], uint16(body))
	binary.LittleEndian.PutUint32(b[12:], uint32(in.OpIndex))
	binary.LittleEndian.PutUint64(b[16:], in.UnitBytes)
	binary.LittleEndian.PutUint64(b[24:], in.Iterations)
	copy(b[32:40], in.Channels[:])
	copy(b[40:56], in.Sems[:])
	binary.LittleEndian.PutUint32(b[56:], uint32(in.BodyIndex))
	for i := range plan.MaxOperands {
		putOperand(b[64+operandSize*i:], &in.Src[i])
		putOperand(b[64+operandSize*(plan.MaxOperands+i):], &in.Dst[i])
	}
	return append(out, b[:]...)
}

func putOperand(b []byte, o *plan.Operand) {
	binary.LittleEndian.PutUint64(b[0:], o.Offset)
	binary.LittleEndian.PutUint64(b[8:], o.Size)
	binary.LittleEndian.PutUint64(b[16:], o.Valid)
	b[24] = byte(o.Kind)
	b[25] = o.Remote
	b[26] = byte(o.Target)
	if o.Packets {
		b[27] = 1
	}
}
