package channels_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/internal/device"
)

// world is a set of goroutine ranks to run a check on: the host backend
// always (CI), and 2 and 8 GPUs when this machine has them (2 and all of
// them on a machine of 3 to 7).
type world struct {
	kind  device.Kind
	ranks int
}

func (w world) String() string { return fmt.Sprintf("%s-%d", w.kind, w.ranks) }

func (w world) gpu() bool { return w.kind == device.CUDA }

// worlds lists the worlds; GPU worlds this machine cannot host are skipped
// with the reason (no driver, no GPU, too few GPUs), never failed.
func worlds(t *testing.T) []world {
	out := []world{{device.Host, 2}, {device.Host, 4}}
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Logf("cuda worlds skipped: no CUDA GPU (%v)", err)
		return out
	}
	// 2 and 8 ranks, and one per GPU on a 3-7 GPU machine; ranks share
	// GPUs when there are fewer GPUs than ranks.
	for _, want := range []int{2, 8} {
		out = append(out, world{device.CUDA, want})
	}
	if n > 2 && n < 8 {
		out = append(out, world{device.CUDA, n})
	}
	return out
}

// forWorlds runs fn as a subtest per world.
func forWorlds(t *testing.T, fn func(t *testing.T, w world)) {
	for _, w := range worlds(t) {
		t.Run(w.String(), func(t *testing.T) { fn(t, w) })
	}
}

// testWait bounds device waits in tests, so a broken protocol fails in
// seconds rather than the default minute.
const testWait = 30 * time.Second

// runRanks runs fn on every rank of w with a communicator and a channel
// mesh sized for transfers up to maxBytes, and fails the test with each
// rank's error.
func runRanks(t *testing.T, w world, maxBytes int, fn func(ctx context.Context, r *channeltest.Rank) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	errs := channeltest.RunRanks(ctx, w.kind, w.ranks, bootstrap.Config{Timeout: time.Minute},
		channels.Config{Timeouts: channels.Timeouts{Wait: testWait}}, channeltest.LayoutFor(maxBytes), fn)
	for r, err := range errs {
		assert.NoError(t, err, "%s rank %d", w, r)
	}
}

// runRaw runs fn on every rank of w with just a bootstrap and a device.
func runRaw(t *testing.T, w world, fn func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	errs := channeltest.RunLocal(ctx, w.kind, w.ranks, bootstrap.Config{Timeout: time.Minute}, fn)
	for r, err := range errs {
		assert.NoError(t, err, "%s rank %d", w, r)
	}
}

// sizes are the transfer sizes: 4 B to 16 MiB everywhere (odd sizes for
// the tails), up to 1 GiB on GPUs.
func sizes(w world) []int {
	s := []int{4, 5, 7, 16, 17, 31, 127, 1000, 4093, 65537, 1<<20 + 3, 16 << 20}
	if w.gpu() {
		s = append(s, 64<<20+9, 256<<20, 1<<30)
	}
	return s
}

func maxSize(s []int) int {
	m := 0
	for _, v := range s {
		m = max(m, v)
	}
	return m
}
