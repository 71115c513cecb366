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
	// The table of every exported type with methods (the guard fails when
	// a new one is not added).
	apicheck.Cover(t, ".", []any{(*Executor)(nil)}, apicheck.Options{})
	require.ErrorIs(t, (*Executor)(nil).Run(t.Context(), Args{}), errNilExecutor)
}
