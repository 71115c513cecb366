package intranode_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/goep-dev/goep/internal/kernelflags"
)

// TestMain applies the fingerprint A/B switch ($GOEP_BENCH_NO_FINGERPRINT=1:
// kernels compiled without the call fingerprint, for measurement only)
// before any kernel is compiled; BenchmarkGPU prints the mode it ran.
func TestMain(m *testing.M) {
	if err := kernelflags.ApplyEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if kernelflags.NoFingerprint() {
		fmt.Fprintln(os.Stderr, "intranode tests: "+kernelflags.Mode())
	}
	os.Exit(m.Run())
}
