package devapi

import (
	"testing"

	"github.com/goep-dev/goep/internal/apicheck"
)

// apiTable is one value of every exported type of package devapi with
// exported methods (nil pointers for pointer methods, zero and
// out-of-range values for value types); TestAPITable fails when a new one
// is not added here.
var apiTable = []any{(*Spin)(nil), &Spin{}, Fifo{}, MemoryChannel{}, PortChannel{}, Semaphore{}, Trigger{}, Watchdog{}}

// 1 (issue 18). Every exported method answers on a nil receiver and on a
// zero value without a panic.
//
// Encode is left out: like encoding/binary's Put functions it writes into a
// caller's buffer of the documented size (SemaphoreSize, FifoSize, ...) and
// panics on a shorter one, a bug inside the library (every caller sizes the
// buffer from the same constant), never input from a user of the API.
func TestAPITable(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{Skip: []string{"Encode"}})
}
