package devapi

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Random triggers of every kind survive encoding, leave both commit bits
// to the pusher, and decode to what was encoded.
func TestTriggerRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		var tr Trigger
		tr.Channel = uint32(rng.IntN(TriggerMaxChannels))
		tr.Dst = uint32(rng.IntN(TriggerMaxMemories))
		tr.DstOff = uint64(rng.Uint32())
		if i%3 == 0 {
			tr.Type = []uint32{TriggerAtomicAdd, TriggerStore}[i%2]
			tr.Value = rng.Uint64()
			if i%6 == 0 {
				tr.Value |= 1 << 63
			}
		} else {
			tr.Type = TriggerPut | uint32(rng.IntN(4))<<1
			tr.Src = uint32(rng.IntN(TriggerMaxMemories))
			tr.SrcOff = uint64(rng.Uint32())
			tr.Size = uint64(rng.IntN(TriggerMaxSize + 1))
		}
		w0, w1 := tr.Words()
		require.Zero(t, w0&TriggerCommit, "%v", tr)
		require.Zero(t, w1&TriggerCommit, "%v", tr)
		require.Zero(t, w1&(1<<62), "bit 62 of word 1 stays zero: %v", tr)
		require.Equal(t, tr, DecodeTrigger(w0|TriggerCommit, w1|TriggerCommit), "commit bits are not payload")
	}
}

func TestCommitAlternatesByLap(t *testing.T) {
	for _, size := range []uint32{2, 4, 512} {
		for pos := uint64(0); pos < 4*uint64(size); pos++ {
			lap := pos / uint64(size)
			want := TriggerCommit
			if lap%2 == 1 {
				want = 0
			}
			require.Equal(t, want, Commit(pos, size), "pos %d size %d", pos, size)
		}
	}
}

func TestPortChannelEncodeDecode(t *testing.T) {
	c := PortChannel{
		Fifo:    Fifo{Triggers: 1 << 40, Head: 2 << 40, Tail: 3 << 40, TailCache: 4 << 40, Done: 5 << 40, Watchdog: 6 << 40, Size: 512},
		Sem:     Semaphore{Inbound: 0x1000, Expected: 0x2000, Watchdog: 6 << 40, Peer: 3, ID: 77},
		Channel: 1023, Dst: 255, Src: 7,
	}
	b := c.Bytes()
	require.Len(t, b, PortChannelSize)
	require.Equal(t, c, DecodePortChannel(b))
	require.Equal(t, c.Fifo, DecodeFifo(b[PCFifo:]))
	require.Equal(t, c.Sem, DecodeSemaphore(b[PCSem:]))
	for _, i := range []int{52, 56, 63, 124, 127} {
		require.Zero(t, b[i], "reserved byte %d", i)
	}
}
