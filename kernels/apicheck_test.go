package kernels_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/kernels"
)

// apiTable is one value of every exported type of package kernels with
// exported methods; TestAPITable fails when a new one is not added here.
var apiTable = []any{(*kernels.Compiler)(nil), (*kernels.CompileError)(nil), kernels.Target{}, &kernels.CompileError{}}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
