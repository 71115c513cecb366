package kernels

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The registry's mechanics on a registry of its own: what Register refuses,
// what CheckRegistry finds. (TestMain filled the real one from the
// embedded sources; the owners' registrations are checked by ep-bench
// doctor and its test.)
func TestRegisterAndCheckRegistry(t *testing.T) {
	regMu.Lock()
	saved := registry
	registry = nil
	regMu.Unlock()
	t.Cleanup(func() {
		regMu.Lock()
		registry = saved
		regMu.Unlock()
	})
	doctor := Module{Name: "doc", File: "doctor.cu", Kernels: []string{"goep_fill_pattern", "goep_check_pattern",
		"goep_write_host_flag", "goep_convert_test", "goep_reserve_local_memory"}}
	require.NoError(t, register(doctor))
	for _, bad := range []Module{
		{File: "layout.cu", Kernels: []string{"goep_layout_i64"}},                               // no name
		{Name: "x", File: "layout.cu"},                                                          // no kernels
		{Name: "x", File: "nope.cu", Kernels: []string{"k"}},                                    // not embedded
		{Name: "x", File: "common.cuh", Kernels: []string{"k"}},                                 // a header
		{Name: "x", File: "layout.cu", Kernels: []string{"k"}, Source: "x"},                     // inline
		{Name: "doc", File: "layout.cu", Kernels: []string{"goep_layout_i64"}},                  // name taken
		{Name: "x", File: "doctor.cu", Kernels: []string{"k"}},                                  // file taken
		{Name: "x", File: "layout.cu", Kernels: []string{"goep_fill_pattern"}},                  // kernel taken
		{Name: "x", File: "layout.cu", Kernels: []string{"goep_layout_i64", "goep_layout_i64"}}, // listed twice
	} {
		assert.Error(t, register(bad), "%+v", bad)
	}
	assert.Panics(t, func() { Register(doctor) })
	m, ok := ModuleForKernel("goep_convert_test")
	require.True(t, ok)
	assert.Equal(t, "doc", m.Name)
	_, ok = ModuleForKernel("no_such_kernel")
	assert.False(t, ok)
	m.Kernels[0] = "changed"
	again, _ := ModuleByName("doc")
	assert.Equal(t, "goep_fill_pattern", again.Kernels[0], "Modules returns copies")

	// Only doctor.cu is registered: every other .cu is reported by name.
	err := CheckRegistry()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "layout.cu is registered by no linked package")
	assert.NotContains(t, err.Error(), "doctor.cu")
	// A module that lists a kernel its file does not define, or misses one.
	regMu.Lock()
	registry = nil
	regMu.Unlock()
	require.NoError(t, register(Module{Name: "layout", File: "layout.cu", Kernels: []string{"goep_layout_i64", "goep_layout_i16"}}))
	assert.Contains(t, CheckRegistry().Error(), `module "layout" registers kernels [goep_layout_i16 goep_layout_i64], layout.cu defines [goep_layout_i32 goep_layout_i64]`)
	// The whole set, derived from the sources, is complete.
	regMu.Lock()
	registry = nil
	regMu.Unlock()
	for _, m := range sourceModules(t) {
		require.NoError(t, register(m))
	}
	assert.NoError(t, CheckRegistry())
}

// Kernels must compile with NVRTC 11.8, which has no toolkit headers here:
// only our own .cuh files may be included.
func TestSourcesAreSelfContained(t *testing.T) {
	includeRE := regexp.MustCompile(`(?m)^\s*#\s*include\s*([<"])([^>"]+)[>"]`)
	hdrs := headers()
	for _, n := range sourceNames() {
		src, err := sourceFile(n)
		require.NoError(t, err)
		for _, inc := range includeRE.FindAllStringSubmatch(src, -1) {
			assert.Equal(t, `"`, inc[1], "%s: #include <%s> (system headers are not available to NVRTC here)", n, inc[2])
			assert.Contains(t, hdrs, inc[2], "%s includes %q, which is not an embedded .cuh", n, inc[2])
		}
	}
}

func TestCompileOptions(t *testing.T) {
	plain := Module{Name: "p", File: "p.cu"}
	hopper := Module{Name: "h", File: "h.cu", NeedsArchSpecific: true, Options: []string{"-DX=1"}}
	cases := []struct {
		m          Module
		t          Target
		major      int
		arch       string
		tma, archS string
	}{
		{plain, SM90, 11, "sm_90", "0", "0"},
		{hopper, SM90, 11, "sm_90", "0", "0"}, // NVRTC 11.8 rejects sm_90a
		{plain, SM90, 12, "sm_90", "1", "0"},
		{hopper, SM90, 12, "sm_90a", "1", "1"},
		{hopper, SM90, 13, "sm_90a", "1", "1"},
		{plain, Target{8, 0}, 12, "sm_80", "0", "0"},
		{plain, Target{8, 0}, 11, "sm_80", "0", "0"},
		{hopper, Target{8, 9}, 12, "sm_89", "0", "0"},
		{plain, Target{10, 0}, 13, "sm_100", "1", "0"},
	}
	for _, tc := range cases {
		opts, arch := compileOptions(tc.m, tc.t, tc.major)
		name := fmt.Sprintf("%s/%s/nvrtc%d", tc.m.Name, tc.t, tc.major)
		assert.Equal(t, tc.arch, arch, name)
		assert.Contains(t, opts, "--gpu-architecture="+tc.arch, name)
		assert.Contains(t, opts, "-std=c++17", name)
		if tc.major < 12 && tc.t.SM() >= 90 {
			assert.NotContains(t, opts, "-lineinfo", name+": NVRTC 11.8 crashes on -lineinfo for sm_90")
		} else {
			assert.Contains(t, opts, "-lineinfo", name)
		}
		assert.Contains(t, opts, "-DGOEP_ENABLE_TMA="+tc.tma, name)
		assert.Contains(t, opts, "-DGOEP_ARCH_SPECIFIC="+tc.archS, name)
		assert.NotContains(t, opts, "--use_fast_math", name)
		if tc.m.Name == "h" {
			assert.Equal(t, "-DX=1", opts[len(opts)-1], "module options come last")
		}
	}
}

func TestParseTarget(t *testing.T) {
	for _, s := range []string{"sm_90", "90", "9.0", "sm_90a"} {
		got, err := ParseTarget(s)
		require.NoError(t, err, s)
		assert.Equal(t, SM90, got, s)
	}
	got, err := ParseTarget("sm_100")
	require.NoError(t, err)
	assert.Equal(t, Target{10, 0}, got)
	assert.Equal(t, "sm_100", got.Arch())
	for _, s := range []string{"", "sm_", "hopper", "9.x", "5"} {
		_, err := ParseTarget(s)
		assert.Error(t, err, s)
	}
}

// The CI gate: every registered module compiles for sm_90 with the NVRTC at
// hand, and each CUBIN defines the kernels the registry promises.
func TestEveryModuleCompilesForSM90(t *testing.T) {
	needNVRTC(t)
	_, logger := newLogRecorder(t)
	c := NewCompiler(Options{CacheDir: t.TempDir(), Logger: logger})
	major, minor, err := c.NVRTCVersion()
	require.NoError(t, err)
	res, err := c.CompileAll(SM90)
	require.NoError(t, err)
	require.Len(t, res, len(sourceModules(t)))
	for _, r := range res {
		require.NotNil(t, r)
		assert.False(t, r.FromCache)
		assert.True(t, bytes.HasPrefix(r.CUBIN, []byte("\x7fELF")), "%s: CUBIN is not ELF", r.Module.Name)
		for _, k := range r.Module.Kernels {
			assert.True(t, bytes.Contains(r.CUBIN, []byte(k+"\x00")), "%s: CUBIN lacks symbol %s", r.Module.Name, k)
		}
		assert.FileExists(t, r.Path)
		t.Logf("cold compile %-8s %s NVRTC %d.%d: %v, %d bytes CUBIN, options %q",
			r.Module.Name, r.Arch, major, minor, r.Duration.Round(time.Millisecond), len(r.CUBIN), r.Options)
		if r.Log != "" {
			t.Logf("NVRTC log for %s:\n%s", r.Module.Name, r.Log)
		}
	}
}

// The macros the Go side defines reach the compiler with the values the
// rules give.
func TestMacrosReachTheKernel(t *testing.T) {
	lib := needNVRTC(t)
	major, _ := lib.Version()
	wantTMA := boolDigit(major >= 12)
	src := `#include "common.cuh"
static_assert(GOEP_ENABLE_TMA == ` + wantTMA + `, "GOEP_ENABLE_TMA has the wrong value");
static_assert(GOEP_ARCH_SPECIFIC == 0, "GOEP_ARCH_SPECIFIC has the wrong value");
extern "C" __global__ void k(u64* out) { *out = goep_globaltimer(); }
`
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	_, err := c.CompileSource("macros", src, SM90)
	require.NoError(t, err)
}

func TestCompileErrorNamesFileAndLine(t *testing.T) {
	lib := needNVRTC(t)
	major, minor := lib.Version()
	src := `#include "common.cuh"

extern "C" __global__ void goep_broken(u32* p) {
  *p = not_declared_anywhere;
}
`
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	_, err := c.CompileSource("broken", src, SM90)
	require.Error(t, err)
	t.Logf("error text:\n%v", err)
	var ce *CompileError
	require.True(t, errors.As(err, &ce), "want *CompileError, got %T", err)
	prefix := fmt.Sprintf("kernels: compile broken (broken.cu) for sm_90 with NVRTC %d.%d: ", major, minor)
	assert.True(t, strings.HasPrefix(err.Error(), prefix), "error should start with %q", prefix)
	assert.Contains(t, err.Error(), "broken.cu(4)")
	assert.Contains(t, err.Error(), "not_declared_anywhere")

	// A misuse of a common.cuh helper is reported at the caller's line.
	_, err = c.CompileSource("uses_bad_macro", `#include "common.cuh"
extern "C" __global__ void k(float* p) { *p = goep_bf16_to_f32(1.0f); }
`, SM90)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "uses_bad_macro.cu(2)")
}

func TestCompileRejectsUnsupportedTargets(t *testing.T) {
	lib := needNVRTC(t)
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})
	m, _ := ModuleByName("doctor")
	_, err := c.Compile(m, Target{6, 0})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sm_70 or newer")
	if !lib.SupportsArch(990) {
		_, err = c.Compile(m, Target{99, 0})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cannot generate code")
	}
	_, err = c.Compile(Module{Name: "ghost", File: "ghost.cu"}, SM90)
	require.Error(t, err)
}

func TestCacheMissThenHit(t *testing.T) {
	needNVRTC(t)
	dir := t.TempDir()
	m, _ := ModuleByName("doctor")
	_, logger := newLogRecorder(t)

	cold, err := NewCompiler(Options{CacheDir: dir, Logger: logger}).Compile(m, SM90)
	require.NoError(t, err)
	assert.False(t, cold.FromCache)
	require.FileExists(t, cold.Path)
	assert.Equal(t, dir, filepath.Dir(cold.Path))
	assert.Equal(t, "doctor-"+cold.Key[:16]+".cubin", filepath.Base(cold.Path))

	// A fresh Compiler (a new process, as far as caching goes) hits the disk.
	warm, err := NewCompiler(Options{CacheDir: dir, Logger: logger}).Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, warm.FromCache)
	assert.Equal(t, cold.CUBIN, warm.CUBIN)
	assert.Equal(t, cold.Key, warm.Key)

	// The same Compiler again hits memory.
	c := NewCompiler(Options{CacheDir: dir, Logger: logger})
	_, err = c.Compile(m, SM90)
	require.NoError(t, err)
	mem, err := c.Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, mem.FromCache)

	t.Logf("doctor sm_90: cold compile %v, warm disk load %v, memory hit %v",
		cold.Duration.Round(time.Millisecond), warm.Duration, mem.Duration)

	// No temporary files are left behind.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.Contains(e.Name(), ".tmp-"), "leftover temp file %s", e.Name())
	}
}

// Every module loads warm from the disk cache: a fresh Compiler (a new
// process, as far as caching goes) finds each one without compiling and
// gets the bytes the compile wrote. How long a warm load takes is logged
// and measured by BenchmarkWarmLoad, not asserted: a loaded CI machine
// must not fail a test on time (about 1-70 ms a module here).
func TestWarmLoadsComeFromDisk(t *testing.T) {
	lib := needNVRTC(t)
	dir := t.TempDir()
	quiet := slog.New(slog.DiscardHandler)
	cold, err := NewCompiler(Options{CacheDir: dir, Logger: quiet, NVRTC: lib}).CompileAll(SM90)
	require.NoError(t, err)
	require.Len(t, cold, len(Modules()))
	for i, m := range Modules() {
		var times []time.Duration
		for range 3 {
			r, err := NewCompiler(Options{CacheDir: dir, Logger: quiet, NVRTC: lib}).Compile(m, SM90)
			require.NoError(t, err)
			require.True(t, r.FromCache, "%s: a warm load compiled instead of reading the cache", m.Name)
			require.Equal(t, cold[i].Key, r.Key, m.Name)
			require.True(t, bytes.Equal(cold[i].CUBIN, r.CUBIN), "%s: the cached cubin differs from the compiled one", m.Name)
			times = append(times, r.Duration)
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		t.Logf("warm load %-8s sm_90: median %v (min %v, max %v)", m.Name, times[1], times[0], times[2])
	}
}

func BenchmarkWarmLoad(b *testing.B) {
	lib := needNVRTC(b)
	dir := b.TempDir()
	quiet := slog.New(slog.DiscardHandler)
	m, _ := ModuleByName("doctor")
	_, err := NewCompiler(Options{CacheDir: dir, Logger: quiet, NVRTC: lib}).Compile(m, SM90)
	require.NoError(b, err)
	b.ResetTimer()
	for b.Loop() {
		r, err := NewCompiler(Options{CacheDir: dir, Logger: quiet, NVRTC: lib}).Compile(m, SM90)
		if err != nil || !r.FromCache {
			b.Fatal(err)
		}
	}
}

func TestCorruptCacheFileIsRecompiled(t *testing.T) {
	needNVRTC(t)
	dir := t.TempDir()
	m, _ := ModuleByName("doctor")
	quiet := slog.New(slog.DiscardHandler)
	good, err := NewCompiler(Options{CacheDir: dir, Logger: quiet}).Compile(m, SM90)
	require.NoError(t, err)
	pristine, err := os.ReadFile(good.Path)
	require.NoError(t, err)

	corruptions := map[string]func([]byte) []byte{
		"truncated":    func(b []byte) []byte { return b[:len(b)/2] },
		"flipped byte": func(b []byte) []byte { b[len(b)/3] ^= 0x5a; return b },
		"no trailer":   func(b []byte) []byte { return b[:len(b)-trailerSize] },
		"empty":        func(b []byte) []byte { return nil },
		"not ELF": func(b []byte) []byte {
			b[0] = 'X'
			return b
		},
	}
	for name, corrupt := range corruptions {
		t.Run(name, func(t *testing.T) {
			bad := corrupt(append([]byte(nil), pristine...))
			require.NoError(t, os.WriteFile(good.Path, bad, 0o644))
			rec, logger := newLogRecorder(t)
			r, err := NewCompiler(Options{CacheDir: dir, Logger: logger}).Compile(m, SM90)
			require.NoError(t, err)
			assert.False(t, r.FromCache, "a corrupt file must be recompiled, not loaded")
			assert.Equal(t, good.CUBIN, r.CUBIN)
			assert.Equal(t, 1, rec.count(slog.LevelWarn, "invalid cache file"))
			fixed, err := os.ReadFile(good.Path)
			require.NoError(t, err)
			assert.Equal(t, pristine, fixed, "the recompiled file replaces the corrupt one")
		})
	}
}

func TestCacheFileFormat(t *testing.T) {
	var key, other [32]byte
	key[0], other[0] = 1, 2
	cubin := append([]byte("\x7fELF"), bytes.Repeat([]byte{7}, 100)...)
	enc := encodeCacheFile(cubin, key)
	got, err := decodeCacheFile(enc, key)
	require.NoError(t, err)
	assert.Equal(t, cubin, got)
	_, err = decodeCacheFile(enc, other)
	assert.ErrorIs(t, err, errCorrupt)
	for i := 0; i < len(enc); i += 13 {
		bad := append([]byte(nil), enc...)
		bad[i] ^= 1
		_, err := decodeCacheFile(bad, key)
		assert.ErrorIs(t, err, errCorrupt, "flip at %d", i)
	}
	for n := range len(enc) {
		_, err := decodeCacheFile(enc[:n], key)
		assert.ErrorIs(t, err, errCorrupt, "truncated to %d", n)
	}
}

func TestCacheKeyCoversInputs(t *testing.T) {
	m := Module{Name: "doctor", File: "doctor.cu"}
	opts := []string{"-std=c++17", "--gpu-architecture=sm_90"}
	base := cacheKey(m, "src", opts, "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89")
	variants := map[string][32]byte{
		"module":  cacheKey(Module{Name: "doctor2", File: "doctor.cu"}, "src", opts, "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89"),
		"source":  cacheKey(m, "src2", opts, "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89"),
		"options": cacheKey(m, "src", append(opts, "-DX"), "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89"),
		"split":   cacheKey(m, "src", []string{"-std=c++17--gpu-architecture=sm_90"}, "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89"),
		"arch":    cacheKey(m, "src", opts, "sm_90a", "NVRTC 11.8 libnvrtc.so.11.8.89"),
		"nvrtc":   cacheKey(m, "src", opts, "sm_90", "NVRTC 12.4 libnvrtc.so.12.4.127"),
	}
	assert.Equal(t, base, cacheKey(m, "src", opts, "sm_90", "NVRTC 11.8 libnvrtc.so.11.8.89"), "keys are deterministic")
	for name, k := range variants {
		assert.NotEqual(t, base, k, "changing the %s must change the key", name)
	}
}

func TestUnwritableCacheFallsBackToMemory(t *testing.T) {
	needNVRTC(t)
	m, _ := ModuleByName("doctor")
	file := filepath.Join(t.TempDir(), "regular-file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))

	rec, logger := newLogRecorder(t)
	c := NewCompiler(Options{CacheDir: filepath.Join(file, "kernels"), Logger: logger})
	r1, err := c.Compile(m, SM90)
	require.NoError(t, err, "a broken cache dir must not fail the compile")
	assert.False(t, r1.FromCache)
	assert.Empty(t, r1.Path)
	assert.Empty(t, c.CacheDir())
	r2, err := c.Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, r2.FromCache, "second compile comes from the memory cache")
	assert.Equal(t, r1.CUBIN, r2.CUBIN)
	assert.Equal(t, 1, rec.count(slog.LevelWarn, "in memory"), "say it once")
}

func TestReadOnlyCacheDirStillServesHits(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("running as root: permissions do not make a directory read-only")
	}
	needNVRTC(t)
	m, _ := ModuleByName("doctor")
	dir := t.TempDir()
	quiet := slog.New(slog.DiscardHandler)
	cold, err := NewCompiler(Options{CacheDir: dir, Logger: quiet}).Compile(m, SM90)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o555))
	t.Cleanup(func() { os.Chmod(dir, 0o755) })

	rec, logger := newLogRecorder(t)
	warm, err := NewCompiler(Options{CacheDir: dir, Logger: logger}).Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, warm.FromCache)
	assert.Equal(t, cold.CUBIN, warm.CUBIN)
	assert.Equal(t, 1, rec.count(slog.LevelWarn, "in memory"))

	// A module not in the read-only cache compiles into memory.
	other, err := NewCompiler(Options{CacheDir: dir, Logger: quiet}).Compile(Module{
		Name: "doctor", File: "doctor.cu", Options: []string{"-DGOEP_TEST_VARIANT=1"}}, SM90)
	require.NoError(t, err)
	assert.False(t, other.FromCache)
	assert.Empty(t, other.Path)
}

func TestConcurrentGoroutinesCompileOnce(t *testing.T) {
	needNVRTC(t)
	m, _ := ModuleByName("doctor")
	c := NewCompiler(Options{CacheDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	var wg sync.WaitGroup
	results := make([]*Compiled, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.Compile(m, SM90)
		}()
	}
	wg.Wait()
	compiled := 0
	for i, r := range results {
		require.NoError(t, errs[i])
		if !r.FromCache {
			compiled++
		}
		assert.Equal(t, results[0].CUBIN, r.CUBIN)
	}
	assert.Equal(t, 1, compiled)
}

// Eight processes start at the same instant on one empty cache directory:
// exactly one compiles, the others wait for its file, and all end up with
// the same bytes.
func TestConcurrentProcessesShareOneCompile(t *testing.T) {
	needNVRTC(t)
	const procs = 8
	dir := t.TempDir()
	start := time.Now().Add(500 * time.Millisecond).UnixNano()
	type child struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	children := make([]*child, procs)
	for i := range children {
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.cmd.Env = append(os.Environ(),
			childEnv+"=compile",
			fmt.Sprintf("%s_START=%d", childEnv, start),
			EnvCacheDir+"="+dir,
		)
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.stdout, &ch.stderr
		require.NoError(t, ch.cmd.Start())
		children[i] = ch
	}
	var results []childResult
	for i, ch := range children {
		err := ch.cmd.Wait()
		require.NoError(t, err, "child %d failed: %s\n%s", i, ch.stdout.String(), ch.stderr.String())
		var res childResult
		sc := bufio.NewScanner(&ch.stdout)
		for sc.Scan() {
			if line := sc.Bytes(); len(line) > 0 && line[0] == '{' {
				require.NoError(t, json.Unmarshal(line, &res))
			}
		}
		require.Empty(t, res.Err)
		require.NotEmpty(t, res.CUBINHash, "child %d printed no result: %s", i, ch.stdout.String())
		results = append(results, res)
	}
	compiled := 0
	for i, r := range results {
		if r.Compiled {
			compiled++
		}
		assert.Equal(t, results[0].CUBINHash, r.CUBINHash, "child %d got different bytes", i)
		assert.Equal(t, results[0].Path, r.Path)
		t.Logf("child %d: compiled=%v took %v", i, r.Compiled, time.Duration(r.Micros)*time.Microsecond)
	}
	assert.Equal(t, 1, compiled, "exactly one process should compile")

	// The file on disk is the one they all loaded; no temp files remain.
	quiet := slog.New(slog.DiscardHandler)
	m, _ := ModuleByName("doctor")
	r, err := NewCompiler(Options{CacheDir: dir, Logger: quiet}).Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, r.FromCache)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.Contains(e.Name(), ".tmp-"), "leftover temp file %s", e.Name())
	}
}

func TestLockFileTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(path, time.Second)
	require.NoError(t, err)
	// flock locks belong to open file descriptions, so a second open in the
	// same process contends like another process would.
	startWait := time.Now()
	_, err = lockFile(path, 100*time.Millisecond)
	assert.ErrorIs(t, err, errLockTimeout)
	assert.GreaterOrEqual(t, time.Since(startWait), 100*time.Millisecond)
	unlock()
	unlock2, err := lockFile(path, time.Second)
	require.NoError(t, err)
	unlock2()
}

func TestInlineSourcesStayInMemory(t *testing.T) {
	needNVRTC(t)
	dir := t.TempDir()
	c := NewCompiler(Options{CacheDir: dir, Logger: slog.New(slog.DiscardHandler)})
	r, err := c.CompileSource("tiny", `#include "common.cuh"
extern "C" __global__ void goep_tiny(u32* p) { *p = goep_pattern_value(0, 0); }
`, SM90)
	require.NoError(t, err)
	assert.Empty(t, r.Path)
	assert.Equal(t, "tiny.cu", r.Module.File)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

// tmaProbe uses the Hopper bulk-copy engine behind GOEP_ENABLE_TMA, the way
// kernels must: NVRTC 12+ assembles the cp.async.bulk path for sm_90, NVRTC
// 11.8 compiles the fallback. It copies n (<= 256) words src -> dst.
const tmaProbe = `#include "common.cuh"
extern "C" __global__ void goep_tma_probe(const u32* src, u32* dst, u32 n) {
#if GOEP_ENABLE_TMA
  __shared__ alignas(128) u32 buf[256];
  __shared__ alignas(8) u64 bar;
  u64 gbuf, gbar;
  asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(gbuf) : "l"(buf));
  asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(gbar) : "l"(&bar));
  const u32 sbuf = (u32)gbuf, sbar = (u32)gbar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(sbar) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(sbar), "r"(n * 4) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 : : "r"(sbuf), "l"(src), "r"(n * 4), "r"(sbar) : "memory");
  }
  __syncthreads();
  u32 done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(sbar) : "memory");
  }
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) dst[i] = buf[i];
#else
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
#endif
}
`

func TestArchSpecificAndTMAGuardCompile(t *testing.T) {
	lib := needNVRTC(t)
	major, _ := lib.Version()
	c := NewCompiler(Options{CacheDir: "off", Logger: slog.New(slog.DiscardHandler)})

	r, err := c.CompileSource("tma_probe", tmaProbe, SM90)
	require.NoError(t, err)
	assert.Contains(t, r.Options, "-DGOEP_ENABLE_TMA="+boolDigit(major >= 12))

	// A NeedsArchSpecific module gets sm_90a where NVRTC has it, and the
	// compiler's own feature macro agrees with GOEP_ARCH_SPECIFIC.
	src := `#include "common.cuh"
#if GOEP_ARCH_SPECIFIC && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "GOEP_ARCH_SPECIFIC=1 but this is not an sm_90a compile"
#endif
extern "C" __global__ void goep_as_probe(u32* p) { *p = GOEP_ARCH_SPECIFIC; }
`
	r, err = c.Compile(Module{Name: "as_probe", File: "as_probe.cu", Source: src, NeedsArchSpecific: true}, SM90)
	require.NoError(t, err)
	if major >= 12 {
		assert.Equal(t, "sm_90a", r.Arch)
	} else {
		assert.Equal(t, "sm_90", r.Arch)
	}
	t.Logf("NVRTC %d: arch-specific module compiled for %s with %q", major, r.Arch, r.Options)
}
