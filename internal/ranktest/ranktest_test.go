package ranktest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// recorder stands in for *testing.T.
type recorder struct {
	errors  []string
	stopped bool
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) FailNow() { r.stopped = true }

func TestNoErrorsReportsEveryRank(t *testing.T) {
	var rec recorder
	NoErrors(&rec, []error{errors.New("timed out waiting on rank 2"), nil, errors.New("peer gone"), nil})
	assert.Equal(t, []string{"rank 0: timed out waiting on rank 2", "rank 2: peer gone", "2 of 4 ranks failed"}, rec.errors)
	assert.True(t, rec.stopped)
}

func TestNoErrorsPassesCleanRanks(t *testing.T) {
	for _, errs := range [][]error{nil, {}, {nil, nil, nil}} {
		var rec recorder
		NoErrors(&rec, errs)
		assert.Empty(t, rec.errors)
		assert.False(t, rec.stopped)
	}
}
