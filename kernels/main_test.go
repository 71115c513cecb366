package kernels

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goep-dev/goep/internal/nvrtc"
)

// childEnv selects a child mode when the test binary re-executes itself
// (see TestConcurrentProcessesShareOneCompile).
const childEnv = "GOEP_KERNELS_TEST_CHILD"

type childResult struct {
	Compiled  bool   `json:"compiled"`
	CUBINHash string `json:"cubin_sha256"`
	Path      string `json:"path"`
	Micros    int64  `json:"micros"`
	Err       string `json:"err,omitempty"`
}

func TestMain(m *testing.M) {
	// The owners of the modules (intranode, routing, collectives, ...) sit
	// above this package, so its tests register every embedded .cu under its
	// file's name with the kernels the file defines, as the owners would.
	for _, mod := range sourceModules(nil) {
		Register(mod)
	}
	if os.Getenv(childEnv) == "compile" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild waits for the start time the parent set, compiles the doctor
// module into $GOEP_KERNEL_CACHE and prints one JSON line.
func runChild() int {
	if at := os.Getenv(childEnv + "_START"); at != "" {
		var ns int64
		fmt.Sscan(at, &ns)
		time.Sleep(time.Until(time.Unix(0, ns)))
	}
	var res childResult
	m, _ := ModuleByName("doctor")
	c := NewCompiler(Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	out, err := c.Compile(m, SM90)
	if err != nil {
		res.Err = err.Error()
	} else {
		sum := sha256.Sum256(out.CUBIN)
		res.Compiled = !out.FromCache
		res.CUBINHash = hex.EncodeToString(sum[:])
		res.Path = out.Path
		res.Micros = out.Duration.Microseconds()
	}
	json.NewEncoder(os.Stdout).Encode(res)
	if err != nil {
		return 1
	}
	return 0
}

// sourceModules is one module per embedded .cu file, named after the file,
// with the kernels the file defines: the test-only stand-in for the owners'
// registrations.
func sourceModules(t testing.TB) []Module {
	var out []Module
	for _, n := range sourceNames() {
		if !strings.HasSuffix(n, ".cu") {
			continue
		}
		ks, err := definedKernels(n)
		if err != nil || len(ks) == 0 {
			if t != nil {
				t.Fatalf("%s: kernels %v: %v", n, ks, err)
			}
			panic(fmt.Sprintf("%s: kernels %v: %v", n, ks, err))
		}
		out = append(out, Module{Name: strings.TrimSuffix(n, ".cu"), File: n, Kernels: ks})
	}
	return out
}

// needNVRTC skips the test when NVRTC cannot be loaded, unless
// GOEP_REQUIRE_NVRTC=1 (CI), where that is a failure.
func needNVRTC(t testing.TB) *nvrtc.Library {
	t.Helper()
	lib, err := nvrtc.Load()
	if err != nil {
		if os.Getenv("GOEP_REQUIRE_NVRTC") == "1" {
			t.Fatalf("GOEP_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: %v", err)
		}
		t.Skipf("NVRTC not available (set GOEP_REQUIRE_NVRTC=1 to make this a failure): %v", err)
	}
	return lib
}

// logRecorder is a slog handler that keeps records for assertions and
// echoes them to the test log.
type logRecorder struct {
	t    testing.TB
	mu   sync.Mutex
	recs []slog.Record
}

func newLogRecorder(t testing.TB) (*logRecorder, *slog.Logger) {
	r := &logRecorder{t: t}
	return r, slog.New(r)
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec.Clone())
	r.mu.Unlock()
	var b strings.Builder
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.t.Logf("log %s: %s%s", rec.Level, rec.Message, b.String())
	return nil
}

// count returns how many records at level contain substr in their message.
func (r *logRecorder) count(level slog.Level, substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}
