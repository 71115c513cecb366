package gpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/apicheck"
)

// Class 1: a nil executor (also what NewExecutor makes of a nil
// communicator) answers every method with an error.
func TestNilExecutor(t *testing.T) {
	require.Nil(t, NewExecutor(nil))
	for _, f := range apicheck.Call((*Executor)(nil), apicheck.Options{}) {
		t.Error(f)
	}
	require.ErrorIs(t, (*Executor)(nil).Run(t.Context(), Args{}), errNilExecutor)
}
