package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/routing"
)

func writeNPY(t *testing.T, idx []int64, tokens, k int, as32 bool) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, WriteNPY(&b, idx, tokens, k, as32))
	path := filepath.Join(t.TempDir(), "topk.npy")
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	return path
}

// Hand case: 4 tokens, 2 ranks (experts 0,1 | 2,3), block placement puts
// tokens 0,1 on rank 0 and 2,3 on rank 1.
var routeIdx = []int64{
	0, 1, // rank 0 -> rank 0
	2, -1, // rank 0 -> rank 1
	0, 3, // rank 1 -> ranks 0 and 1
	-1, -1, // rank 1 -> nowhere
}

func TestRouteCommandTables(t *testing.T) {
	path := writeNPY(t, routeIdx, 4, 2, true)
	code, stdout, stderr := run(t, "route", "--file", path, "--experts", "4", "--ranks", "2", "--hidden", "1024")
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{
		"T=4 K=2 (<i4), E=4 over R=2 ranks (2 experts each), 3 entries masked (-1)",
		"tokens placed by block",
		"2048 bytes per token",
		"imbalance (max/mean): rank tokens received 1.000, rank expert slots 1.200, expert tokens 1.600",
		"    0:      2      1      1      1",
	} {
		assert.Contains(t, stdout, want)
	}
	// The traffic matrix in tokens: every pair exchanges one token.
	i := strings.Index(stdout, "traffic in tokens")
	require.GreaterOrEqual(t, i, 0)
	lines := strings.Split(stdout[i:], "\n")
	assert.Equal(t, []string{"src\\dst", "0", "1"}, strings.Fields(lines[1]))
	assert.Equal(t, []string{"0", "1", "1"}, strings.Fields(lines[2]))
	assert.Equal(t, []string{"1", "1", "1"}, strings.Fields(lines[3]))
}

func TestRouteCommandJSON(t *testing.T) {
	path := writeNPY(t, routeIdx, 4, 2, false)
	code, stdout, stderr := run(t, "route", "--file", path, "--experts", "4", "--ranks", "2", "--hidden", "1024",
		"--source-rank-of", "cyclic", "--json", "-")
	require.Equal(t, 0, code, stderr)
	var rep map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	assert.Equal(t, "<i8", rep["dtype"])
	assert.Equal(t, map[string]any{"kind": "cyclic"}, rep["placement"])
	// Cyclic: tokens 0,2 on rank 0, tokens 1,3 on rank 1.
	assert.Equal(t, []any{[]any{2.0, 1.0}, []any{0.0, 1.0}}, rep["matrix_tokens"])
	assert.Equal(t, []any{[]any{4096.0, 2048.0}, []any{0.0, 2048.0}}, rep["matrix_bytes_bf16"])
	assert.Equal(t, []any{4096.0, 4096.0}, rep["recv_bytes_bf16"])
	assert.Equal(t, []any{2048.0, 0.0}, rep["remote_send_bytes_bf16"])
	assert.Equal(t, 4.0, rep["tokens"])
	assert.Equal(t, 3.0, rep["masked_entries"])

	out := filepath.Join(t.TempDir(), "route.json")
	code, stdout, _ = run(t, "route", "--file", path, "--experts", "4", "--ranks", "2", "--source-rank-of", "rank:1", "--json", out)
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "tokens placed by rank:1")
	rep = readJSON[map[string]any](t, out)
	assert.Equal(t, []any{[]any{0.0, 0.0}, []any{2.0, 2.0}}, rep["matrix_tokens"])
}

func TestRouteCommandErrors(t *testing.T) {
	good := writeNPY(t, routeIdx, 4, 2, false)
	badID := writeNPY(t, []int64{0, 1, 2, 9}, 2, 2, false)
	fortran := filepath.Join(t.TempDir(), "f.npy")
	hdr := "{'descr': '<i8', 'fortran_order': True, 'shape': (1, 1), }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	require.NoError(t, os.WriteFile(fortran, append([]byte("\x93NUMPY\x01\x00\x76\x00"+hdr), make([]byte, 8)...), 0o644))
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"--experts", "4", "--ranks", "2"}, "want --file FILE.npy (a routing to read) or --generate FILE.npy"},
		{[]string{"--topk", good, "--experts", "4", "--ranks", "2"}, "the routing file to read is --file"},
		{[]string{"--topk", "8", "--experts", "4", "--ranks", "2"}, "route reads the routing from --file"},
		{[]string{"--file", good, "--topk", "4", "--experts", "4", "--ranks", "2"}, "describe what --generate writes"},
		{[]string{"--file", good, "--generate", good, "--experts", "4", "--ranks", "2"}, "exclude each other"},
		{[]string{"--generate", filepath.Join(t.TempDir(), "no", "such", "r.npy"), "--experts", "4", "--ranks", "2"}, "does not exist"},
		{[]string{"--generate", filepath.Join(t.TempDir(), "g.npy"), "--tokens", "2", "--topk", "2", "--masked", "5", "--experts", "4", "--ranks", "2"}, "--masked 5"},
		{[]string{"--file", good, "--experts", "4", "--ranks", "2", "--json", filepath.Join(t.TempDir(), "no", "r.json")}, "does not exist"},
		{[]string{"--file", good, "--ranks", "2"}, "--experts and --ranks are required"},
		{[]string{"--file", filepath.Join(t.TempDir(), "nope.npy"), "--experts", "4", "--ranks", "2"}, "no such file"},
		{[]string{"--file", fortran, "--experts", "4", "--ranks", "2"}, "fortran_order is True"},
		{[]string{"--file", badID, "--experts", "4", "--ranks", "2"}, "topk_idx[1][1] = 9"},
		{[]string{"--file", good, "--experts", "6", "--ranks", "4"}, "do not divide evenly"},
		{[]string{"--file", good, "--experts", "4", "--ranks", "2", "--source-rank-of", "rank:2"}, "only 2 ranks"},
		{[]string{"--file", good, "--experts", "4", "--ranks", "2", "--source-rank-of", "striped"}, "want block, cyclic or rank:N"},
		{[]string{"--file", good, "--experts", "4", "--ranks", "2", "--hidden", "-1"}, "--hidden"},
	}
	for _, c := range cases {
		code, _, stderr := run(t, append([]string{"route"}, c.args...)...)
		assert.Equal(t, 1, code, c.msg)
		assert.Contains(t, stderr, c.msg)
	}
}

// route --generate writes every rank's routing from intranode's generator
// and seeds, rank 0's tokens first, then reports on it as --file would.
func TestRouteGenerate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.npy")
	code, stdout, stderr := run(t, "route", "--generate", path, "--tokens", "64", "--topk", "4", "--experts", "16", "--ranks", "4",
		"--seed", "3", "--masked", "5", "--json", "-")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "route: wrote "+path)
	n, err := LoadNPY(path)
	require.NoError(t, err)
	require.Equal(t, 256, n.Tokens)
	require.Equal(t, 4, n.K)
	require.False(t, n.Int32)
	var want []int64
	for r := range 4 {
		rt, err := routing.Generate(routing.Shape{Tokens: 64, K: 4, Experts: 16, Ranks: 4}, routing.GenOptions{Seed: 3*1000 + uint64(r), Masked: 5})
		require.NoError(t, err)
		want = append(want, rt.Idx...)
	}
	require.Equal(t, want, n.Idx)
	masked := 0
	for _, v := range n.Idx {
		if v < 0 {
			masked++
		}
	}
	require.Equal(t, 4*5, masked)
	var rep routeReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.Equal(t, 256, rep.Tokens)
	require.Equal(t, int64(64), rep.SourceTokens[3], "block placement: rank 3 holds its own 64 tokens")

	// The same file through --file gives the same report.
	code, again, stderr := run(t, "route", "--file", path, "--experts", "16", "--ranks", "4", "--json", "-")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, stdout, again)
}
