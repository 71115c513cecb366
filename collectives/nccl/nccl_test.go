package nccl

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/internal/fakenccl"
	"github.com/goep-dev/goep/internal/dl"
)

// TestMain points $GOEP_NCCL at the host-memory stand-in when this machine
// has no NCCL of its own request (the loader is process-wide: one library).
var fake string

func TestMain(m *testing.M) {
	if os.Getenv(EnvLibrary) == "" && os.Getenv("GOEP_NCCL_TEST_REAL") == "" {
		dir, err := os.MkdirTemp("", "fakenccl")
		if err == nil {
			if p, err := fakenccl.Build(dir); err == nil {
				fake = p
				os.Setenv(EnvLibrary, p)
			}
			defer os.RemoveAll(dir)
		}
	}
	code := m.Run()
	os.Exit(code)
}

func TestCandidatesCoverPipWheels(t *testing.T) {
	files := map[string]bool{
		"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2": true,
		"/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2":       true,
		"/home/u/.local/lib/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2":   true,
		"/cuda/lib64/libnccl.so.2": true,
	}
	glob := func(pat string) ([]string, error) {
		var out []string
		for f := range files {
			if ok, _ := filepath.Match(pat, f); ok {
				out = append(out, f)
			}
		}
		sort.Strings(out)
		return out, nil
	}
	env := map[string]string{"CUDA_HOME": "/cuda"}
	got := searchSpec.Candidates(dl.Env{Getenv: func(k string) string { return env[k] }, Glob: glob, Home: func() (string, error) { return "/home/u", nil }})
	require.Equal(t, Soname, got[0], "the dynamic loader's search comes first")
	for f := range files {
		require.Contains(t, got, f)
	}
	require.Less(t, indexOf(got, "/cuda/lib64/libnccl.so.2"), indexOf(got, "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"))
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestMissingLibraryIsAClearError(t *testing.T) {
	none := func(string) ([]string, error) { return nil, nil }
	t.Setenv("NCCL_NVLS_ENABLE", "0")
	_, err := load(searchSpec, dl.Env{Getenv: func(k string) string {
		if k == EnvLibrary {
			return "/nonexistent/libnccl.so.2"
		}
		return ""
	}, Glob: none, Home: os.UserHomeDir})
	require.ErrorIs(t, err, ErrNotFound)
	require.Contains(t, err.Error(), "/nonexistent/libnccl.so.2")
	t.Log(err)

	// Without the override, every place is named.
	spec := searchSpec
	spec.Sonames = []string{"libnccl-goep-test-missing.so.2"}
	_, err = load(spec, dl.Env{Getenv: func(string) string { return "" }, Glob: none, Home: os.UserHomeDir})
	require.ErrorIs(t, err, ErrNotFound)
	require.Contains(t, err.Error(), "libnccl-goep-test-missing.so.2 (dynamic loader search path): ")
	require.Contains(t, err.Error(), "/usr/local/cuda/lib64/libnccl.so.2: no match")
	require.Contains(t, err.Error(), "$CUDA_HOME/lib64/libnccl.so.2: $CUDA_HOME is not set")
	require.Contains(t, err.Error(), EnvLibrary)
}

func TestNVLSGuard(t *testing.T) {
	t.Setenv("NCCL_ALGO", "")
	os.Unsetenv("NCCL_NVLS_ENABLE")
	require.NoError(t, GuardNVLS())
	require.Equal(t, "0", os.Getenv("NCCL_NVLS_ENABLE"), "set when unset")
	t.Setenv("NCCL_NVLS_ENABLE", "1")
	err := GuardNVLS()
	require.Error(t, err)
	require.Contains(t, err.Error(), "multicast")
	t.Setenv("NCCL_NVLS_ENABLE", "0")
	t.Setenv("NCCL_ALGO", "Ring,NVLS")
	require.ErrorContains(t, GuardNVLS(), "NVLS")
	t.Setenv("NCCL_ALGO", "^NVLS,NVLSTree")
	require.NoError(t, GuardNVLS(), "excluding NVLS is fine")
}

// hostMem is anonymous memory outside the Go heap, for the stand-in.
func hostMem(t *testing.T, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

// The stand-in exercises the whole call path: unique id, communicator
// creation on goroutine ranks, the three collectives with their argument
// order, errors.
func TestCallsThroughTheStandIn(t *testing.T) {
	if fake == "" {
		t.Skip("the host-memory stand-in was not built (GOEP_NCCL set, or no gcc)")
	}
	t.Setenv("NCCL_NVLS_ENABLE", "0")
	lib, err := Load()
	require.NoError(t, err)
	require.Equal(t, fake, lib.Path)
	require.Equal(t, "2.28.0", lib.VersionString())
	id, err := GetUniqueID()
	require.NoError(t, err)
	const ranks, n = 3, 100
	comms := make([]*Comm, ranks)
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = InitRank(0, ranks, id, r)
		}()
	}
	wg.Wait()
	for _, e := range errs {
		require.NoError(t, e)
	}
	f32 := func(b []byte) []float32 { return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4) }
	send := make([][]byte, ranks)
	recv := make([][]byte, ranks)
	for r := range send {
		send[r], recv[r] = hostMem(t, 4*n*ranks), hostMem(t, 4*n*ranks)
		for i, v := 0, f32(send[r]); i < len(v); i++ {
			v[i] = float32(r + i)
		}
	}
	ptr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
	each := func(fn func(r int) error) {
		var wg sync.WaitGroup
		for r := 0; r < ranks; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = fn(r)
			}()
		}
		wg.Wait()
		for _, e := range errs {
			require.NoError(t, e)
		}
	}
	each(func(r int) error { return comms[r].AllReduce(ptr(send[r]), ptr(recv[r]), n, Float32, Max, 0) })
	for r := range recv {
		for i, v := range f32(recv[r])[:n] {
			require.Equal(t, float32(ranks-1+i), v)
		}
	}
	each(func(r int) error { return comms[r].AllGather(ptr(send[r]), ptr(recv[r]), n, Float32, 0) })
	for q := 0; q < ranks; q++ {
		require.Equal(t, float32(q+5), f32(recv[1])[q*n+5])
	}
	each(func(r int) error { return comms[r].ReduceScatter(ptr(send[r]), ptr(recv[r]), n, Float32, Sum, 0) })
	require.Equal(t, float32(0+1+2+3*(2*n+7)), f32(recv[2])[7])
	// A type the stand-in lacks is an NCCL error with its message.
	err = comms[0].AllReduce(ptr(send[0]), ptr(recv[0]), n, Int32, Sum, 0)
	var ne *Error
	require.True(t, errors.As(err, &ne), "%v", err)
	require.Equal(t, "ncclAllReduce", ne.Op)
	require.True(t, strings.Contains(err.Error(), "fake NCCL error"), "%v", err)
	for _, c := range comms {
		require.NoError(t, c.AsyncError())
		require.NoError(t, c.Destroy())
		require.NoError(t, c.Destroy(), "idempotent")
	}
}
