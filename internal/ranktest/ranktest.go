// Package ranktest holds what the multi-rank tests share: checking the
// results of every rank together. Test support only (internal/layers).
package ranktest

// T is what NoErrors needs of a test (*testing.T and *testing.B have it).
type T interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

// NoErrors reports every rank's error (errs[r] is rank r's), then stops
// the test if there was any. Checking rank by rank and stopping at the
// first would hide the cause whenever it is not rank 0's: when one rank
// fails or hangs, the others usually time out waiting for it, and those
// timeouts come first in rank order.
func NoErrors(t T, errs []error) {
	t.Helper()
	failed := 0
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d ranks failed", failed, len(errs))
		t.FailNow()
	}
}
