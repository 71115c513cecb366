package kernels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const userSrc = `#include "channel_device.cuh"
extern "C" __global__ void user_test_put(const goep_port_channel* chans, u32 n) {
  if (threadIdx.x < n) (void)goep_pc_signal(chans[threadIdx.x]);
}
extern "C" __global__ void user_test_wait(const goep_port_channel* chans) { (void)goep_pc_wait(chans[0]); }
`

func TestSourceKernelsFindsDefinitionsInOrder(t *testing.T) {
	assert.Equal(t, []string{"user_test_put", "user_test_wait"}, SourceKernels(userSrc))
	assert.Empty(t, SourceKernels(`__global__ void not_extern_c() {}`))
	assert.Empty(t, SourceKernels(`// extern "C" __global__ void commented(`))
}

func TestRegisterSourceRules(t *testing.T) {
	ok := Module{Name: "user-rules-a", File: "rules.cu", Source: userSrc, Kernels: []string{"user_test_put", "user_test_wait"}}
	for _, c := range []struct {
		what string
		edit func(m *Module)
		want string
	}{
		{"no name", func(m *Module) { m.Name = "" }, "needs a name"},
		{"path in name", func(m *Module) { m.Name = "a/b" }, "path separators"},
		{"not .cu", func(m *Module) { m.File = "rules.cuh" }, "is not a .cu name"},
		{"path in file", func(m *Module) { m.File = "dir/rules.cu" }, "is not a .cu name"},
		{"goep's file name", func(m *Module) { m.File = "layout.cu" }, "goep's own sources"},
		{"empty source", func(m *Module) { m.Source = " \n" }, "empty source"},
		{"no kernels", func(m *Module) { m.Kernels = nil }, "no kernels"},
		{"undefined kernel", func(m *Module) { m.Kernels = []string{"user_test_nope"} }, "defines no kernel user_test_nope"},
		{"kernel twice", func(m *Module) { m.Kernels = []string{"user_test_put", "user_test_put"} }, "listed twice"},
		{"goep's module name", func(m *Module) { m.Name = "doctor" }, "goep's module"},
		{"goep's kernel name", func(m *Module) {
			m.Source = `extern "C" __global__ void goep_fill_pattern(int* p) {}`
			m.Kernels = []string{"goep_fill_pattern"}
		}, "is goep's"},
	} {
		m := ok
		c.edit(&m)
		err := RegisterSource(m)
		require.Error(t, err, c.what)
		assert.Contains(t, err.Error(), c.want, c.what)
	}

	require.NoError(t, RegisterSource(ok))
	require.NoError(t, RegisterSource(ok), "the same module again is a no-op")
	got, found := ModuleForKernel("user_test_wait")
	require.True(t, found)
	assert.Equal(t, ok.Name, got.Name)
	assert.Equal(t, userSrc, got.Source)
	byName, found := ModuleByName(ok.Name)
	require.True(t, found)
	assert.Equal(t, ok.File, byName.File)
	for _, m := range Modules() {
		assert.NotEqual(t, ok.Name, m.Name, "user sources stay out of Modules (what goep ships)")
	}
	assert.NoError(t, CheckRegistry(), "a user source does not disturb the registry check")

	changed := ok
	changed.Source = strings.Replace(userSrc, "threadIdx.x < n", "threadIdx.x <= n", 1)
	err := RegisterSource(changed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another source is registered under this name")
	changed.Name = "user-rules-b"
	err = RegisterSource(changed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `already defined by source module "user-rules-a"`)

	other := Module{Name: "user-rules-c", File: "rules.cu", Source: `extern "C" __global__ void user_test_other() {}`,
		Kernels: []string{"user_test_other"}}
	require.NoError(t, RegisterSource(other), "another module may reuse the file name (diagnostics only)")
	names := []string{}
	for _, m := range SourceModules() {
		names = append(names, m.Name)
	}
	assert.Subset(t, names, []string{"user-rules-a", "user-rules-c"})
}

func TestHeadersAreTheEmbeddedCuh(t *testing.T) {
	h := Headers()
	assert.Contains(t, h, "channel_device.cuh")
	assert.Contains(t, h, "port_device.cuh")
	for _, n := range h {
		assert.True(t, strings.HasSuffix(n, ".cuh"), n)
	}
}

// A user source with CacheOnDisk lands in the disk cache and is read back
// from it by a fresh compiler; without it, it stays in memory.
func TestUserSourceCompilesWithHeadersAndCachesOnDisk(t *testing.T) {
	needNVRTC(t)
	dir := t.TempDir()
	m := Module{Name: "user-cache", File: "user_cache.cu", Source: userSrc, Kernels: SourceKernels(userSrc), CacheOnDisk: true}
	first, err := NewCompiler(Options{CacheDir: dir}).Compile(m, SM90)
	require.NoError(t, err)
	assert.False(t, first.FromCache)
	require.NotEmpty(t, first.Path)
	_, err = os.Stat(first.Path)
	require.NoError(t, err)
	again, err := NewCompiler(Options{CacheDir: dir}).Compile(m, SM90)
	require.NoError(t, err)
	assert.True(t, again.FromCache)
	assert.Equal(t, first.CUBIN, again.CUBIN)

	m.CacheOnDisk = false
	m.Name = "user-mem"
	mem, err := NewCompiler(Options{CacheDir: dir}).Compile(m, SM90)
	require.NoError(t, err)
	assert.Empty(t, mem.Path)
	files, _ := filepath.Glob(filepath.Join(dir, "user-mem-*"))
	assert.Empty(t, files)
}

// A source that does not compile gives NVRTC's log, naming the user's file
// and line.
func TestUserSourceCompileErrorCarriesTheLog(t *testing.T) {
	needNVRTC(t)
	src := "#include \"channel_device.cuh\"\nextern \"C\" __global__ void user_bad() {\n  undefined_thing(1);\n}\n"
	_, err := NewCompiler(Options{CacheDir: "off"}).Compile(Module{Name: "user-bad", File: "user_bad.cu", Source: src}, SM90)
	require.Error(t, err)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, ce.Log, "user_bad.cu(3)")
	assert.Contains(t, err.Error(), "undefined_thing")
}
