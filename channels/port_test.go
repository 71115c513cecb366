package channels_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/device"
)

// Port channels on every world (host backend always; 2 and 8 GPUs when
// present), through the checks `ep-bench channels --check` runs.

// Puts, signals and flushes of random sizes arrive byte-exact and in order:
// the data of a put is there when the signal after it is (100,000 rounds on
// GPUs).
func TestPortStream(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		rounds, maxBytes := 200, 64<<10
		if testing.Short() {
			rounds = 50
		}
		if w.gpu() {
			rounds, maxBytes = 100_000, 1<<20
		}
		runRanks(t, w, maxBytes, func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckPortStream(ctx, seed, rounds, maxBytes)
		})
	})
}

// Concurrent atomic adds from every rank to every other rank's counters
// sum exactly (100,000 per rank on GPUs).
func TestPortAtomics(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		adds, grid := 3000, 1
		if w.gpu() {
			adds, grid = 100_000, 8
		}
		runRanks(t, w, 1<<16, func(ctx context.Context, r *channeltest.Rank) error {
			return r.CheckPortAtomics(ctx, seed, adds, grid)
		})
	})
}

// A proxy that never serves its FIFO gives timeout errors that name the
// flush or the full ring, the channel and the peer, not a hang.
func TestPortTimeouts(t *testing.T) {
	forWorlds(t, func(t *testing.T, w world) {
		runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			return channeltest.CheckPortTimeouts(ctx, bs, dev, 200*time.Millisecond)
		})
	})
}

// The measurements run (and check their counters) on the host backend.
func TestPortBenchmarks(t *testing.T) {
	runRanks(t, world{device.Host, 2}, 1<<20, func(ctx context.Context, r *channeltest.Rank) error {
		if _, err := r.BenchPortPingPong(ctx, 50); err != nil {
			return err
		}
		if _, err := r.BenchPortPut(ctx, []int{8, 64 << 10}, 3); err != nil {
			return err
		}
		rows, err := r.BenchPortAtomic(ctx, 2000)
		if err == nil && r.Comm.Rank() == 0 && len(rows) != 2 {
			err = fmt.Errorf("%d atomicAdd rows, want 2", len(rows))
		}
		return err
	})
}
