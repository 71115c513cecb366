package intranode_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/intranode"
)

// apiTable is one value of every exported type of package intranode with
// exported methods (nil pointers for pointer methods, zero values for value
// types); TestAPITable fails when a new one is not added here.
var apiTable = []any{
	(*intranode.Workspace)(nil), (*intranode.MismatchError)(nil),
	intranode.Config{}, intranode.CopyMode(0), intranode.CopyMode(-1), intranode.Fingerprint{}, intranode.Layout{},
	intranode.RankInput{}, intranode.RankOutput{}, intranode.Region{}, intranode.Shape{},
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
}
