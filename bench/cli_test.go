package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// readJSON decodes the JSON report a command wrote at path (--json).
func readJSON[T any](t testing.TB, path string) T {
	t.Helper()
	var v T
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &v))
	return v
}

func TestUnknownCommandAndHelp(t *testing.T) {
	code, _, stderr := run(t, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown command "frobnicate"`)
	code, stdout, _ := run(t, "help")
	require.Equal(t, 0, code)
	for _, c := range []string{"doctor", "kernels", "launch"} {
		require.Contains(t, stdout, c)
	}
	code, _, _ = run(t, "doctor", "--no-such-flag")
	require.Equal(t, 1, code)
}

func TestDoctorOnHostBackendPasses(t *testing.T) {
	t.Setenv("GOEP_KERNEL_CACHE", t.TempDir())
	code, stdout, stderr := run(t, "doctor", "--backend", "host", "--mib", "1", "--json", filepath.Join(t.TempDir(), "r.json"))
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Contains(t, stdout, "12/12 ordered pairs read back correctly")
	require.Contains(t, stdout, "doctor: all checks passed")
}

func TestDoctorRejectsBadLauncherEnvironment(t *testing.T) {
	for _, env := range [][2]string{{"RANK", "abc"}, {"RANK", "4"}} {
		t.Setenv("WORLD_SIZE", "2")
		t.Setenv("MASTER_ADDR", "127.0.0.1")
		t.Setenv("MASTER_PORT", "29999")
		t.Setenv(env[0], env[1])
		code, _, stderr := run(t, "doctor", "--backend", "host")
		require.Equal(t, 1, code)
		require.Contains(t, stderr, "RANK")
	}
}

func TestDoctorUnreachableMasterIsBounded(t *testing.T) {
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "2")
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", "1") // nothing listens there
	t.Setenv("GOEP_BOOTSTRAP_TIMEOUT", "2s")
	code, _, stderr := run(t, "doctor", "--backend", "host")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "127.0.0.1:1")
}

func TestKernelsCompilesEveryModule(t *testing.T) {
	if os.Getenv("GOEP_REQUIRE_NVRTC") == "" {
		if code, _, stderr := run(t, "kernels", "--cache", "off"); code != 0 {
			t.Skipf("no NVRTC here: %s", stderr)
		}
	}
	code, stdout, stderr := run(t, "kernels", "--arch", "sm_90", "--cache", t.TempDir())
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "doctor")
	require.Contains(t, stdout, "compiled")
}
