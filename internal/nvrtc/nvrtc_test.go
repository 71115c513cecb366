package nvrtc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/dl"
)

// needNVRTC returns the library, or skips the test when NVRTC cannot be
// loaded, unless GOEP_REQUIRE_NVRTC=1 (CI), where that is a failure.
func needNVRTC(t *testing.T) *Library {
	t.Helper()
	lib, err := Load()
	if err != nil {
		if os.Getenv("GOEP_REQUIRE_NVRTC") == "1" {
			t.Fatalf("GOEP_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: %v", err)
		}
		t.Skipf("NVRTC not available (set GOEP_REQUIRE_NVRTC=1 to make this a failure): %v", err)
	}
	return lib
}

const vecAdd = `
#include "goep_test.h"
extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i] + GOEP_TEST_BIAS;
}
`

var testHeaders = map[string]string{"goep_test.h": "#pragma once\n#define GOEP_TEST_BIAS 1.0f\n"}

func TestLoadIsCached(t *testing.T) {
	lib := needNVRTC(t)
	lib2, err := Load()
	require.NoError(t, err)
	assert.Same(t, lib, lib2)

	major, minor := lib.Version()
	t.Logf("loaded %s; supported archs %v", lib, lib.SupportedArchs())
	assert.GreaterOrEqual(t, major, 11)
	assert.GreaterOrEqual(t, minor, 0)
	assert.True(t, filepath.IsAbs(lib.Path()), "Path() should be the mapped file, got %q", lib.Path())
	if archs := lib.SupportedArchs(); archs != nil {
		assert.Contains(t, archs, 80)
		assert.True(t, lib.SupportsArch(80))
		assert.False(t, lib.SupportsArch(1))
	}
}

func TestCompileCUBINAndPTX(t *testing.T) {
	lib := needNVRTC(t)
	out, err := lib.Compile(Program{
		Name: "vecadd.cu", Source: vecAdd, Headers: testHeaders,
		Options: []string{"--gpu-architecture=sm_80", "-std=c++17"},
	})
	require.NoError(t, err, out.Log)
	require.True(t, bytes.HasPrefix(out.CUBIN, []byte("\x7fELF")), "CUBIN should be an ELF file")
	assert.Nil(t, out.PTX)

	out, err = lib.Compile(Program{
		Name: "vecadd.cu", Source: vecAdd, Headers: testHeaders,
		Options: []string{"-arch", "compute_80"},
	})
	require.NoError(t, err, out.Log)
	assert.Nil(t, out.CUBIN)
	assert.Contains(t, string(out.PTX), ".entry add")
	assert.NotContains(t, string(out.PTX), "\x00")
}

func TestCompileErrorHasFileAndLine(t *testing.T) {
	lib := needNVRTC(t)
	src := "extern \"C\" __global__ void k(int* p) {\n  *p = 1;\n  undefined_thing(p);\n}\n"
	out, err := lib.Compile(Program{Name: "broken.cu", Source: src, Options: []string{"--gpu-architecture=sm_80"}})
	require.Error(t, err)
	var ce *CompileError
	require.True(t, errors.As(err, &ce), "want *CompileError, got %T", err)
	assert.Equal(t, "broken.cu", ce.Name)
	assert.Contains(t, ce.Log, "broken.cu(3)")
	assert.Contains(t, err.Error(), "broken.cu(3)")
	assert.Contains(t, err.Error(), "undefined_thing")
	assert.Equal(t, ce.Log, out.Log)

	// An error inside an in-memory header is reported against the header.
	_, err = lib.Compile(Program{
		Name: "uses_header.cu", Source: "#include \"bad.h\"\n",
		Headers: map[string]string{"bad.h": "\n\nint x = ;\n"},
		Options: []string{"--gpu-architecture=sm_80"},
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.h(3)")
}

func TestCompileBadOption(t *testing.T) {
	lib := needNVRTC(t)
	_, err := lib.Compile(Program{Name: "x.cu", Source: vecAdd, Headers: testHeaders,
		Options: []string{"--no-such-option-goep"}})
	require.Error(t, err)
	var ce *CompileError
	require.True(t, errors.As(err, &ce))
	assert.Contains(t, err.Error(), "OPTION")
}

func TestCompileConcurrent(t *testing.T) {
	lib := needNVRTC(t)
	var wg sync.WaitGroup
	cubins := make([][]byte, 4)
	errs := make([]error, 4)
	for i := range cubins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := lib.Compile(Program{Name: "vecadd.cu", Source: vecAdd, Headers: testHeaders,
				Options: []string{"--gpu-architecture=sm_80"}})
			cubins[i], errs[i] = out.CUBIN, err
		}()
	}
	wg.Wait()
	for i := range cubins {
		require.NoError(t, errs[i])
		assert.Equal(t, cubins[0], cubins[i], "NVRTC output should be deterministic")
	}
}

func TestOpenRejectsOtherLibraries(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	_, err := Open("/nonexistent/libnvrtc.so.99")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dlopen")

	_, err = Open("libc.so.6")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nvrtcVersion")
}

func TestEnvOverrideFailureNamesTheFile(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	env := fakeEnv(map[string]string{EnvLibrary: "/nowhere/libnvrtc.so.12"}, nil)
	_, err := load(env)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GOEP_NVRTC=/nowhere/libnvrtc.so.12")
}

func fakeEnv(vars map[string]string, home error) searchEnv {
	return searchEnv{
		Env: dl.Env{
			Getenv: func(k string) string { return vars[k] },
			Glob:   filepath.Glob,
			Home: func() (string, error) {
				if home != nil {
					return "", home
				}
				return vars["HOME"], nil
			},
		},
		sonames: sonames,
	}
}

func touch(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
}

func TestSearchPlacesOrder(t *testing.T) {
	root := t.TempDir()
	cudaHome := filepath.Join(root, "cuda")
	venv := filepath.Join(root, "venv")
	home := filepath.Join(root, "home")
	touch(t,
		filepath.Join(cudaHome, "lib64", "libnvrtc.so.12"),
		filepath.Join(cudaHome, "lib64", "libnvrtc.so.12.4.127"),
		filepath.Join(cudaHome, "lib64", "libnvrtc.so.11.2"),
		filepath.Join(cudaHome, "lib64", "libnvrtc.so"),
		filepath.Join(cudaHome, "lib64", "libnvrtc-builtins.so.12.4"),
		filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"),
		filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "cu13", "lib", "libnvrtc.so.13"),
		filepath.Join(home, ".local", "lib", "python3.11", "dist-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.11.2"),
	)
	env := fakeEnv(map[string]string{"CUDA_HOME": cudaHome, "VIRTUAL_ENV": venv, "HOME": home}, nil)
	places := searchPlaces(env)

	var all []string
	for _, p := range places {
		all = append(all, p.Paths...)
	}
	lib64 := filepath.Join(cudaHome, "lib64")
	venvSite := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia")
	want := []string{
		filepath.Join(lib64, "libnvrtc.so"),
		filepath.Join(lib64, "libnvrtc.so.12.4.127"),
		filepath.Join(lib64, "libnvrtc.so.12"),
		filepath.Join(lib64, "libnvrtc.so.11.2"),
	}
	require.GreaterOrEqual(t, len(all), len(want))
	assert.Equal(t, want, all[:len(want)], "CUDA_HOME first, unversioned then newest")

	// Then the sonames, in order, then the venv's wheels (newest first), then ~/.local.
	idx := func(s string) int {
		for i, a := range all {
			if a == s {
				return i
			}
		}
		t.Fatalf("%s not among candidates %v", s, all)
		return -1
	}
	assert.Less(t, idx(filepath.Join(lib64, "libnvrtc.so.11.2")), idx("libnvrtc.so.13"))
	assert.Less(t, idx("libnvrtc.so.13"), idx("libnvrtc.so.12"))
	assert.Less(t, idx("libnvrtc.so.12"), idx("libnvrtc.so.11.2"))
	assert.Less(t, idx("libnvrtc.so.11.2"), idx(filepath.Join(venvSite, "cu13", "lib", "libnvrtc.so.13")))
	assert.Less(t, idx(filepath.Join(venvSite, "cu13", "lib", "libnvrtc.so.13")),
		idx(filepath.Join(venvSite, "cuda_nvrtc", "lib", "libnvrtc.so.12")))
	assert.Less(t, idx(filepath.Join(venvSite, "cuda_nvrtc", "lib", "libnvrtc.so.12")),
		idx(filepath.Join(home, ".local", "lib", "python3.11", "dist-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.11.2")))
	for _, p := range all {
		assert.NotContains(t, p, "builtins")
	}

	// Unset variables are reported, not silently dropped.
	places = searchPlaces(fakeEnv(map[string]string{}, errors.New("no home")))
	var skipped []string
	for _, p := range places {
		if p.Skip != "" {
			skipped = append(skipped, p.Where+": "+p.Skip)
		}
	}
	joined := strings.Join(skipped, "\n")
	assert.Contains(t, joined, "$CUDA_HOME is not set")
	assert.Contains(t, joined, "$CUDA_PATH is not set")
	assert.Contains(t, joined, "$VIRTUAL_ENV is not set")
	assert.Contains(t, joined, "no home directory")
}

func TestWithoutCgoLoadSaysSo(t *testing.T) {
	if haveCgo {
		t.Skip("built with cgo")
	}
	_, err := Load()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CGO_ENABLED")
}

func TestLoadReportsEveryPlaceWhenNothingIsFound(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	root := t.TempDir()
	// A file that matches the pattern but is not a library.
	touch(t, filepath.Join(root, "cuda", "lib64", "libnvrtc.so.12"))
	env := fakeEnv(map[string]string{"CUDA_HOME": filepath.Join(root, "cuda"), "HOME": root}, nil)
	env.sonames = []string{"libnvrtc-goep-test-missing.so.99"}
	// Hide the machine's real installations (/usr/local/cuda, /opt/*/...).
	env.Glob = func(pattern string) ([]string, error) {
		if !strings.HasPrefix(pattern, root) {
			return nil, nil
		}
		return filepath.Glob(pattern)
	}
	_, err := load(env)
	require.Error(t, err)
	var nf *NotFoundError
	require.True(t, errors.As(err, &nf), "want *NotFoundError, got %T: %v", err, err)
	msg := err.Error()
	t.Logf("%s", msg)
	assert.Contains(t, msg, filepath.Join(root, "cuda", "lib64", "libnvrtc.so.12")+": file too short")
	assert.Contains(t, msg, "$CUDA_PATH/lib64/libnvrtc.so*: $CUDA_PATH is not set")
	assert.Contains(t, msg, "/usr/local/cuda/lib64/libnvrtc.so*")
	assert.Contains(t, msg, "libnvrtc-goep-test-missing.so.99 (dynamic loader search path): cannot open shared object file")
	assert.Contains(t, msg, "~/.local/lib/python3*/{site,dist}-packages/{nvidia/cuda_nvrtc/lib,nvidia/cu13/lib}/libnvrtc.so*: no match")
	assert.Contains(t, msg, "pip install nvidia-cuda-nvrtc-cu12")
}

func TestNotFoundErrorExplainsTheFix(t *testing.T) {
	err := notFound([]string{"/usr/local/cuda/lib64/libnvrtc.so*: no match", "libnvrtc.so.12 (dynamic loader search path): dlopen: not found"})
	msg := err.Error()
	assert.Contains(t, msg, "/usr/local/cuda/lib64/libnvrtc.so*: no match")
	assert.Contains(t, msg, "libnvrtc.so.12")
	assert.Contains(t, msg, "CUDA toolkit")
	assert.Contains(t, msg, "pip install nvidia-cuda-nvrtc-cu12")
	assert.Contains(t, msg, "GOEP_NVRTC=")
}

func TestArchOption(t *testing.T) {
	assert.Equal(t, "sm_90", archOption([]string{"-std=c++17", "--gpu-architecture=sm_90"}))
	assert.Equal(t, "compute_90", archOption([]string{"-arch=compute_90"}))
	assert.Equal(t, "sm_80", archOption([]string{"-arch", "sm_80"}))
	assert.Equal(t, "sm_90a", archOption([]string{"-arch=compute_80", "--gpu-architecture=sm_90a"}))
	assert.Equal(t, "", archOption([]string{"-lineinfo"}))
	assert.True(t, wantsCUBIN([]string{"--gpu-architecture=sm_90a"}))
	assert.False(t, wantsCUBIN([]string{"--gpu-architecture=compute_90"}))
	assert.False(t, wantsCUBIN(nil))
}
