package routing_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/routing"
)

// TestLayoutKernelSourceEmulated compiles the real kernels/layout.cu with
// g++ against a host shim (testdata/emu: a thread per CUDA thread, barriers
// for __syncthreads and warp votes) and checks it against the reference on
// the backend cases, with the launch shapes LaunchLayout picks for an
// H200. CI has no GPU; this catches logic errors in the kernel source there.
// Skipped without g++.
func TestLayoutKernelSourceEmulated(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C++")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++ to build the emulation")
	}
	root := repoRoot()
	if root == "" {
		t.Skip("kernels/layout.cu not found from here (run the test binary from the package directory or the repository root)")
	}
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join(root, "kernels", "layout.cu"))
	require.NoError(t, err)
	s := string(src)
	for _, r := range [][2]string{
		{`extern __shared__ i32 s_counts[];`, `i32* s_counts = g_dyn_smem;`},
		{`__shared__ int s_last;`, `static int s_last;  // blocks run one at a time`},
		{`extern "C" __global__ void`, `extern "C" void`},
	} {
		require.Contains(t, s, r[0], "kernels/layout.cu changed: update the rewrite in this test")
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "layout_emu.cu"), []byte(s), 0o644))
	for _, f := range []string{"common.cuh", "harness.cc"} {
		b, err := os.ReadFile(filepath.Join(root, "ep", "routing", "testdata", "emu", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	bin := filepath.Join(dir, "harness")
	out, err := exec.Command(gxx, "-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function",
		"-o", bin, filepath.Join(dir, "harness.cc")).CombinedOutput()
	require.NoError(t, err, "g++:\n%s", out)

	type emuCase struct {
		layoutCase
		idx             []int64 // unvalidated: may hold bad ids
		rowOff          int
		blocks, threads int
	}
	var cases []emuCase
	for i, c := range layoutCases() {
		// An OS thread per CUDA thread and barriers for every vote are slow
		// on a 2-core CI machine: small T, and at most 128 threads a block
		// (the logic does not depend on the block size beyond whole warps).
		if c.s.Tokens > 1100 {
			continue
		}
		if c.cfg.Threads == 0 || c.cfg.Threads > 128 {
			c.cfg.Threads = 128
		}
		r, err := routing.Generate(c.s, c.gen)
		require.NoError(t, err)
		idx := r.Idx
		if i%3 == 0 && len(idx) > 0 { // some corrupt ids, which the kernel must skip and count
			idx = append([]int64(nil), idx...)
			idx[len(idx)/2] = int64(c.s.Experts)
			idx[0] = -2
		}
		plan, err := routing.PlanLayout(c.s, 132, c.cfg)
		require.NoError(t, err)
		cases = append(cases, emuCase{c, idx, []int{0, 0, 1, 4}[i%4], plan.Blocks, plan.Threads})
	}
	var in bytes.Buffer
	for _, c := range cases {
		for _, v := range []int{c.s.Tokens, c.s.K, c.s.Experts, c.s.Ranks, c.threads, c.blocks, boolInt(c.int32), c.rowOff} {
			in.Write(binary.LittleEndian.AppendUint32(nil, uint32(v)))
		}
		for _, v := range c.idx {
			if c.int32 {
				in.Write(binary.LittleEndian.AppendUint32(nil, uint32(int32(v))))
			} else {
				in.Write(binary.LittleEndian.AppendUint64(nil, uint64(v)))
			}
		}
	}
	cmd := exec.Command(bin)
	cmd.Stdin = &in
	got, err := cmd.Output()
	require.NoError(t, err)

	for _, c := range cases {
		s := c.s
		want := routing.NewLayout(s)
		wantInvalid := routing.CountLayout(c.idx, s, want.TokensPerRank, want.TokensPerExpert, want.IsTokenInRank)
		need := 4*(s.Ranks+s.Experts+1) + s.Tokens*s.Ranks + 2
		require.GreaterOrEqual(t, len(got), need, "%v: harness output too short", c.layoutCase)
		gl := routing.NewLayout(s)
		for i := range gl.TokensPerRank {
			gl.TokensPerRank[i] = int32(binary.LittleEndian.Uint32(got[4*i:]))
		}
		got = got[4*s.Ranks:]
		for i := range gl.TokensPerExpert {
			gl.TokensPerExpert[i] = int32(binary.LittleEndian.Uint32(got[4*i:]))
		}
		got = got[4*s.Experts:]
		invalid := int(int32(binary.LittleEndian.Uint32(got)))
		got = got[4:]
		copy(gl.IsTokenInRank, got)
		got = got[s.Tokens*s.Ranks:]
		guard, clean := got[0], got[1]
		got = got[2:]
		require.NoError(t, want.Diff(gl), "%v (blocks %d, row offset %d)", c.layoutCase, c.blocks, c.rowOff)
		require.Equal(t, wantInvalid, invalid, c.layoutCase)
		require.Equal(t, byte(1), guard, "%v: wrote outside is_token_in_rank", c.layoutCase)
		require.Equal(t, byte(1), clean, "%v: workspace left dirty", c.layoutCase)
	}
	require.Empty(t, got, "harness wrote more than expected")
}

// repoRoot finds the repository from the package directory (go test) or
// the root itself (a test binary run by scripts/device-run.sh).
func repoRoot() string {
	for _, dir := range []string{filepath.Join("..", ".."), "."} {
		if _, err := os.Stat(filepath.Join(dir, "ep", "routing", "testdata", "emu", "harness.cc")); err == nil {
			return dir
		}
	}
	return ""
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
