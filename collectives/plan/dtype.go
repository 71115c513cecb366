package plan

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/kernels"
)

// DataType is the element type of a plan execution (reductions depend on
// it; copies do not).
type DataType uint8

const (
	BF16 DataType = iota
	FP16
	FP32
	Int32
)

// DataTypes lists the types the executors run.
var DataTypes = []DataType{BF16, FP16, FP32, Int32}

// Size is the element size in bytes.
func (d DataType) Size() int {
	if d == BF16 || d == FP16 {
		return 2
	}
	return 4
}

func (d DataType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case FP32:
		return "fp32"
	case Int32:
		return "int32"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDataType accepts bf16, fp16, fp32 and int32.
func ParseDataType(s string) (DataType, error) {
	for _, d := range DataTypes {
		if strings.EqualFold(strings.TrimSpace(s), d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown data type %q (want bf16, fp16, fp32 or int32)", clip(s))
}

// FromRef maps the collectives' element types (fp8 has no plan executor).
func FromRef(d ref.DataType) (DataType, error) {
	switch d {
	case ref.BF16:
		return BF16, nil
	case ref.FP16:
		return FP16, nil
	case ref.FP32:
		return FP32, nil
	}
	return 0, fmt.Errorf("plans run bf16, fp16, fp32 and int32, not %s", d)
}

// ReduceInto sets acc[i] = acc[i] op x[i] element by element, rounding to
// the element type after every step as a GPU doing it in that type does.
// Floats: min and max keep acc on ties and NaN comparisons; int32 sums wrap.
func ReduceInto(d DataType, op ReduceOp, acc, x []byte) {
	n := min(len(acc), len(x)) / d.Size()
	switch d {
	case Int32:
		for i := 0; i < n; i++ {
			a := int32(binary.LittleEndian.Uint32(acc[4*i:]))
			b := int32(binary.LittleEndian.Uint32(x[4*i:]))
			switch op {
			case ReduceMin:
				a = min(a, b)
			case ReduceMax:
				a = max(a, b)
			default:
				a += b
			}
			binary.LittleEndian.PutUint32(acc[4*i:], uint32(a))
		}
	case FP32:
		for i := 0; i < n; i++ {
			a := math.Float32frombits(binary.LittleEndian.Uint32(acc[4*i:]))
			b := math.Float32frombits(binary.LittleEndian.Uint32(x[4*i:]))
			binary.LittleEndian.PutUint32(acc[4*i:], math.Float32bits(combine(op, a, b)))
		}
	default:
		for i := 0; i < n; i++ {
			a := half2f(d, binary.LittleEndian.Uint16(acc[2*i:]))
			b := half2f(d, binary.LittleEndian.Uint16(x[2*i:]))
			binary.LittleEndian.PutUint16(acc[2*i:], f2half(d, combine(op, a, b)))
		}
	}
}

func combine(op ReduceOp, a, b float32) float32 {
	switch op {
	case ReduceMin:
		if b < a {
			return b
		}
		return a
	case ReduceMax:
		if b > a {
			return b
		}
		return a
	}
	return a + b
}

func half2f(d DataType, h uint16) float32 {
	if d == BF16 {
		return kernels.BF16ToFloat32(h)
	}
	return ref.FP16ToFloat32(h)
}

func f2half(d DataType, f float32) uint16 {
	if d == BF16 {
		return kernels.Float32ToBF16(f)
	}
	return ref.Float32ToFP16(f)
}
