package lowlatency_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/lowlatency"
)

// apiTable is one value of every exported type of package lowlatency with
// exported methods (nil pointers for pointer methods, zero values for value
// types); TestAPITable fails when a new one is not added here.
var apiTable = []any{
	(*lowlatency.Workspace)(nil), (*lowlatency.Connection)(nil),
	lowlatency.Config{}, lowlatency.Format(0), lowlatency.Format(-1), lowlatency.RankInput{}, lowlatency.RankRecv{},
	lowlatency.Region{}, lowlatency.KernelTrace{},
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
