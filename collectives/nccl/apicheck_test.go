package nccl

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package nccl with
// exported methods (nil pointers for pointer methods, zero and
// out-of-range values for value types); TestAPITable fails when a new one
// is not added here.
var apiTable = []any{(*Comm)(nil), (*Error)(nil), (*Library)(nil), DataType(0), DataType(-1), DataType(1 << 20), RedOp(0), RedOp(-1), RedOp(1 << 20)}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
