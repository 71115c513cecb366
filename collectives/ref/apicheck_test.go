package ref

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package ref with
// exported methods (nil pointers for pointer methods, zero and
// out-of-range values for value types); TestAPITable fails when a new one
// is not added here.
var apiTable = []any{Fill(0), Fill(1 << 30), Op(0), Op(1 << 30)}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
