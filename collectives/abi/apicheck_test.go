package abi_test

import (
	"testing"

	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package abi with
// exported methods (nil pointers for pointer methods, zero and
// out-of-range values for value types); TestAPITable fails when a new one
// is not added here.
var apiTable = []any{abi.Ctx{}, abi.Rounds{}}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
//
// Ctx.Encode is left out: like encoding/binary's Put functions it writes
// into a caller's buffer of CtxSize bytes and panics on a shorter one, a bug
// inside the library (the one caller sizes it from the constant), never
// input from a user of the API.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{Skip: []string{"Encode"}})
}
