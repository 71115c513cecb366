package collectives_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/internal/fakenccl"
	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
)

// world is a set of goroutine ranks: the host backend always (CI), GPUs
// when this machine has enough.
type world struct {
	kind  device.Kind
	ranks int
}

func (w world) String() string { return fmt.Sprintf("%s-%d", w.kind, w.ranks) }
func (w world) gpu() bool      { return w.kind == device.CUDA }

// gpus is the number of GPUs here (0 without a driver).
func gpus() int {
	n, err := device.CUDADeviceCount()
	if err != nil {
		return 0
	}
	return n
}

// hostWorlds are the CI worlds.
var hostWorlds = []world{{device.Host, 2}, {device.Host, 3}, {device.Host, 4}}

// gpuWorlds are 2, 4 and 8 ranks on the GPUs this machine has (several
// ranks to a GPU when there are fewer GPUs than ranks).
func gpuWorlds(t *testing.T) []world {
	n := gpus()
	if n == 0 {
		t.Logf("cuda worlds skipped: no CUDA GPU")
		return nil
	}
	return []world{{device.CUDA, 2}, {device.CUDA, 4}, {device.CUDA, 8}}
}

// testWait bounds device waits, so a broken protocol fails in seconds.
const testWait = 30 * time.Second

// hostConfig keeps the host backend's twins cheap: small grids and
// buffers. Scratch 256 KiB with 4 blocks makes multi-round scratch
// algorithms from a few KiB on.
func hostConfig() collectives.Config {
	return collectives.Config{
		Channels:     channels.Config{Timeouts: channels.Timeouts{Wait: testWait}},
		ScratchBytes: 256 << 10, PacketBytes: 1 << 20, MaxBlocks: 4, LLMaxBlocks: 2, Threads: 64,
		NCCL: collectives.NCCLLazy,
	}
}

// gpuConfig creates NCCL with the communicator when it can be loaded (not
// lazily inside a captured call).
// gpuConfig is the GPU configuration for ranks ranks: NCCL eagerly when it
// loads and every rank has a GPU of its own (NCCL refuses ranks that share
// one).
func gpuConfig(ranks int) collectives.Config {
	cfg := collectives.Config{Channels: channels.Config{Timeouts: channels.Timeouts{Wait: testWait}}, NCCL: collectives.NCCLOff}
	if ncclRuns(world{device.CUDA, ranks}) {
		cfg.NCCL = collectives.NCCLEager
	}
	return cfg
}

// ncclRuns: the real NCCL can run w (GPUs, NCCL loads, a GPU per rank).
func ncclRuns(w world) bool { return w.gpu() && realNCCL && w.ranks <= gpus() }

func configFor(w world) collectives.Config {
	if w.gpu() {
		return gpuConfig(w.ranks)
	}
	return hostConfig()
}

// run runs fn on every rank of w and fails the test with each rank's
// error.
func run(t *testing.T, w world, cfg collectives.Config, fn func(ctx context.Context, c *collectives.Communicator) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	errs := colltest.RunLocal(ctx, w.kind, w.ranks, bootstrap.Config{Timeout: time.Minute}, cfg, fn)
	// Every rank's error, not only the first: a rank's failure often shows
	// on its peers as "peer is gone", which hides the cause.
	failed := false
	for r, err := range errs {
		if err != nil {
			t.Errorf("%s rank %d: %v", w, r, err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
}

// fakeNCCLPath is the host-memory NCCL stand-in, built by TestMain when no
// GPU is present (one NCCL per process: with GPUs, the real one).
var fakeNCCLPath string

// realNCCL: GPUs are present and NCCL loads.
var realNCCL bool

func TestMain(m *testing.M) {
	// The fingerprint A/B switch ($GOEP_BENCH_NO_FINGERPRINT=1: kernels
	// compiled without it, measurement only), set before any kernel is
	// compiled; the benchmarks print the mode they ran.
	if err := kernelflags.ApplyEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if kernelflags.NoFingerprint() {
		fmt.Fprintln(os.Stderr, "collectives tests: "+kernelflags.Mode())
	}
	if gpus() == 0 && os.Getenv(nccl.EnvLibrary) == "" {
		dir, err := os.MkdirTemp("", "fakenccl")
		if err == nil {
			if p, err := fakenccl.Build(dir); err == nil {
				fakeNCCLPath = p
				os.Setenv(nccl.EnvLibrary, p)
				collectives.UseHostNCCLForTests()
			} else {
				fmt.Fprintln(os.Stderr, "fake NCCL not built:", err)
			}
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	if _, err := nccl.Load(); err == nil {
		realNCCL = true
	} else {
		fmt.Fprintln(os.Stderr, "NCCL not available, its cases are skipped:", err)
	}
	os.Exit(m.Run())
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// hostPtr is the address of a Go slice (host memory) for pointer checks.
func hostPtr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
