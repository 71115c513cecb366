package channels_test

import (
	"context"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/device"
)

// Every operation of the device API, on every world (host backend always;
// 2 and 8 GPUs when present). The checks are in channeltest, shared with
// `ep-bench channels --check`.

const seed = 0x5eed

// Put and get are byte-exact for every size, alignment and ring distance,
// and touch nothing around the destination.
func TestPutGet(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		s := sizes(w)
		runRanks(t, w, maxSize(s), func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckPutGet(ctx, seed, s)
		})
	})
}

// LL16 and LL8 packets carry every size byte-exact, and each launch
// advances the packet buffer's flag by one.
func TestPackets(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		s := sizes(w)
		for _, proto := range []int{16, 8} {
			runRanks(t, w, maxSize(s), func(ctx context.Context, r *channeltest.Rank) error {
				return r.CheckPackets(ctx, seed, s, proto)
			})
		}
	})
}

// Signals are never lost or duplicated: ping-pong with data (1,000,000
// round trips on GPUs), bursts of release and relaxed signals consumed by
// waits, relaxed waits and polls.
func TestSignalWait(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		rounds, burst := 1000, 300
		if w.gpu() {
			rounds, burst = 1_000_000, 100_000
		}
		runRanks(t, w, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckSignals(ctx, rounds, burst)
		})
	})
}

// Host-to-device semaphores, to a peer and through a loopback connection,
// signalled while the device already waits.
func TestHostSemaphores(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		count := 100
		if w.gpu() {
			count = 1000
		}
		runRanks(t, w, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckHostSemaphores(ctx, 3, count)
		})
	})
}

// goep_wait_ge_u64 under the communicator's watchdog sees a counter the
// host raises.
func TestCounterWait(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		runRanks(t, w, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckCounterWait(ctx)
		})
	})
}

// LL packets stay correct across 1,000 replays of one captured graph: the
// kernels advance the flags themselves.
func TestGraphReplaysPackets(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		words := 256
		if w.gpu() {
			words = 1 << 16
		}
		for _, proto := range []int{16, 8} {
			runRanks(t, w, 1<<20, func(ctx context.Context, r *channeltest.Rank) error {
				return r.CheckGraphPackets(ctx, seed, proto, words, 1000)
			})
		}
	})
}

// A peer that never signals (or never sends packets, or a counter nobody
// raises) gives a timeout error naming the wait, not a hang; the
// communicator then refuses work.
func TestTimeoutNamesTheWait(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			return channeltest.CheckTimeout(ctx, bs, dev, 200*time.Millisecond)
		})
	})
}

// Abort ends every waiting block at once.
func TestAbortEndsWaits(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			return channeltest.CheckAbort(ctx, bs, dev)
		})
	})
}
