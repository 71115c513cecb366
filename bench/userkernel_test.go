package bench

import (
	"strings"
	"testing"

	"github.com/goep-dev/goep/internal/cpuemu"
)

// Without a GPU, `ep-bench userkernel` runs the tutorial's user kernel in
// the CPU emulation and reports both channel kinds checked; bad flags are
// refused.
func TestUserKernelCommand(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	code, out, errOut := run(t, "userkernel", "--backend", "host", "--ranks", "2", "--rounds", "2", "--slice", "1000")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	for _, want := range []string{"CPU emulation", "port   checked", "memory checked", "2 ranks"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{
		{"--backend", "host", "--channels", "nvls"},
		{"--backend", "host", "--rounds", "-1"},
		{"--backend", "host", "--slice", "1,2"},
		{"--backend", "host", "--ranks", "1"},
	} {
		if code, _, _ := run(t, append([]string{"userkernel"}, args...)...); code == 0 {
			t.Errorf("userkernel %v was accepted", args)
		}
	}
}

// Without g++ the host run says plainly that user kernels need a GPU.
func TestUserKernelCommandWithoutCompilerRefuses(t *testing.T) {
	t.Setenv("CXX", "goep-no-such-compiler")
	code, _, errOut := run(t, "userkernel", "--backend", "host", "--ranks", "2")
	if code == 0 || !strings.Contains(errOut, "user kernels need a GPU") {
		t.Fatalf("exit %d, stderr %q: want a refusal saying user kernels need a GPU", code, errOut)
	}
}
