package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/internal/dl"
	"github.com/goep-dev/goep/ncclshim/core"
)

// ncclInclude finds a directory holding nccl.h: $GOEP_NCCL_INCLUDE, else
// the system's, CUDA's, or a pip wheel's (nvidia-nccl-cu12).
func ncclInclude() string {
	if d := os.Getenv("GOEP_NCCL_INCLUDE"); d != "" {
		return d
	}
	spec := dl.Spec{File: "nccl.h", WheelDirs: []string{"nvidia/nccl/include"}}
	for _, p := range append([]string{"/usr/include/nccl.h"}, spec.Candidates(dl.OSEnv())...) {
		if strings.HasSuffix(p, "/nccl.h") {
			if _, err := os.Stat(p); err == nil {
				return filepath.Dir(p)
			}
		}
	}
	return ""
}

// TestABIAgainstHeader compiles testdata/abicheck.c against a real nccl.h:
// sizes, layouts and every enumerator the shim relies on.
func TestABIAgainstHeader(t *testing.T) {
	inc := ncclInclude()
	if inc == "" {
		t.Skip("no nccl.h here (set GOEP_NCCL_INCLUDE, or pip install nvidia-nccl-cu12)")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	dir := t.TempDir()
	var b strings.Builder
	for _, v := range []struct {
		name string
		val  int
	}{
		{"Success", int(core.Success)}, {"UnhandledCudaError", int(core.UnhandledCudaError)},
		{"SystemError", int(core.SystemError)}, {"InternalError", int(core.InternalError)},
		{"InvalidArgument", int(core.InvalidArgument)}, {"InvalidUsage", int(core.InvalidUsage)},
		{"RemoteError", int(core.RemoteError)}, {"InProgress", int(core.InProgress)},
		{"Int8", int(nccl.Int8)}, {"Uint8", int(nccl.Uint8)}, {"Int32", int(nccl.Int32)}, {"Uint32", int(nccl.Uint32)},
		{"Int64", int(nccl.Int64)}, {"Uint64", int(nccl.Uint64)}, {"Float16", int(nccl.Float16)},
		{"Float32", int(nccl.Float32)}, {"Float64", int(nccl.Float64)}, {"Bfloat16", int(nccl.Bfloat16)},
		{"Float8e4m3", int(nccl.Float8e4m3)}, {"Float8e5m2", int(nccl.Float8e5m2)}, {"numTypes", nccl.NumTypes},
		{"Sum", int(nccl.Sum)}, {"Prod", int(nccl.Prod)}, {"Max", int(nccl.Max)}, {"Min", int(nccl.Min)},
		{"Avg", int(nccl.Avg)}, {"numOps", nccl.NumOps},
	} {
		fmt.Fprintf(&b, "#define GO_%s %d\n", v.name, v.val)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "abicheck_values.h"), []byte(b.String()), 0o644))
	// Stand-ins for the CUDA headers nccl.h includes, used only when no
	// toolkit is on the include path: nccl.h needs cudaStream_t from them.
	stubs := filepath.Join(dir, "stubs")
	require.NoError(t, os.MkdirAll(stubs, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(stubs, "cuda_runtime.h"),
		[]byte("#define CUDART_VERSION 12000\ntypedef struct CUstream_st *cudaStream_t;\n"), 0o644))
	for _, h := range []string{"cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"} {
		require.NoError(t, os.WriteFile(filepath.Join(stubs, h), nil, 0o644))
	}
	args := []string{"-std=c11", "-fsyntax-only", "-I", inc, "-I", "."}
	if cuda := os.Getenv("CUDA_HOME"); cuda != "" {
		args = append(args, "-I", filepath.Join(cuda, "include"))
	}
	args = append(args, "-I", dir, "-idirafter", stubs, filepath.Join("testdata", "abicheck.c"))
	out, err := exec.Command("gcc", args...).CombinedOutput()
	require.NoError(t, err, "abicheck against %s/nccl.h:\n%s", inc, out)
	t.Logf("ncclshim.h and the shim's enumerators match %s/nccl.h", inc)
}
