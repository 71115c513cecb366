package cuda_test

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/cuda"
)

// apiTable is one value of every exported type of package cuda with
// exported methods (nil pointers for pointer methods, zero values for value
// types: a zero Device or MemPool names no GPU, and without a driver every
// call answers an error); TestAPITable fails when a new one is not added
// here.
var apiTable = []any{
	(*cuda.Context)(nil), (*cuda.DriverError)(nil), (*cuda.Error)(nil), (*cuda.Event)(nil), (*cuda.Function)(nil),
	(*cuda.Graph)(nil), (*cuda.GraphExec)(nil), (*cuda.HostBuffer)(nil), (*cuda.KernelArgs)(nil), (*cuda.Module)(nil),
	(*cuda.ModuleLoadError)(nil), (*cuda.Stream)(nil), (*cuda.VMMBuffer)(nil),
	cuda.Code(0), cuda.Code(-12345), cuda.Device{}, cuda.DevicePtr(0), cuda.MemPool{}, cuda.MemoryType(0), cuda.MemoryType(-1),
}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic (on a GPU machine too: a zero Device is
// ordinal 0 and a zero handle is refused by the driver or by the wrapper).
// KernelArgs.Struct is left out: it panics on an alignment that is not a
// power of two by design (a programming error in a launch site, tested by
// TestKernelArgsStructBadAlign; it is not reachable from the library's API).
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{Skip: []string{"Struct"}})
	var a *cuda.KernelArgs
	b := a.Ptr(1).U32(2)
	if b.Len() != 2 || b.Offset(1) != 8 || b.Offset(2) != -1 {
		t.Errorf("a chain begun on a nil KernelArgs: %d parameters, offsets %d %d (want 2, 8, -1)", b.Len(), b.Offset(1), b.Offset(2))
	}
}
