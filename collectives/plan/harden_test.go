package plan

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/apicheck"
)

// Class 1: nil receivers answer.
func TestNilReceivers(t *testing.T) {
	// The table of every exported type with methods (nil pointers, zero and
	// out-of-range values); the guard fails when a new one is not added.
	apicheck.Cover(t, ".", []any{(*Plan)(nil), (*HostWorld)(nil), (*Registry)(nil), (*Entry)(nil), (*Instr)(nil), &Instr{},
		BufKind(0), BufKind(255), ChannelType(0), ChannelType(255), Opcode(0), Opcode(255), PacketType(0), PacketType(255),
		ReduceOp(0), ReduceOp(255)}, apicheck.Options{})
	_, err := NewHostWorld(nil, 2, 64, false, HostConfig{})
	require.Error(t, err)
}

// Class 6: a scratch_chunks inside the validator's range but out of
// proportion to the data is refused by Resolve, before any allocation; the
// reference bound is recomputed here from the documented constants.
func TestScratchBounded(t *testing.T) {
	for _, sc := range []int{1, 8, 16, 17, 1000, 1 << 20} {
		p := mustParse(t, spec{in: 2, out: 2, scr: sc, tbs: []string{`{"id":0,"ops":[]}`}}.json())
		limit := ScratchChunksPerRank * 2 * 2 // per rank x ranks x data chunks
		_, err := Resolve(p, 0, 64, false)
		if sc <= limit {
			require.NoError(t, err, "scratch_chunks %d", sc)
			_, err = NewHostWorld(p, 2, 64, false, HostConfig{})
			require.NoError(t, err, "scratch_chunks %d", sc)
		} else {
			require.ErrorContains(t, err, "scratch_chunks", "scratch_chunks %d", sc)
			_, err = NewHostWorld(p, 2, 64, false, HostConfig{})
			require.Error(t, err, "scratch_chunks %d", sc)
		}
	}
	// Proportionate scratch with a huge message stays under the absolute
	// cap or is refused.
	p := mustParse(t, spec{in: 2, out: 2, scr: 16, double: true, tbs: []string{`{"id":0,"ops":[]}`}}.json())
	for _, msg := range []uint64{1 << 20, 1 << 30, 1 << 32, 1 << 40} {
		r, err := Resolve(p, 0, msg, false)
		if err == nil {
			require.LessOrEqual(t, r.ScratchBytes, uint64(MaxScratchBytes), "message %d", msg)
		} else {
			require.ErrorContains(t, err, "scratch", "message %d", msg)
		}
	}
}

// Class 6: errors echo at most a short prefix of a huge string field.
func TestHugeFieldsNotEchoed(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	base := spec{tbs: []string{`{"id":0,"ops":[]}`}}.json()
	for _, js := range []string{
		strings.Replace(base, `"name":"t"`, `"name":"`+huge+`","bogus_protocol":1`, 1),
		strings.Replace(base, `"protocol":"Simple"`, `"protocol":"`+huge+`"`, 1),
		strings.Replace(base, `"name":"t"`, `"name":"`+huge+`"`, 1) + "trailing",
		strings.Replace(base, `"channel_type":"memory"`, `"channel_type":"`+huge+`"`, 1),
		strings.Replace(base, `"ops":[]`, `"ops":[{"name":"`+huge+`"}]`, 1),
		strings.Replace(base, `"collective":"custom"`, `"collective":"custom","name":"`+huge+`","protocol":"`+huge+`"`, 1),
	} {
		_, err := Parse([]byte(js))
		if err == nil {
			continue // a plan that parses echoes nothing
		}
		require.Less(t, len(err.Error()), 4096, "error of %d bytes", len(err.Error()))
	}
	_, err := ParseDataType(huge)
	require.Less(t, len(err.Error()), 4096)
}

// Class 7: a cancelled context launches nothing; a rank that never joins
// is a timeout wrapping ErrTimeout.
func TestCancellationAndTimeouts(t *testing.T) {
	p := loadTestPlan(t, "allgather.json")
	w, err := NewHostWorld(p, p.World(), 1<<10, p.InPlace, HostConfig{Timeout: 200 * time.Millisecond})
	require.NoError(t, err)
	in, out, _ := buffers(w, FP32, 1)
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, w.Run(dead, FP32, in, out), context.Canceled)
	require.ErrorIs(t, w.RunRank(dead, 0, FP32, in[0], out[0]), context.Canceled)
	// Rank 0 joins alone: the others never come.
	err = w.RunRank(context.Background(), 0, FP32, in[0], out[0])
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorContains(t, err, "to start the launch")
	// Still usable afterwards.
	require.NoError(t, w.Run(context.Background(), FP32, in, out))
	// A caller's deadline while waiting for the others leaves the
	// gathering: the next launch is not polluted by the stale join.
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	err = w.RunRank(short, 0, FP32, in[0], out[0])
	require.True(t, errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout), "%v", err)
	require.NoError(t, w.Run(context.Background(), FP32, in, out))
}
