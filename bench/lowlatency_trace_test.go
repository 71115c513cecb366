package bench

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/kernelflags"
	"github.com/goep-dev/goep/lowlatency"
)

// --trace is refused where no kernel runs (the host backend's twins), and
// a $GOEP_LL_TRACE other than 0 or 1 is an error that leaves the switch
// as it was.
func TestLowLatencyTraceRefused(t *testing.T) {
	code, _, stderr := run(t, "lowlatency", "--backend", "host", "--ranks", "2", "--tokens", "1", "--hidden", "128",
		"--topk", "2", "--experts", "4", "--trace")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "--trace needs the cuda backend")
	t.Setenv(kernelflags.EnvLLTrace, "yes")
	before := kernelflags.LLTrace()
	_, err := applyLLTrace(true)
	require.ErrorContains(t, err, kernelflags.EnvLLTrace)
	require.Equal(t, before, kernelflags.LLTrace())
}

// traceRaw builds a trace region: for each kernel, blocks' stamps (ns
// after base, -1: not stamped) under one tag.
func traceRaw(base uint64, tag uint64, disp, comb [][]int64) []byte {
	raw := make([]byte, lowlatency.TraceBytes)
	for k, blocks := range [][][]int64{disp, comb} {
		for b, st := range blocks {
			rec := raw[(k*lowlatency.TraceBlocks+b)*lowlatency.TraceSlots*8:]
			binary.LittleEndian.PutUint64(rec, tag|uint64(k+1)<<56)
			binary.LittleEndian.PutUint64(rec[8:], uint64(b+1)|uint64(2*b+3)<<32)
			for e, v := range st {
				if v >= 0 {
					binary.LittleEndian.PutUint64(rec[8*(2+e):], base+uint64(v))
				}
			}
		}
	}
	return raw
}

// The trace tables: rank 0 and the slowest rank, min/median/max over
// blocks after the rank's first entry, the ranks' entry spread.
func TestWriteLLTraces(t *testing.T) {
	tag := uint64(1)<<63 | uint64(lowlatency.Both)<<52 | 7 // set 0, epoch 7
	// Dispatch events: entry, send_gate, send_issued, send_signalled,
	// recv_entry (none in a Both launch), recv_gate, tables, scan, copy,
	// recv_fenced, exit.
	d0 := [][]int64{
		{0, 1000, 2000, 3000, -1, 4000, 5000, 6000, 7000, 8000, 9000},
		{500, 1500, 4000, 5000, -1, 6000, 7000, 8000, 9000, 10000, 11000},
		{1000, 2000, 3000, 4000, -1, 5000, 6000, 7000, 8000, 9000, 10000},
	}
	d1 := [][]int64{
		{0, 1000, 2000, 3000, -1, 4000, 5000, 6000, 7000, 8000, 30000},
		{0, 1000, 2000, 3000, -1, 4000, 5000, 6000, 7000, 8000, 9000},
	}
	c := [][]int64{{0, 100, 200, 300, -1, 400, 500, 600, 700}}
	var ranks []*llRank
	for r, raw := range [][]byte{traceRaw(1_000_000, tag, d0, c), traceRaw(1_005_000, tag, d1, c)} {
		tr, err := lowlatency.ParseTrace(raw)
		require.NoError(t, err)
		ranks = append(ranks, &llRank{rank: r, traces: []llTraced{{tokens: 128, format: ep.LLBF16, trace: tr}}})
	}
	var out bytes.Buffer
	require.NoError(t, writeLLTraces(&out, device.CUDA, false, ranks))
	s := out.String()
	t.Logf("\n%s", s)
	require.Contains(t, s, "T=128 bf16 plain, dispatch: span (first entry to last stamp) rank 0 11.00 us, slowest rank 1 30.00 us")
	require.Contains(t, s, "entry spread across ranks: 5.00 us (r0 +0.00, r1 +5.00")
	require.Contains(t, s, "rank 0, 3 blocks; work a block (min/median/max): send units 1/2/3, receive rows 3/5/7")
	// send_issued over rank 0's blocks: 2, 3, 4 us.
	require.Regexp(t, `send_issued\s+3\s+2\.00\s+3\.00\s+4\.00`, s)
	require.Regexp(t, `exit\s+2\s+9\.00\s+19\.50\s+30\.00`, s)
	require.NotContains(t, s, "recv_entry")
	require.Contains(t, s, "T=128 bf16 plain, combine: span (first entry to last stamp) rank 0 0.70 us, slowest rank 0 0.70 us")
}
