package cuda

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadLibraryMissingPath(t *testing.T) {
	const path = "/nonexistent/goep/libcuda.so.1"
	err := loadLibrary(path, true)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoDriver))
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), LibraryEnv)
	var de *DriverError
	require.True(t, errors.As(err, &de))
	assert.True(t, de.Override)
}

func TestLoadLibraryNotADriver(t *testing.T) {
	// libc is on every Linux machine and has no cuGetProcAddress_v2.
	err := loadLibrary("libc.so.6", true)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoDriver))
	assert.Contains(t, err.Error(), "cuGetProcAddress_v2")
	assert.Contains(t, err.Error(), "libc.so.6")
}

func TestDriverErrorDefaultMessage(t *testing.T) {
	e := &DriverError{Path: DefaultLibrary, Reason: dlopenPrefix + "libcuda.so.1: cannot open shared object file"}
	assert.True(t, strings.HasPrefix(e.Error(),
		"libcuda.so.1 not found: no NVIDIA driver on this machine (set GOEP_LIBCUDA to override)"), e.Error())
	assert.True(t, errors.Is(e, ErrNoDriver))
}

// TestLoadWithoutDriver checks what Load reports on a machine without a
// usable driver (CI); on a GPU machine it checks that Load succeeds.
func TestLoadWithoutDriver(t *testing.T) {
	err := Load()
	if err == nil {
		v, err := DriverVersion()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, v, APIVersion)
		t.Logf("driver present, CUDA %d.%d", v/1000, v%1000/10)
		return
	}
	t.Logf("Load: %v", err)
	assert.True(t, errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoDevice), "unexpected error %v", err)
	if errors.Is(err, ErrNoDriver) && os.Getenv(LibraryEnv) == "" {
		assert.Contains(t, err.Error(), "libcuda.so.1 not found: no NVIDIA driver on this machine (set GOEP_LIBCUDA to override)")
	}
	// Everything that needs the driver reports the same error, without panicking.
	_, err2 := DeviceCount()
	assert.Equal(t, err, err2)
	_, err2 = GetDevice(0)
	assert.Equal(t, err, err2)
	_, err2 = DriverVersion()
	assert.Equal(t, err, err2)
	assert.Equal(t, err, Load(), "Load must be idempotent")
}

// runHelperProcess re-executes the test binary in helper mode.
func runHelperProcess(t *testing.T, mode string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestLoadOverrideInSubprocess(t *testing.T) {
	const path = "/nonexistent/goep-test/libcuda.so.1"
	out, err := runHelperProcess(t, "load", LibraryEnv+"="+path)
	require.NoError(t, err, "helper output:\n%s", out)
	assert.Contains(t, out, "load error: ")
	assert.Contains(t, out, path)
	assert.Contains(t, out, "(from GOEP_LIBCUDA)")
	assert.Contains(t, out, "no-driver: true")
}

func TestCallsWithoutDriverDoNotCrash(t *testing.T) {
	out, err := runHelperProcess(t, "noload", LibraryEnv+"=/nonexistent/goep-test/libcuda.so.1")
	require.NoError(t, err, "helper output:\n%s", out)
	for _, op := range []string{"cuDeviceGetName", "cuStreamCreateWithPriority", "cuMemAlloc", "cuPointerGetAttribute"} {
		assert.Contains(t, out, op+": ", "helper output:\n%s", out)
	}
	assert.Contains(t, out, "done")
}
