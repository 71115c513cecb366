package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/nccl/nccltest"
)

// buildShim builds libgoep_nccl.so as `make nccl-shim` does, into dir.
func buildShim(t *testing.T, dir string) string {
	t.Helper()
	for _, tool := range []string{"gcc", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s (the test builds the library)", tool)
		}
	}
	so := filepath.Join(dir, "libgoep_nccl.so")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", so, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build -buildmode=c-shared:\n%s", out)
	return so
}

// TestCProgram builds the shim and testdata/shimtest.c, an NCCL program in
// C whose two ranks are threads on goep's host backend, and runs it with
// the NCCL stand-in and a plan (every path: plan, native, NCCL, staged),
// then with NCCL missing (the calls that need it fail, naming it; the
// others still run).
func TestCProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a shared library")
	}
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	dir := t.TempDir()
	so := buildShim(t, dir)
	bin := filepath.Join(dir, "shimtest")
	out, err := exec.Command("gcc", "-O1", "-Wall", "-o", bin, filepath.Join("testdata", "shimtest.c"),
		"-L"+dir, "-lgoep_nccl", "-Wl,-rpath,"+dir, "-lpthread").CombinedOutput()
	require.NoError(t, err, "gcc:\n%s", out)
	require.FileExists(t, so)

	fake, err := nccltest.BuildFake(t.TempDir())
	require.NoError(t, err)
	plans := t.TempDir()
	data, err := os.ReadFile(filepath.Join("..", "collectives", "plan", "testdata", "plans", "reduce.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(plans, "reduce.json"), data, 0o644))

	run := func(mode string, env ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, mode)
		cmd.Env = append(os.Environ(), "GOEP_NCCL_BACKEND=host", "GOEP_BOOTSTRAP_TIMEOUT=60s", "GOEP_NCCL_DEBUG=1")
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		t.Logf("shimtest %s:\n%s", mode, out)
		require.NoError(t, err, "shimtest %s failed", mode)
		require.Contains(t, string(out), "\nok\n")
		return string(out)
	}
	out1 := run("fake", "GOEP_NCCL="+fake, "GOEP_NCCL_PLANS="+plans)
	// GOEP_NCCL_DEBUG=1: the counts at finalize, and the unsupported call.
	require.Contains(t, out1, "goep-nccl: rank 0/2 (host): allreduce: plan 1, native 1, nccl 1")
	require.Contains(t, out1, "ncclRedOpDestroy is not supported")
	out2 := run("nonccl", "GOEP_NCCL=/nonexistent/libnccl.so.2", "GOEP_NCCL_PLANS="+plans)
	require.True(t, strings.Contains(out2, "/nonexistent/libnccl.so.2"), "the missing library is named")

	// As under PyTorch: the program links NCCL (here the stand-in, first;
	// the shim after it only for what the stand-in lacks) and the shim is
	// preloaded. Its symbols win, and it finds the NCCL the program loaded
	// by its soname, without GOEP_NCCL.
	linked := filepath.Join(dir, "shimtest-linked")
	out, err = exec.Command("gcc", "-O1", "-o", linked, filepath.Join("testdata", "shimtest.c"),
		"-L"+filepath.Dir(fake), "-l:libnccl.so.2", "-Wl,-rpath,"+filepath.Dir(fake), "-L"+dir, "-lgoep_nccl", "-Wl,-rpath,"+dir, "-lpthread").CombinedOutput()
	require.NoError(t, err, "gcc:\n%s", out)
	bin = linked
	run("fake", "LD_PRELOAD="+so, "GOEP_NCCL_PLANS="+plans)
}
