package channels_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// The proxy trace over a real TCP connection (two host ranks on two
// virtual nodes, loopback): rank 0's proxy carries a known sequence of
// puts, atomic adds, a put with signal and a flush to rank 1.

const traceChunk = 16 << 10

// tracePuts are the puts' sizes: one byte, under a chunk, exactly one,
// several chunks (striped over the 3 sockets), and the final put+signal.
var tracePuts = []int{1, 100, traceChunk, 2*traceChunk + 5, 777}

const traceAdds = 3

// runTraced runs the sequence with tracing on or off and returns the two
// ranks' snapshots.
func runTraced(t *testing.T, on, stage bool) [2]*channels.ProxyTrace {
	return runTracedWith(t, on, stage, channels.ProxyConfig{})
}

// runTracedWith is runTraced with rank 0's proxy built from cfg.
func runTracedWith(t *testing.T, on, stage bool, cfg channels.ProxyConfig) [2]*channels.ProxyTrace {
	if stage {
		t.Setenv("GOEP_TCP_STAGE", "always")
	}
	prev := channels.SetProxyTrace(false)
	t.Cleanup(func() { channels.SetProxyTrace(prev) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var snaps [2]*channels.ProxyTrace
	maxBytes := 64 << 10
	layout := channeltest.LayoutFor(maxBytes)
	errs := channeltest.RunRanks(ctx, device.Host, 2, bootstrap.Config{Timeout: time.Minute},
		channels.Config{Timeouts: channels.Timeouts{Wait: testWait},
			Network: channels.NetworkConfig{VirtualNodes: 2, Sockets: 3, ChunkBytes: traceChunk}},
		layout, func(ctx context.Context, r *channeltest.Rank) error {
			me := r.Comm.Rank()
			if err := r.EnsurePortWith(ctx, cfg); err != nil {
				return err
			}
			rng := rand.New(rand.NewPCG(uint64(me), 9))
			src := devapi.Bytes(r.Buf.Ptr, uint64(layout.Region))
			for i := range src {
				src[i] = byte(rng.Uint32())
			}
			dstOff := layout.Region + layout.Guard
			words := dstOff + 56<<10 // the adds' words, after the puts' bytes
			if err := r.Comm.Barrier(ctx); err != nil {
				return err
			}
			// Tracing goes on once every rank is set up, and the rings
			// start empty.
			channels.ResetProxyTrace(me)
			if me == 0 {
				channels.SetProxyTrace(on)
			}
			if err := r.Comm.Barrier(ctx); err != nil {
				return err
			}
			if me == 0 {
				h := r.PortByRank[1].DeviceHandle()
				off := 0
				for i, n := range tracePuts {
					flags := uint32(0)
					if i == len(tracePuts)-1 {
						// The adds first, so the signal follows them.
						for a := range traceAdds {
							if !devapi.PortAtomicAdd(h, h.Dst, uint64(words+8*a), uint64(a+1), 1) {
								return fmt.Errorf("atomic add %d", a)
							}
						}
						flags = devapi.TriggerSignal
					}
					if !devapi.PortPut(h, uint64(dstOff+off), uint64(off), uint64(n), flags, 1) {
						return fmt.Errorf("put %d", i)
					}
					off += n
				}
				if !devapi.PortFlush(h, 2) {
					return fmt.Errorf("flush")
				}
			} else {
				if !devapi.PortWait(r.PortByRank[0].DeviceHandle(), 3) {
					return fmt.Errorf("wait for rank 0's signal")
				}
				// What landed is rank 0's source (rank 0 drew it from
				// the same generator).
				peer := rand.New(rand.NewPCG(0, 9))
				want := make([]byte, layout.Region)
				for i := range want {
					want[i] = byte(peer.Uint32())
				}
				total := 0
				for _, n := range tracePuts {
					total += n
				}
				if got := devapi.Bytes(r.Buf.Ptr+uintptr(dstOff), uint64(total)); !bytes.Equal(got, want[:total]) {
					return fmt.Errorf("rank 1: the puts' bytes differ from rank 0's source")
				}
				for a := range traceAdds {
					if v := devapi.U64(r.Buf.Ptr + uintptr(words+8*a)).Load(); v != uint64(a+1) {
						return fmt.Errorf("rank 1: word %d holds %d, want %d", a, v, a+1)
					}
				}
			}
			if err := r.Comm.Barrier(ctx); err != nil {
				return err
			}
			if me == 0 {
				channels.SetProxyTrace(false)
			}
			if err := r.Comm.Barrier(ctx); err != nil {
				return err
			}
			snaps[me] = channels.SnapshotProxyTrace(me)
			return nil
		})
	require.NoError(t, errors.Join(errs...))
	return snaps
}

// A TCP connection bounds its own queues, so the proxy never flushes it
// for flow control: with MaxPending 1 (a flush after every operation on
// other connections) rank 0's trace still holds exactly the one flush the
// sequence asked for, staged or not.
func TestProxyNoFlowControlFlushOnTCP(t *testing.T) {
	for _, stage := range []bool{false, true} {
		t.Run(fmt.Sprintf("stage=%v", stage), func(t *testing.T) {
			snaps := runTracedWith(t, true, stage, channels.ProxyConfig{MaxPending: 1})
			flushes := 0
			for _, e := range snaps[0].Events {
				if e.Stage == channels.StageFlush {
					flushes++
				}
			}
			require.Equal(t, 1, flushes, "flushes on rank 0's connection")
		})
	}
}

func TestProxyTraceTCP(t *testing.T) {
	for _, stage := range []bool{false, true} {
		t.Run(fmt.Sprintf("stage=%v", stage), func(t *testing.T) {
			snaps := runTraced(t, true, stage)
			tx, rx := snaps[0], snaps[1]
			require.Zero(t, tx.Dropped)
			s := tx.Summary(0, 0)
			// Triggers: every put but the last plain, the last with a
			// signal, the adds, one flush (what the test pushed).
			total := 0
			for _, n := range tracePuts {
				total += n
			}
			last := tracePuts[len(tracePuts)-1]
			require.Equal(t, len(tracePuts)-1, s.Requests[channels.OpPut])
			require.Equal(t, int64(total-last), s.Bytes[channels.OpPut])
			require.Equal(t, 1, s.Requests[channels.OpPutSignal])
			require.Equal(t, int64(last), s.Bytes[channels.OpPutSignal])
			require.Equal(t, traceAdds, s.Requests[channels.OpAtomicAdd])
			require.Equal(t, 1, s.Requests[channels.OpFlush])
			var hist [channels.TraceSizeBuckets]int
			for _, n := range tracePuts {
				k := 0
				for (1 << k) <= n {
					k++
				}
				hist[k]++
			}
			require.Equal(t, hist, s.Sizes)

			// The connection's messages: each put cut into chunks.
			chunks := 0
			for _, n := range tracePuts {
				chunks += (n + traceChunk - 1) / traceChunk
			}
			type key struct {
				stage channels.TraceStage
				seq   uint64
			}
			at := map[key]channels.TraceEvent{}
			writes := map[uint64]int64{}
			for _, e := range tx.Events {
				if e.Stage == channels.StageTrigger {
					continue
				}
				require.EqualValues(t, 1, e.Peer, "rank 0's events are toward rank 1: %+v", e)
				require.LessOrEqual(t, e.Start, e.End)
				if e.Stage == channels.StageEnqueue && e.Op == channels.OpWrite {
					writes[e.Seq] = e.Bytes
				}
				at[key{e.Stage, e.Seq}] = e
			}
			var sent int64
			for _, b := range writes {
				sent += b
			}
			require.Len(t, writes, chunks)
			require.Equal(t, int64(total), sent)
			applied := map[channels.TraceOp]int{}
			for _, e := range rx.Events {
				if e.Role != channels.RoleReceiver {
					continue
				}
				require.EqualValues(t, 0, e.Peer)
				if e.Stage == channels.StageApply {
					applied[e.Op]++
				}
				at[key{e.Stage + 64, e.Seq}] = e // receiving side, apart
			}
			require.Equal(t, chunks, applied[channels.OpWrite])
			require.Equal(t, traceAdds, applied[channels.OpAtomicAdd])
			for seq, n := range writes {
				get := func(st channels.TraceStage, rx bool) channels.TraceEvent {
					k := key{st, seq}
					if rx {
						k.stage += 64
					}
					e, ok := at[k]
					require.True(t, ok, "write %d: no %s event (receiving side %v)", seq, st, rx)
					return e
				}
				enq, send := get(channels.StageEnqueue, false), get(channels.StageSend, false)
				require.Equal(t, n, send.Bytes)
				order := []int64{enq.Start}
				if stage {
					co := get(channels.StageCopyOut, false)
					order = append(order, co.Start, co.End)
				}
				recv, turn, in, apply := get(channels.StageRecv, true), get(channels.StageTurn, true), get(channels.StageCopyIn, true), get(channels.StageApply, true)
				require.Equal(t, n, in.Bytes)
				order = append(order, send.Start, recv.Start, recv.End, turn.End, in.Start, in.End, apply.Start)
				for i := 1; i < len(order); i++ {
					require.LessOrEqual(t, order[i-1], order[i], "write %d: stage %d of %v out of order", seq, i, order)
				}
			}
			var flushes int
			for _, e := range tx.Events {
				if e.Stage == channels.StageFlush {
					flushes++
				}
			}
			require.GreaterOrEqual(t, flushes, 1, "the flush's request and acknowledgement")
			rs := rx.Summary(0, 0)
			require.GreaterOrEqual(t, rs.LastApply, time.Duration(0))
			t.Logf("rank 0 (sending):\n%s\nrank 1 (receiving):\n%s", s, rx.Summary(0, 0))
		})
	}
}

// Off, nothing is recorded, though the same work runs.
func TestProxyTraceOff(t *testing.T) {
	snaps := runTraced(t, false, false)
	for r, s := range snaps {
		require.Empty(t, s.Events, "rank %d", r)
		require.Zero(t, s.Dropped)
	}
}
