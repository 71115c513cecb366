// Package kernels holds goep's CUDA C++ kernels and compiles them at first
// use with NVRTC, keeping the CUBINs in an on-disk cache.
//
// The .cu and .cuh files in this directory are embedded in the binary. A
// module is one .cu file (one NVRTC program); every .cuh is offered to every
// module as an in-memory header, so no CUDA toolkit or include path is needed
// at run time. The package that launches a module's kernels registers the
// module (Register, registry.go) with its own kernel-name constants, so this
// package imports nothing of goep outside internal/; CheckRegistry says
// whether a program sees every embedded module.
//
// Compiler options (Compiled.Options has the exact list): -std=c++17,
// --gpu-architecture=sm_XY (sm_XYa for a module with NeedsArchSpecific when
// NVRTC is 12+), -lineinfo (except NVRTC 11.x for sm_90+, which crashes on
// it), -DGOEP_ENABLE_TMA=0|1, -DGOEP_ARCH_SPECIFIC=0|1, the measurement
// switches of internal/kernelflags (-DGOEP_NO_FINGERPRINT=1 when a benchmark
// harness turned it on; nothing by default), then the module's own
// options. Not used: --use_fast_math (a kernel that
// wants it says so in Module.Options) and -default-device (every device
// function is annotated; an unannotated helper should fail to compile rather
// than silently become device code).

package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed *.cu *.cuh
var sourceFS embed.FS

// Target is a GPU architecture, sm_<Major><Minor>.
type Target struct{ Major, Minor int }

// SM90 is Hopper (H100, H200, H800, H20).
var SM90 = Target{9, 0}

// Arch is the NVRTC name of the real architecture, e.g. "sm_90".
func (t Target) Arch() string { return fmt.Sprintf("sm_%d%d", t.Major, t.Minor) }

// SM is the architecture as a number, e.g. 90.
func (t Target) SM() int { return t.Major*10 + t.Minor }

func (t Target) String() string { return t.Arch() }

// ParseTarget accepts "sm_90", "90" and "9.0".
func ParseTarget(s string) (Target, error) {
	v := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(s), "sm_"), "a")
	if maj, min, ok := strings.Cut(v, "."); ok {
		a, err1 := strconv.Atoi(maj)
		b, err2 := strconv.Atoi(min)
		if err1 == nil && err2 == nil && a > 0 && b >= 0 && b < 10 {
			return Target{a, b}, nil
		}
	} else if n, err := strconv.Atoi(v); err == nil && n >= 10 {
		return Target{n / 10, n % 10}, nil
	}
	return Target{}, fmt.Errorf("kernels: bad target %q: want sm_90, 90 or 9.0", s)
}

// Module is one compilation unit.
type Module struct {
	// Name identifies the module (cache file names, logs): "doctor".
	Name string
	// File is the .cu file in this directory, also the name NVRTC reports
	// in diagnostics.
	File string
	// Options are appended to the default options.
	Options []string
	// NeedsArchSpecific asks for the arch-specific target (sm_90a) where
	// NVRTC supports it (12.0+); the module must still compile for plain
	// sm_90, guarded by GOEP_ARCH_SPECIFIC.
	NeedsArchSpecific bool
	// Kernels are the extern "C" __global__ functions the module defines.
	Kernels []string
	// Source, when not empty, is compiled instead of File's embedded
	// content (tests and one-off programs). Such modules are cached in
	// memory only, unless CacheOnDisk.
	Source string
	// CacheOnDisk keeps the CUBIN of an inline Source in the disk cache too,
	// as embedded modules are (user kernels loaded by package userkernel:
	// the key hashes the source, so a changed source never hits a stale
	// file).
	CacheOnDisk bool
}

// sourceFile returns the embedded content of a .cu or .cuh file.
func sourceFile(name string) (string, error) {
	b, err := sourceFS.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("kernels: no embedded source %q", name)
	}
	return string(b), nil
}

// sourceNames lists the embedded files, sorted.
func sourceNames() []string {
	entries, err := fs.ReadDir(sourceFS, ".")
	if err != nil {
		panic("kernels: reading embedded sources: " + err.Error())
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// headers returns every embedded .cuh keyed by file name, as NVRTC's
// in-memory headers.
func headers() map[string]string {
	h := map[string]string{}
	for _, n := range sourceNames() {
		if strings.HasSuffix(n, ".cuh") {
			s, _ := sourceFile(n)
			h[n] = s
		}
	}
	return h
}
