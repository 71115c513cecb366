package core

import (
	"math"
	"strconv"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/nccl"
)

// DataType is an ncclDataType_t; RedOp an ncclRedOp_t.
type (
	DataType int
	RedOp    int
)

// NCCL's enumerators (nccl.h; values checked by the ABI test).
const (
	Int8       DataType = 0
	Uint8      DataType = 1
	Int32      DataType = 2
	Uint32     DataType = 3
	Int64      DataType = 4
	Uint64     DataType = 5
	Float16    DataType = 6
	Float32    DataType = 7
	Float64    DataType = 8
	Bfloat16   DataType = 9
	Float8e4m3 DataType = 10
	Float8e5m2 DataType = 11
	NumTypes            = 12

	Sum    RedOp = 0
	Prod   RedOp = 1
	Max    RedOp = 2
	Min    RedOp = 3
	Avg    RedOp = 4
	NumOps       = 5
)

// Size is the element size in bytes (0 for an unknown type).
func (d DataType) Size() int {
	switch d {
	case Int8, Uint8, Float8e4m3, Float8e5m2:
		return 1
	case Float16, Bfloat16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

// native is the collectives type of d, if it has one.
func (d DataType) native() (collectives.DataType, bool) {
	switch d {
	case Float16:
		return collectives.FP16, true
	case Float32:
		return collectives.FP32, true
	case Bfloat16:
		return collectives.BF16, true
	case Float8e4m3:
		return collectives.FP8E4M3, true
	}
	return 0, false
}

func (o RedOp) native() collectives.Op {
	switch o {
	case Prod:
		return collectives.Prod
	case Max:
		return collectives.Max
	case Min:
		return collectives.Min
	case Avg:
		return collectives.Avg
	}
	return collectives.Sum
}

func (d DataType) String() string {
	names := [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"}
	if d >= 0 && int(d) < len(names) {
		return names[d]
	}
	return "datatype(" + strconv.Itoa(int(d)) + ")"
}

func (o RedOp) String() string {
	names := [...]string{"sum", "prod", "max", "min", "avg"}
	if o >= 0 && int(o) < len(names) {
		return names[o]
	}
	return "redop(" + strconv.Itoa(int(o)) + ")"
}

// bytesOf is count elements of d times mult, or an error when that does
// not fit an int (NCCL's count overflow).
func bytesOf(count uint64, d DataType, mult int) (int, *Error) {
	sz := uint64(d.Size())
	if count > math.MaxInt64/sz/uint64(mult) {
		return 0, errorf(InvalidArgument, "count %d of %s overflows (x%d ranks)", count, d, mult)
	}
	return int(count * sz * uint64(mult)), nil
}

func ncclType(d DataType) nccl.DataType { return nccl.DataType(d) }
func ncclOp(o RedOp) nccl.RedOp         { return nccl.RedOp(o) }
