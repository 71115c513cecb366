package lowlatency_test

// The real kernels/lowlatency.cu on CPU threads (internal/cpuemu), on
// goroutine ranks, against the same reference and scenarios as the host
// backend (smaller grids: every emulated thread is an OS thread).

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/lowlatency"
)

func emuDevices(t *testing.T, n int) []device.Device {
	devs := make([]device.Device, n)
	for i := range devs {
		d, err := cpuemu.Open(i, cpuemu.Options{SMs: 132})
		require.NoError(t, err)
		devs[i] = d
		t.Cleanup(func() { _ = d.Close() })
	}
	return devs
}

func TestEmulatedKernels(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	// The common cases run the specialised kernels; two of them again on
	// the general kernels (LaunchConfig.General), whose common path the
	// other cases (rank-major, elastic, nodes) do not reach.
	all := cases()
	for _, c := range all {
		if c.name == "bf16-random" || c.name == "fp8-split" {
			c.name, c.general = "general-"+c.name, true
			all = append(all, c)
		}
	}
	for _, c := range all {
		t.Run(c.name, func(t *testing.T) {
			// At most about 2048 threads a launch run at once: ranks x
			// blocks x threads stays below.
			c.cfg = lowlatency.LaunchConfig{NumSMs: 2, Threads: 64}
			if c.ranks > 4 {
				c.cfg = lowlatency.LaunchConfig{NumSMs: 1, Threads: 64}
			}
			// More blocks than local experts: several blocks share an
			// expert's rows in the dispatch receive (3 parts of 3
			// experts on 9 blocks; 2 parts of 4 experts on 8, UE8M0).
			switch c.name {
			case "one-rank":
				c.cfg.NumSMs = 9
			case "ue8m0-ids32":
				c.cfg.NumSMs = 8
			case "few-tokens":
				c.cfg.NumSMs = 5
			}
			c.cfg.General = c.general
			g := newGroup(t, emuDevices(t, c.ranks), c.config(), 60*time.Second, 0)
			runCase(t, g, c)
		})
	}
}

// Every kernel of lowlatency.cu ran above.
func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"lowlatency.cu"}, nil)
}
