package dtype_test

import (
	"testing"

	"github.com/goep-dev/goep/dtype"
	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package dtype with
// exported methods (zero and out-of-range values); TestAPITable fails when
// a new one is not added here.
var apiTable = []any{dtype.DType(0), dtype.DType(255)}

// 1 (issue 18). Every exported method answers on any value without a
// panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
