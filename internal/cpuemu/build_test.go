package cpuemu

import (
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/kernels"
)

// needCompiler skips when no C++ compiler is installed (CI installs g++).
func needCompiler(t *testing.T) {
	t.Helper()
	SkipUnavailable(t)
}

// emulated are the modules the emulated tests run; each must build, and
// none may hold inline PTX the emulation does not translate.
var emulated = []string{"layout.cu", "ep_convert.cu", "intranode.cu", "lowlatency.cu", "coll_ll.cu", "coll_bulk.cu", "coll_util.cu",
	"channel_kernels.cu", "port_kernels.cu", "proxy_kernels.cu", "plan_exec.cu", "doctor.cu", "internode.cu"}

func TestEveryEmulatedModuleBuilds(t *testing.T) {
	needCompiler(t)
	src := kernels.Sources()
	for _, f := range emulated {
		t.Run(f, func(t *testing.T) {
			ks := kernelRE.FindAllStringSubmatch(src[f], -1)
			require.NotEmpty(t, ks, "%s defines no kernel", f)
			unk, err := Unknown(ks[0][1])
			require.NoError(t, err)
			require.Empty(t, unk, "inline PTX the emulation does not translate (add a rule to ptxRules)")
		})
	}
}

func TestEveryCUFileIsKnown(t *testing.T) {
	var files []string
	for n := range kernels.Sources() {
		if strings.HasSuffix(n, ".cu") {
			files = append(files, n)
		}
	}
	sort.Strings(files)
	// Not emulated: sem_lab.cu and ce_lab.cu measure GPUs; intranode_tma.cu
	// is Hopper's bulk-copy engine (its plain build is intranode.cu's kernel).
	skip := map[string]bool{"sem_lab.cu": true, "ce_lab.cu": true, "intranode_tma.cu": true}
	for _, f := range files {
		if !skip[f] {
			require.Contains(t, emulated, f, "a new kernel source: add it to the emulated modules and give it an emulated test")
		}
	}
}
