package routing_test

// The real kernels/layout.cu and kernels/ep_convert.cu on CPU threads
// (internal/cpuemu), compared exactly with the plain-Go reference: the
// launch shapes LaunchLayout picks, several blocks (the last-block
// reduction through the workspace), corrupted ids, rows stored 8, 4 and 1
// bytes at a time (rank counts of 8, 4 and 3).

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/routing"
)

func openEmu(t *testing.T, sms int) *cpuemu.Device {
	t.Helper()
	cpuemu.SkipUnavailable(t)
	d, err := cpuemu.Open(0, cpuemu.Options{SMs: sms})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func TestEmulatedLayoutKernel(t *testing.T) {
	d := openEmu(t, 3)
	n := 0
	for i, c := range layoutCases() {
		// An OS thread per CUDA thread: small T and at most 256 threads a
		// block keep it quick (the logic depends on the block size only
		// through whole warps, and capped grids take the grid-stride path).
		if c.s.Tokens > 1100 || (i%2 == 1 && c.s.Tokens > 300) {
			continue
		}
		if c.cfg.Threads == 0 || c.cfg.Threads > 256 {
			c.cfg.Threads = []int{64, 128, 256}[i%3]
		}
		n++
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			r, err := routing.Generate(c.s, c.gen)
			require.NoError(t, err, c)
			idx := append([]int64(nil), r.Idx...)
			if i%3 == 0 && len(idx) > 2 { // corrupt ids: skipped and counted
				idx[len(idx)/2], idx[0] = int64(c.s.Experts), -2
			}
			want := routing.NewLayout(c.s)
			wantInvalid := routing.CountLayout(idx, c.s, want.TokensPerRank, want.TokensPerExpert, want.IsTokenInRank)
			buf, in, err := routing.Upload(d, &routing.Routing{Shape: c.s, Idx: idx}, c.int32)
			require.NoError(t, err, c)
			defer d.Free(buf)
			dl, err := routing.NewDeviceLayout(d, c.s)
			require.NoError(t, err, c)
			defer dl.Close()
			for _, poison := range []byte{0xA5, 0x5A} { // the second launch needs a clean workspace
				require.NoError(t, dl.Poison(poison))
				require.NoError(t, routing.LaunchLayout(d, nil, in, dl.Out, c.cfg), c)
				got, invalid, err := dl.Read()
				require.NoError(t, err)
				require.NoError(t, want.Diff(got), "%v poison %#x", c, poison)
				require.Equal(t, wantInvalid, invalid, c)
				clean, err := dl.WorkspaceClean()
				require.NoError(t, err)
				require.True(t, clean, "%v: workspace left dirty", c)
			}
		})
	}
	require.Greater(t, n, 15, "too few layout cases run")
}

// Widening int32 ids sign-extends every id, in range or not.
func TestEmulatedWidenIDs(t *testing.T) {
	d := openEmu(t, 2)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 31, 257, 3001} {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(rng.Uint32()) >> rng.IntN(31)
		}
		ids[0] = -1
		src, err := d.Alloc(4 * n)
		require.NoError(t, err)
		dst, err := d.Alloc(8*n + 8)
		require.NoError(t, err)
		b := make([]byte, 4*n)
		for i, v := range ids {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		require.NoError(t, d.CopyIn(src.Ptr, b))
		poison := make([]byte, 8*n+8)
		for i := range poison {
			poison[i] = 0xEE
		}
		require.NoError(t, d.CopyIn(dst.Ptr, poison))
		require.NoError(t, routing.LaunchWidenIDs(d, nil, src.Ptr, dst.Ptr, n))
		out := make([]byte, 8*n+8)
		require.NoError(t, d.CopyOut(out, dst.Ptr))
		for i, v := range ids {
			require.Equal(t, int64(v), int64(binary.LittleEndian.Uint64(out[8*i:])), "n %d id %d", n, i)
		}
		require.Equal(t, poison[8*n:], out[8*n:], "n %d: wrote past the end", n)
		require.NoError(t, d.Free(src))
		require.NoError(t, d.Free(dst))
	}
}

func TestEmulatedKernelCoverage(t *testing.T) {
	cpuemu.CheckCoverage(t, []string{"layout.cu", "ep_convert.cu"}, nil)
}
