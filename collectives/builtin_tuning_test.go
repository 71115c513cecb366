package collectives

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The embedded tables load, validate, and are picked by GPU name and world
// size only.
func TestBuiltinTuningTables(t *testing.T) {
	for _, world := range []int{2, 4} {
		tab, err := builtinTuning("NVIDIA H200", world)
		require.NoError(t, err)
		require.NotNil(t, tab, "world %d", world)
		assert.Equal(t, world, tab.World)
		assert.NotEmpty(t, tab.Rules)
		// Every collective has a rule for the largest sizes.
		for _, coll := range []string{"allreduce", "allgather", "reducescatter"} {
			open := false
			for _, r := range tab.Rules {
				open = open || (r.Collective == coll && r.MaxBytes == 0)
			}
			assert.True(t, open, "world %d: %s has no rule without a size bound", world, coll)
		}
	}
	for _, c := range []struct {
		device string
		world  int
	}{{"NVIDIA H200", 8}, {"NVIDIA H100 80GB HBM3", 4}, {"host", 2}} {
		tab, err := builtinTuning(c.device, c.world)
		require.NoError(t, err)
		assert.Nil(t, tab, "%s, %d ranks", c.device, c.world)
	}
}
