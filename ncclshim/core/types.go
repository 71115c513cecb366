package core

import (
	"math"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/nccl"
)

// DataType is an ncclDataType_t and RedOp an ncclRedOp_t, as
// collectives/nccl declares them (their values are NCCL's, checked against
// nccl.h by the ABI test).
type (
	DataType = nccl.DataType
	RedOp    = nccl.RedOp
)

// nativeType is the collectives type of d, if it has one.
func nativeType(d DataType) (collectives.DataType, bool) {
	switch d {
	case nccl.Float16:
		return collectives.FP16, true
	case nccl.Float32:
		return collectives.FP32, true
	case nccl.Bfloat16:
		return collectives.BF16, true
	case nccl.Float8e4m3:
		return collectives.FP8E4M3, true
	}
	return 0, false
}

// nativeOp is the collectives reduction of o (Prod and Avg run on NCCL).
func nativeOp(o RedOp) collectives.Op {
	switch o {
	case nccl.Prod:
		return collectives.Prod
	case nccl.Max:
		return collectives.Max
	case nccl.Min:
		return collectives.Min
	case nccl.Avg:
		return collectives.Avg
	}
	return collectives.Sum
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
