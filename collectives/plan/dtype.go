package plan

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/dtype"
	"github.com/goep-dev/goep/kernels"
)

// DataType is the element type of a plan execution (goep's one
// dtype.DType; reductions depend on it, copies do not).
type DataType = dtype.DType

// The element types the executors run.
const (
	BF16  = dtype.BF16
	FP16  = dtype.FP16
	FP32  = dtype.FP32
	Int32 = dtype.I32
)

// DataTypes lists the types the executors run.
var DataTypes = []DataType{BF16, FP16, FP32, Int32}

// ParseDataType accepts bf16, fp16, fp32 and int32.
func ParseDataType(s string) (DataType, error) { return dtype.ParseOf(s, DataTypes) }

// Runs reports whether the executors run d (fp8 has no plan executor).
func Runs(d DataType) error {
	if !dtype.In(d, DataTypes) {
		return fmt.Errorf("plans run %s, not %s", dtype.List(DataTypes), d)
	}
	return nil
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
