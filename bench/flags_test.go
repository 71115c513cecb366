package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckOutput(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, checkOutput("json", ""))
	require.NoError(t, checkOutput("json", "-"))
	require.NoError(t, checkOutput("json", filepath.Join(dir, "new.json")))
	require.ErrorContains(t, checkOutput("json", filepath.Join(dir, "a", "b.json")), "the folder "+filepath.Join(dir, "a")+" does not exist")
	require.ErrorContains(t, checkOutput("json", dir), "that is a folder")
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	require.ErrorContains(t, checkOutput("plot", filepath.Join(file, "x.png")), file+" is not a folder")
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
		require.ErrorContains(t, checkOutput("json", filepath.Join(ro, "x.json")), "is not writable")
	}
	long := strings.Repeat("d", 5000)
	err := checkOutput("json", filepath.Join(dir, long, "x.json"))
	require.Error(t, err)
	require.Less(t, len(err.Error()), 2*maxEchoLine+200, "echoed paths are clipped")
}

func TestClipAndClipLines(t *testing.T) {
	require.Equal(t, "abc", clip("abc", 3))
	got := clip(strings.Repeat("ü", 10), 5) // 20 bytes, 2 per rune: never cut inside one
	require.Equal(t, "üü... (20 bytes in all)", got)
	require.Equal(t, "ab... (4 bytes in all)\nok", clipLines("abcd\nok", 2))
}

func TestCheckMasked(t *testing.T) {
	require.NoError(t, checkMasked(0, 8, []int{0}))
	require.NoError(t, checkMasked(1024, 8, []int{0, 128}), "small counts of a sweep mask all they have")
	require.ErrorContains(t, checkMasked(1025, 8, []int{0, 128}), "--masked 1025: more than the 1024 (token, slot) entries of 128 tokens x top-8")
}

func TestGBps(t *testing.T) {
	for v, want := range map[float64]string{0: "-", -1: "-", 0.0027312: "0.00273", 1.234: "1.23", 9.99: "9.99", 12.345: "12.3", 456.78: "456.8"} {
		require.Equal(t, want, gbps(v), "%v", v)
	}
}

func TestAbortOnCancel(t *testing.T) {
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	release := abortOnCancel(ctx, func() error { calls.Add(1); return nil })
	cancel()
	release() // waits for the abort under way
	require.Equal(t, int32(1), calls.Load())

	ctx, cancel = context.WithCancel(context.Background())
	release = abortOnCancel(ctx, func() error { calls.Add(1); return nil })
	release()
	cancel()
	require.Equal(t, int32(1), calls.Load(), "no abort after release")
}

func TestInterruptedExitCode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var errb strings.Builder
	require.Equal(t, exitInterrupted, finish(ctx, "x", context.Canceled, &errb))
	require.Equal(t, "ep-bench x: interrupted\n", errb.String())
	errb.Reset()
	require.Equal(t, 0, finish(ctx, "x", nil, &errb), "a run that finished is not interrupted")
	require.Empty(t, errb.String())
}
