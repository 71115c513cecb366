package kernels

import (
	"math"
	"strconv"
	"strings"
)

// SpillStores reads a ptxas -v log (Compiled.Log of a module compiled with
// "-Xptxas", "-v") into the bytes of spill stores of each entry function
// ("Compiling entry function 'name'"), adding those of the functions it
// calls that ptxas reports under it; an entry with no spill maps to 0. A
// figure ptxas prints in a form this cannot read counts as math.MaxInt,
// so that a check against a bound fails rather than passes.
func SpillStores(log string) map[string]int {
	spills := map[string]int{}
	entry := ""
	for _, line := range strings.Split(log, "\n") {
		if i := strings.Index(line, "Compiling entry function '"); i >= 0 {
			entry, _, _ = strings.Cut(line[i+len("Compiling entry function '"):], "'")
			spills[entry] += 0
			continue
		}
		i := strings.Index(line, " bytes spill stores")
		if i < 0 || entry == "" {
			continue
		}
		f := strings.Fields(line[:i])
		n, err := strconv.Atoi(f[len(f)-1])
		if err != nil || spills[entry] > math.MaxInt-n {
			spills[entry] = math.MaxInt
			continue
		}
		spills[entry] += n
	}
	return spills
}
