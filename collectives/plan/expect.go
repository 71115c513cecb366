package plan

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/goep-dev/goep/collectives/ref"
)

// FillSmallInt fills buf with rank-dependent random small integers
// (-4..4) of type dt: sums of up to 64 ranks are exact in every type and
// any order, so a plan's result can be compared bit for bit with the
// definition whatever order it reduces in.
func FillSmallInt(dt DataType, rank int, seed uint64, buf []byte) {
	rng := rand.New(rand.NewPCG(seed, uint64(rank)*0x9e3779b97f4a7c15+1))
	n := len(buf) / dt.Size()
	for i := 0; i < n; i++ {
		v := int32(rng.IntN(9)) - 4
		putElem(dt, buf, i, float32(v), v)
	}
	for i := n * dt.Size(); i < len(buf); i++ {
		buf[i] = byte(rng.Uint32())
	}
}

func putElem(dt DataType, buf []byte, i int, f float32, v int32) {
	switch dt {
	case Int32:
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(v))
	case FP32:
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	case BF16:
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(ref.FromFloat32(ref.BF16, f)))
	case FP16:
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(ref.FromFloat32(ref.FP16, f)))
	}
}

// reduceRanks reduces element i of every rank's slice, in rank order, with
// plain arithmetic (float32 for floats, as collectives/ref does).
func reduceRanks(dt DataType, op ReduceOp, parts [][]byte, out []byte) {
	n := len(out) / dt.Size()
	rop := [...]ref.Op{ReduceSum: ref.Sum, ReduceMin: ref.Min, ReduceMax: ref.Max}[op]
	vals := make([]uint32, len(parts))
	rdt := map[DataType]ref.DataType{BF16: ref.BF16, FP16: ref.FP16, FP32: ref.FP32}[dt] // once, not per element
	for i := 0; i < n; i++ {
		if dt == Int32 {
			acc := int32(binary.LittleEndian.Uint32(parts[0][4*i:]))
			for _, p := range parts[1:] {
				x := int32(binary.LittleEndian.Uint32(p[4*i:]))
				switch op {
				case ReduceMin:
					acc = min(acc, x)
				case ReduceMax:
					acc = max(acc, x)
				default:
					acc += x
				}
			}
			binary.LittleEndian.PutUint32(out[4*i:], uint32(acc))
			continue
		}
		for r, p := range parts {
			vals[r] = ref.Elem(p, rdt, i)
		}
		v := ref.Reduce(rdt, rop, vals)
		if dt == FP32 {
			binary.LittleEndian.PutUint32(out[4*i:], v)
		} else {
			binary.LittleEndian.PutUint16(out[2*i:], uint16(v))
		}
	}
}

// Expected is what collective must leave in every rank's output, from its
// definition: allreduce (every rank: the reduction of all inputs),
// allgather (the inputs concatenated in rank order), reducescatter (rank
// r: part r of the reduction), alltoall (rank r: block r of every rank's
// input, in rank order), sendrecv (a ring: rank r receives rank r-1's
// input) and broadcast (rank 0's input everywhere). Inputs are in rank order; outBytes is each output's size.
func Expected(collective string, dt DataType, op ReduceOp, inputs [][]byte, outBytes int) ([][]byte, error) {
	W := len(inputs)
	out := make([][]byte, W)
	for r := range out {
		out[r] = make([]byte, outBytes)
	}
	if W == 0 {
		return out, nil
	}
	in := len(inputs[0])
	switch collective {
	case "allreduce":
		if outBytes != in {
			return nil, fmt.Errorf("allreduce: output %d bytes, input %d", outBytes, in)
		}
		reduceRanks(dt, op, inputs, out[0])
		for r := 1; r < W; r++ {
			copy(out[r], out[0])
		}
	case "allgather":
		if outBytes != W*in {
			return nil, fmt.Errorf("allgather: output %d bytes, want %d x %d", outBytes, W, in)
		}
		for r := range out {
			for q := range inputs {
				copy(out[r][q*in:], inputs[q])
			}
		}
	case "reducescatter":
		if in != W*outBytes {
			return nil, fmt.Errorf("reducescatter: input %d bytes, want %d x %d", in, W, outBytes)
		}
		for r := range out {
			parts := make([][]byte, W)
			for q := range inputs {
				parts[q] = inputs[q][r*outBytes : (r+1)*outBytes]
			}
			reduceRanks(dt, op, parts, out[r])
		}
	case "alltoall":
		if in != outBytes || in%W != 0 {
			return nil, fmt.Errorf("alltoall: %d bytes per rank do not split into %d blocks", in, W)
		}
		blk := in / W
		for r := range out {
			for q := range inputs {
				copy(out[r][q*blk:(q+1)*blk], inputs[q][r*blk:(r+1)*blk])
			}
		}
	case "broadcast":
		// From rank 0 (the DSL's builtin root).
		if in != outBytes {
			return nil, fmt.Errorf("broadcast: output %d bytes, input %d", outBytes, in)
		}
		for r := range out {
			copy(out[r], inputs[0])
		}
	case "sendrecv":
		if in != outBytes {
			return nil, fmt.Errorf("sendrecv: output %d bytes, input %d", outBytes, in)
		}
		for r := range out {
			copy(out[r], inputs[(r-1+W)%W])
		}
	default:
		return nil, fmt.Errorf("no definition of collective %q to check against", clip(collective))
	}
	return out, nil
}

// CheckOutputs compares every rank's output with what collective must
// leave there given the inputs (see Expected); the error names the first
// rank and byte that differ.
func CheckOutputs(collective string, dt DataType, op ReduceOp, inputs, outputs [][]byte) error {
	if len(outputs) != len(inputs) || len(outputs) == 0 {
		return fmt.Errorf("%s: %d outputs for %d inputs", collective, len(outputs), len(inputs))
	}
	want, err := Expected(collective, dt, op, inputs, len(outputs[0]))
	if err != nil {
		return err
	}
	for r := range outputs {
		if len(outputs[r]) != len(want[r]) {
			return fmt.Errorf("rank %d: output of %d bytes, want %d", r, len(outputs[r]), len(want[r]))
		}
		for i := range outputs[r] {
			if outputs[r][i] != want[r][i] {
				return fmt.Errorf("rank %d: output differs first at byte %d of %d (got %#x, want %#x)", r, i, len(outputs[r]), outputs[r][i], want[r][i])
			}
		}
	}
	return nil
}
