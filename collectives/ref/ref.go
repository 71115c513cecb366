// Package ref is the plain-Go reference of goep's collectives: the element
// types and reduction operators, their exact arithmetic, the deterministic
// test data every rank can generate alone, and what allreduce, allgather
// and reduce-scatter must produce from it.
//
// Semantics (the kernels in kernels/coll_*.cuh implement exactly this, so
// every native algorithm is bit-exact with this reference and every rank of
// an allreduce ends with the same bits):
//
//   - sum: the inputs are widened to float32 and added in rank order,
//     acc = x0; acc = acc + x1; ...; then the float32 sum is rounded once to
//     the element type (round to nearest, ties to even);
//   - min / max: rank order, a later value replaces the running one only
//     when it compares strictly less (greater), so ties keep the earlier
//     rank's bits and -0/+0 are told apart by rank only.
//
// NCCL reduces in its own order, so its sums match these only when every
// partial sum is exact: the FillSmallInt data makes that so (small integers,
// exact in every type and order).

package ref

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/goep-dev/goep/dtype"
	"github.com/goep-dev/goep/kernels"
)

// DataType is an element type (goep's one dtype.DType). Its values are the
// collective kernels' GOEP_COLL_* dtype codes (collectives/abi checks them).
type DataType = dtype.DType

// The element types the collectives run.
const (
	BF16    = dtype.BF16
	FP16    = dtype.FP16
	FP32    = dtype.FP32
	FP8E4M3 = dtype.FP8E4M3
)

// DataTypes lists every element type the collectives run.
var DataTypes = []DataType{BF16, FP16, FP32, FP8E4M3}

// ParseDataType accepts bf16, fp16 (half, f16), fp32 (float, f32) and
// fp8_e4m3 (fp8, e4m3).
func ParseDataType(s string) (DataType, error) { return dtype.ParseOf(s, DataTypes) }

// Op is a reduction operator. Sum, Min and Max are native (GOEP_COLL_*
// codes); Prod and Avg exist only through the NCCL fallback.
type Op uint32

const (
	Sum  Op = 0
	Min  Op = 1
	Max  Op = 2
	Prod Op = 3
	Avg  Op = 4
)

// Ops lists the native operators.
var Ops = []Op{Sum, Min, Max}

// Native reports whether the kernels implement o.
func (o Op) Native() bool { return o <= Max }

// Valid reports whether o is a known operator.
func (o Op) Valid() bool { return o <= Avg }

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Prod:
		return "prod"
	case Avg:
		return "avg"
	}
	return fmt.Sprintf("op(%d)", uint32(o))
}

// ParseOp accepts sum, min, max, prod and avg.
func ParseOp(s string) (Op, error) {
	for _, o := range []Op{Sum, Min, Max, Prod, Avg} {
		if strings.EqualFold(strings.TrimSpace(s), o.String()) {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown reduction %q (want sum, min or max; prod and avg through NCCL)", s)
}

// ---------------------------------------------------------------------------
// FP16 (IEEE binary16). BF16 and FP8 E4M3 conversions are in package
// kernels, shared with every other kernel.

// FP16NaN is the NaN Float32ToFP16 produces for every NaN input.
const FP16NaN uint16 = 0x7fff

// Float32ToFP16 rounds f to binary16 (nearest, ties to even), keeping
// subnormals; overflow gives ±inf and every NaN becomes FP16NaN. It is
// goep_f32_to_f16_bits bit for bit.
func Float32ToFP16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return FP16NaN
	case a >= 0x477ff000: // >= 65520: rounds to infinity
		return sign | 0x7c00
	case a >= 0x38800000: // >= 2^-14: normal
		v := a - 112<<23
		v += 0xfff + (v>>13)&1
		return sign | uint16(v>>13)
	}
	e := a >> 23
	if e < 102 { // < 2^-25: below half the smallest subnormal
		return sign
	}
	sig := a&0x7fffff | 0x800000
	shift := 126 - e // 14..24
	q := sig >> shift
	rem := sig & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return sign | uint16(q)
}

// FP16ToFloat32 widens binary16 to float32 (exact).
func FP16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		return math.Float32frombits(sign | math.Float32bits(float32(m)*0x1p-24))
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// ToFloat32 widens element bits of type d.
func ToFloat32(d DataType, bits uint32) float32 {
	switch d {
	case BF16:
		return kernels.BF16ToFloat32(uint16(bits))
	case FP16:
		return FP16ToFloat32(uint16(bits))
	case FP8E4M3:
		return kernels.FP8E4M3ToFloat32(uint8(bits))
	}
	return math.Float32frombits(bits)
}

// FromFloat32 rounds f to type d (nearest, ties to even).
func FromFloat32(d DataType, f float32) uint32 {
	switch d {
	case BF16:
		return uint32(kernels.Float32ToBF16(f))
	case FP16:
		return uint32(Float32ToFP16(f))
	case FP8E4M3:
		return uint32(kernels.Float32ToFP8E4M3(f))
	}
	return math.Float32bits(f)
}

// Combine is one step of a reduction in float32: acc op x.
func Combine(op Op, acc, x float32) float32 {
	switch op {
	case Min:
		if x < acc {
			return x
		}
		return acc
	case Max:
		if x > acc {
			return x
		}
		return acc
	}
	return float32(acc + x)
}

// Reduce reduces element bits given in rank order (see the package
// comment). op must be native.
func Reduce(d DataType, op Op, vals []uint32) uint32 {
	acc := ToFloat32(d, vals[0])
	for _, v := range vals[1:] {
		acc = Combine(op, acc, ToFloat32(d, v))
	}
	return FromFloat32(d, acc)
}

// Elem reads element i of buf.
func Elem(buf []byte, d DataType, i int) uint32 {
	switch d.Size() {
	case 1:
		return uint32(buf[i])
	case 2:
		return uint32(binary.LittleEndian.Uint16(buf[2*i:]))
	}
	return binary.LittleEndian.Uint32(buf[4*i:])
}

// SetElem writes element i of buf.
func SetElem(buf []byte, d DataType, i int, v uint32) {
	switch d.Size() {
	case 1:
		buf[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(v))
	default:
		binary.LittleEndian.PutUint32(buf[4*i:], v)
	}
}

// ---------------------------------------------------------------------------
// Reference collectives on whole buffers. inputs[r] is rank r's send
// buffer.

// AllReduce returns what every rank's recv buffer must hold.
func AllReduce(d DataType, op Op, inputs [][]byte) []byte {
	n := len(inputs[0]) / d.Size()
	out := make([]byte, len(inputs[0]))
	vals := make([]uint32, len(inputs))
	for i := 0; i < n; i++ {
		for r, in := range inputs {
			vals[r] = Elem(in, d, i)
		}
		SetElem(out, d, i, Reduce(d, op, vals))
	}
	return out
}

// AllGather returns the concatenation of the inputs.
func AllGather(inputs [][]byte) []byte {
	var out []byte
	for _, in := range inputs {
		out = append(out, in...)
	}
	return out
}

// ReduceScatter returns rank's part of the reduction: each input holds
// len(inputs) parts of equal size, rank gets the reduction of part rank.
func ReduceScatter(d DataType, op Op, inputs [][]byte, rank int) []byte {
	part := len(inputs[0]) / len(inputs)
	parts := make([][]byte, len(inputs))
	for r, in := range inputs {
		parts[r] = in[rank*part : (rank+1)*part]
	}
	return AllReduce(d, op, parts)
}
