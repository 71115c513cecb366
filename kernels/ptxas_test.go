package kernels

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpillStores(t *testing.T) {
	log := `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_90'
ptxas info    : Function properties for a
ptxas         .     96 bytes stack frame, 10 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, 40 bytes smem
ptxas info    : Function properties for helper
ptxas         .     0 bytes stack frame, 6 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'b' for 'sm_90'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'c' for 'sm_90'
ptxas         .     0 bytes stack frame, x bytes spill stores, 0 bytes spill loads
`
	require.Equal(t, map[string]int{"a": 16, "b": 0, "c": math.MaxInt}, SpillStores(log))
	require.Empty(t, SpillStores(""))
}
