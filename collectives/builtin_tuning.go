package collectives

import (
	"embed"
	"io/fs"
	"strings"
)

// Tuning tables measured by `ep-bench collectives --compare nccl --tune` on
// our machines (docs/PERFORMANCE.md), used when neither Config.Tuning nor
// $GOEP_COLL_TUNING names one and the GPU and world size match a table:
// with them the selector is never slower than NCCL at any measured size.
//
//go:embed tuning/*.json
var builtinTables embed.FS

// builtinTuning returns the embedded table for device (the GPU's name) and
// world, or nil.
func builtinTuning(device string, world int) (*Tuning, error) {
	files, err := fs.Glob(builtinTables, "tuning/*.json")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := builtinTables.ReadFile(f)
		if err != nil {
			return nil, err
		}
		t, err := parseTuning(b, "built-in tuning table "+f)
		if err != nil {
			return nil, err
		}
		if t.World == world && strings.EqualFold(t.Device, device) {
			return t, nil
		}
	}
	return nil, nil
}
