package cpuemu

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
)

// A user source, using goep's headers (goep_copy of channel_copy.cuh),
// copies n words with one block and adds a scalar: checked against Go.
const userCopySrc = `#include "channel_device.cuh"
extern "C" __global__ void emu_user_copy_add(u32* dst, const u32* src, u64 n, u32 add) {
  goep_copy(dst, src, n * 4, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
  __syncthreads();
  for (u64 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] += add;
}
`

func TestLoadSourceRunsAUserKernelWithGoepHeaders(t *testing.T) {
	d := openT(t, time.Minute)
	ks, err := d.LoadSource("emu_user_copy.cu", userCopySrc)
	require.NoError(t, err)
	assert.Equal(t, []string{"emu_user_copy_add"}, ks)
	again, err := d.LoadSource("emu_user_copy.cu", userCopySrc)
	require.NoError(t, err, "loading the same source again is a no-op")
	assert.Equal(t, ks, again)

	rng := rand.New(rand.NewPCG(7, 11))
	for _, n := range []int{1, 5, 1000, 4099} {
		want := make([]uint32, n)
		in := make([]byte, 4*n)
		add := rng.Uint32()
		for i := range want {
			v := rng.Uint32()
			in[4*i], in[4*i+1], in[4*i+2], in[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
			want[i] = v + add
		}
		src := alloc(t, d, 4*n)
		dst := alloc(t, d, 4*n)
		require.NoError(t, d.CopyIn(src, in))
		require.NoError(t, d.Launch("emu_user_copy_add", device.D1(1), device.D1(64), 0, nil,
			device.NewArgs(4).Ptr(dst).Ptr(src).U64(uint64(n)).U32(add)))
		assert.Equal(t, want, words(t, d, dst, n), "n=%d", n)
	}
}

func TestLoadSourceRefusals(t *testing.T) {
	d := openT(t, time.Minute)
	for _, c := range []struct{ file, src, want string }{
		{"x.cuh", userCopySrc, "not a .cu name"},
		{"a/x.cu", userCopySrc, "not a .cu name"},
		{"layout.cu", userCopySrc, "goep's sources"},
		{"emu_none.cu", "__global__ void k() {}", "defines no kernel"},
		{"emu_goep_name.cu", `extern "C" __global__ void goep_fill_pattern(int* p) {}`, "already defined by doctor.cu"},
	} {
		_, err := d.LoadSource(c.file, c.src)
		require.Error(t, err, c.file)
		assert.Contains(t, err.Error(), c.want, c.file)
	}
	var nilDev *Device
	_, err := nilDev.LoadSource("x.cu", userCopySrc)
	assert.Error(t, err)
}

// g++'s diagnostics come back from LoadSource, and the broken source is
// forgotten so a fixed one can take its file name.
func TestLoadSourceBuildErrorAndRetry(t *testing.T) {
	d := openT(t, time.Minute)
	bad := "#include \"common.cuh\"\nextern \"C\" __global__ void emu_user_fix(u32* p) {\n  *p = no_such_function();\n}\n"
	_, err := d.LoadSource("emu_user_fix.cu", bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_such_function")
	good := "#include \"common.cuh\"\nextern \"C\" __global__ void emu_user_fix(u32* p) {\n  *p = 42;\n}\n"
	_, err = d.LoadSource("emu_user_fix.cu", good)
	require.NoError(t, err)
	out := alloc(t, d, 4)
	require.NoError(t, d.Launch("emu_user_fix", device.D1(1), device.D1(1), 0, nil, device.NewArgs(1).Ptr(out)))
	assert.Equal(t, []uint32{42}, words(t, d, out, 1))
	_, err = d.LoadSource("emu_user_fix.cu", good+"// changed\n")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another source is loaded")
}
