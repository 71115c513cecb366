package channels

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A full ring keeps the newest events, counts the overwritten ones as
// dropped, and a reset empties it.
func TestProxyTraceRingOverflow(t *testing.T) {
	const rank = 1 << 20 // no communicator's
	tr := newTraceTrack(rank, 0, RoleSender, 2)
	defer dropTraceTracks(tr)
	extra := 1000
	for i := range traceRingSize + extra {
		tr.rec(StageSend, OpWrite, uint64(i), 8, int64(i+1))
	}
	pt := SnapshotProxyTrace(rank)
	require.Equal(t, uint64(extra), pt.Dropped)
	require.Len(t, pt.Events, traceRingSize)
	seen := map[uint64]bool{}
	for _, e := range pt.Events {
		seen[e.Seq] = true
		require.EqualValues(t, 2, e.Socket)
	}
	for i := range traceRingSize + extra {
		require.Equal(t, i >= extra, seen[uint64(i)], "event %d", i)
	}
	require.Equal(t, uint64(extra), pt.Summary(0, 0).Dropped)
	ResetProxyTrace(rank)
	pt = SnapshotProxyTrace(rank)
	require.Empty(t, pt.Events)
	require.Zero(t, pt.Dropped)
	var nilTrack *traceTrack
	nilTrack.rec(StageSend, OpWrite, 0, 0, 1) // no ring, no panic
}

// Rings are allocated when tracing goes on (not at a track's first event,
// inside a traced call), and at a track's making while it is on.
func TestProxyTraceRingsAllocatedWhenSwitchedOn(t *testing.T) {
	const rank = 1<<20 + 1 // no communicator's
	prev := SetProxyTrace(false)
	defer SetProxyTrace(prev)
	before := newTraceTrack(rank, 0, RoleSender, 0)
	defer dropTraceTracks(before)
	require.Nil(t, before.ring, "off: no ring yet")
	SetProxyTrace(true)
	require.Len(t, before.ring, traceRingSize)
	after := newTraceTrack(rank, 0, RoleReceiver, 0)
	defer dropTraceTracks(after)
	require.Len(t, after.ring, traceRingSize)
	after.rec(StageRecv, OpWrite, 7, 1, TraceNow())
	require.Len(t, SnapshotProxyTrace(rank).Events, 1)
}

// Summary against figures worked out by hand.
func TestProxyTraceSummary(t *testing.T) {
	ev := func(st TraceStage, op TraceOp, role TraceRole, a, b, n int64) TraceEvent {
		return TraceEvent{Stage: st, Op: op, Role: role, Start: a, End: b, Bytes: n}
	}
	pt := &ProxyTrace{Events: []TraceEvent{
		ev(StageTrigger, OpPut, RoleProxy, 110, 120, 1000),
		ev(StageTrigger, OpPut, RoleProxy, 150, 160, 3),
		ev(StageTrigger, OpAtomicAdd, RoleProxy, 400, 405, 0),
		ev(StageSend, OpWrite, RoleSender, 120, 200, 1000),
		ev(StageSend, OpWrite, RoleSender, 180, 260, 3), // overlaps the first: busy 120-260
		ev(StageSend, OpWrite, RoleSender, 300, 340, 0), // busy 300-340
		ev(StageApply, OpWrite, RoleReceiver, 350, 350, 0),
		ev(StageApply, OpWrite, RoleConn, 900, 900, 0), // not a receiver's: not the last apply
		ev(StageSend, OpWrite, RoleSender, 10, 20, 5),  // outside the window
	}}
	s := pt.Summary(100, 500)
	require.Equal(t, 2, s.Requests[OpPut])
	require.Equal(t, int64(1003), s.Bytes[OpPut])
	require.Equal(t, 1, s.Requests[OpAtomicAdd])
	require.Equal(t, 1, s.Sizes[10]) // 1000 in [512, 1024)
	require.Equal(t, 1, s.Sizes[2])  // 3 in [2, 4)
	require.Equal(t, 10*time.Nanosecond, s.FirstTrigger)
	require.Equal(t, 240*time.Nanosecond, s.IdleGap) // 160 -> 400
	require.Equal(t, 250*time.Nanosecond, s.LastApply)
	require.Equal(t, 240*time.Nanosecond, s.LastSend)
	var send *TraceStageSummary
	for i := range s.Stages {
		if s.Stages[i].Stage == StageSend {
			send = &s.Stages[i]
		}
	}
	require.NotNil(t, send)
	require.Equal(t, 3, send.Events)
	require.Equal(t, int64(1003), send.Bytes)
	require.Equal(t, 180*time.Nanosecond, send.Busy) // 140 + 40
	require.Equal(t, 200*time.Nanosecond, send.Sum)  // 80 + 80 + 40
	require.InDelta(t, 0.45, send.BusyFrac, 1e-12)
	require.InDelta(t, 1003/400e-9, send.BytesPerSec, 1e-3)
	require.InDelta(t, 1003/180e-9, send.BusyBytesPerSec, 1e-3)
	require.Contains(t, s.String(), "send")
	var none *ProxyTrace
	require.Empty(t, none.Summary(0, 0).Stages)
}
