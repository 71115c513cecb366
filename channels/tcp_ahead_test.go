package channels_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// The read-ahead receiver (NetworkConfig.ReceiveAhead): the random
// operations (writes cut into 4 KiB chunks, so a write spans many sockets
// and a socket's reader is often ahead of the apply order; updates, atomic
// adds, flushes) stay byte-exact and in order, with the host backend
// staging as GPUs do, and with 2 and 3 buffers a socket (3: the ring of a
// socket's buffers not a power of two); then on the GPUs present.
func TestTCPReceiveAhead(t *testing.T) {
	for _, ahead := range []int{channels.ReceiveAheadOff, 2, 3} {
		checkTCPVariant(t, ahead, 4<<10, channels.StripeOff)
	}
}

// Striped writes (NetworkConfig.StripeBytes): with 64 KiB chunks and a
// 4 KiB stripe, every write above 4 KiB is cut into one piece a socket
// (pieces of 4 KiB up to 64 KiB, the last one short), so pieces of one
// write land on every socket and the receiver reassembles them in order:
// the random operations stay byte-exact and ordered, with the read-ahead
// receiver and without.
func TestTCPStripe(t *testing.T) {
	for _, ahead := range []int{channels.ReceiveAheadOff, 3} {
		checkTCPVariant(t, ahead, 64<<10, 4<<10)
	}
}

// checkTCPVariant runs the random operations over TCP with chunks of
// chunk bytes, the given stripe and receiver, on the host backend (staging
// as GPUs do) and on the GPUs present.
func checkTCPVariant(t *testing.T, ahead, chunk, stripe int) {
	for _, w := range tcpWorlds(t) {
		name := w.String() + "/ahead=" + strconv.Itoa(ahead)
		if stripe > 0 {
			name += "/stripe=" + strconv.Itoa(stripe)
		}
		t.Run(name, func(t *testing.T) {
			if !w.gpu() {
				t.Setenv("GOEP_TCP_STAGE", "always")
			}
			nc := tcpNet(w.ranks)
			nc.ReceiveAhead, nc.ChunkBytes, nc.StripeBytes = ahead, chunk, stripe
			ops := tcpOpsCount() / 4
			runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
				c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: testWait}, Network: nc})
				if err != nil {
					return err
				}
				err = checkTCPRandomOps(ctx, c, seed+uint64(ahead)+uint64(stripe), ops)
				return errors.Join(err, c.Close())
			})
		})
	}
}

// ReceiveAhead outside ReceiveAheadOff and 2..16 is refused, naming the
// variable.
func TestTCPReceiveAheadRefused(t *testing.T) {
	for _, bad := range []int{1, 17, -2} {
		w := world{device.Host, 2}
		runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
			nc := tcpNet(2)
			nc.ReceiveAhead = bad
			c, err := channels.NewCommunicator(bs, dev, channels.Config{Network: nc})
			if err == nil {
				_ = c.Close()
				return errors.New("ReceiveAhead " + strconv.Itoa(bad) + " accepted")
			}
			for _, want := range []string{"ReceiveAhead " + strconv.Itoa(bad), channels.TCPAheadEnv} {
				if !strings.Contains(err.Error(), want) {
					return errors.New("refusal does not say " + want + ": " + err.Error())
				}
			}
			return nil
		})
	}
}

// $GOEP_TCP_RECEIVE_AHEAD: unset is 4 buffers a socket, "off" and 0 the
// original receiver, a number that many buffers; anything else is refused
// naming the variable. A Config value wins over it.
func TestTCPReceiveAheadEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
	}{{"", 4}, {"off", channels.ReceiveAheadOff}, {" OFF ", channels.ReceiveAheadOff}, {"0", channels.ReceiveAheadOff},
		{"2", 2}, {"16", 16}} {
		t.Setenv(channels.TCPAheadEnv, c.env)
		nc, err := channels.NetworkConfig{}.Resolve(2)
		if err != nil || nc.ReceiveAhead != c.want {
			t.Errorf("$%s=%q: got %d, %v; want %d", channels.TCPAheadEnv, c.env, nc.ReceiveAhead, err, c.want)
		}
	}
	for _, bad := range []string{"four", "1", "17"} {
		t.Setenv(channels.TCPAheadEnv, bad)
		if _, err := (channels.NetworkConfig{}).Resolve(2); err == nil || !strings.Contains(err.Error(), channels.TCPAheadEnv) {
			t.Errorf("$%s=%q: got %v, want a refusal naming the variable", channels.TCPAheadEnv, bad, err)
		}
	}
	t.Setenv(channels.TCPAheadEnv, "off")
	if nc, err := (channels.NetworkConfig{ReceiveAhead: 3}).Resolve(2); err != nil || nc.ReceiveAhead != 3 {
		t.Errorf("Config 3 under $%s=off: got %d, %v; want 3", channels.TCPAheadEnv, nc.ReceiveAhead, err)
	}
}

// $GOEP_TCP_STRIPE_BYTES: unset, "off" and 0 are whole chunks, a number is
// the stripe; a non-number, a stripe under 4 KiB or above the chunk is
// refused naming the variable. A Config value wins over it.
func TestTCPStripeEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
	}{{"", channels.StripeOff}, {"off", channels.StripeOff}, {"0", channels.StripeOff}, {"4096", 4096}, {" 65536 ", 65536}, {"1048576", 1 << 20}} {
		t.Setenv(channels.TCPStripeEnv, c.env)
		nc, err := channels.NetworkConfig{}.Resolve(2)
		if err != nil || nc.StripeBytes != c.want {
			t.Errorf("$%s=%q: got %d, %v; want %d", channels.TCPStripeEnv, c.env, nc.StripeBytes, err, c.want)
		}
	}
	for _, bad := range []string{"wide", "4095", "1048577", "-2"} {
		t.Setenv(channels.TCPStripeEnv, bad)
		if _, err := (channels.NetworkConfig{}).Resolve(2); err == nil || !strings.Contains(err.Error(), channels.TCPStripeEnv) {
			t.Errorf("$%s=%q: got %v, want a refusal naming the variable", channels.TCPStripeEnv, bad, err)
		}
	}
	t.Setenv(channels.TCPStripeEnv, "off")
	if nc, err := (channels.NetworkConfig{StripeBytes: 8192}).Resolve(2); err != nil || nc.StripeBytes != 8192 {
		t.Errorf("Config 8192 under $%s=off: got %d, %v; want 8192", channels.TCPStripeEnv, nc.StripeBytes, err)
	}
	t.Setenv(channels.TCPStripeEnv, "")
	if _, err := (channels.NetworkConfig{StripeBytes: 8192, ChunkBytes: 4096}).Resolve(2); err == nil {
		t.Errorf("a stripe above the chunk was accepted")
	}
}

// The pieces a write is cut into, worked by hand: 8 sockets, 1 MiB chunks.
func TestTCPPieceBytes(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ stripe, size, want int }{
		{channels.StripeOff, 880_000, mib}, // off: whole chunks
		{channels.StripeOff, 100 * mib, mib},
		{64 << 10, 880_000, 108 << 10},  // 110,000 a socket, rounded up to 4 KiB: 110,592
		{64 << 10, 300_000, 64 << 10},   // 37,500 a socket: the stripe is the least
		{64 << 10, 64 << 10, mib},       // no larger than the stripe: one piece
		{64 << 10, 4 * mib, 512 << 10},  // half a chunk a socket
		{64 << 10, 8 * mib, mib},        // a chunk a socket
		{64 << 10, 100 * mib, mib},      // more: whole chunks
		{256 << 10, 880_000, 256 << 10}, // a larger stripe wins over the share
	} {
		if got := channels.TCPPieceBytesForTest(8, mib, c.stripe, c.size); got != c.want {
			t.Errorf("stripe %d, write of %d: pieces of %d, want %d", c.stripe, c.size, got, c.want)
		}
	}
}
