package cpuemu

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// launches counts the emulated launches of each kernel in this process.
var launches sync.Map // kernel name -> *atomic.Int64

func countLaunch(kernel string) {
	c, _ := launches.LoadOrStore(kernel, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
}

// Launches is how many times kernel has run in the emulation in this
// process.
func Launches(kernel string) int64 {
	if c, ok := launches.Load(kernel); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// KernelsOf lists the kernels a .cu file of package kernels defines.
func KernelsOf(file string) ([]string, error) {
	src, ok := sources()[file]
	if !ok {
		return nil, fmt.Errorf("cpuemu: no kernel source %s", file)
	}
	var out []string
	for _, m := range kernelRE.FindAllStringSubmatch(src, -1) {
		out = append(out, m[1])
	}
	return out, nil
}

// CoverageTB is the part of testing.TB that CheckCoverage uses.
type CoverageTB interface {
	TB
	Errorf(format string, args ...any)
}

// CheckCoverage fails t when a kernel of files (other than those in
// except, which say why they are left out) has not run in the emulation in
// this process. Put it after a package's emulated tests; it skips when
// none of them ran (a -run that selected it alone).
func CheckCoverage(t CoverageTB, files []string, except map[string]string) {
	t.Helper()
	var missing []string
	ran := 0
	for _, f := range files {
		ks, err := KernelsOf(f)
		if err != nil {
			t.Fatalf("%v", err)
		}
		for _, k := range ks {
			if Launches(k) > 0 {
				ran++
			} else if _, ok := except[k]; !ok {
				missing = append(missing, k)
			}
		}
	}
	if ran == 0 {
		t.Skipf("no kernel of %v ran in the emulation in this process (run the package's emulated tests with it)", files)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("kernels of %v that no emulated test ran: %s (add a test, or an exception that says why)",
			files, strings.Join(missing, ", "))
	}
}
