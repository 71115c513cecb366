package channels_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
		checkTCPVariant(t, ahead)
	}
}

// checkTCPVariant runs the random operations over TCP with 4 KiB chunks
// and the given receiver, on the host backend (staging as GPUs do) and on
// the GPUs present.
func checkTCPVariant(t *testing.T, ahead int) {
	for _, w := range tcpWorlds(t) {
		t.Run(w.String()+"/ahead="+strconv.Itoa(ahead), func(t *testing.T) {
			if !w.gpu() {
				t.Setenv("GOEP_TCP_STAGE", "always")
			}
			nc := tcpNet(w.ranks)
			nc.ReceiveAhead, nc.ChunkBytes = ahead, 4<<10
			ops := tcpOpsCount() / 4
			runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
				c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: testWait}, Network: nc})
				if err != nil {
					return err
				}
				err = checkTCPRandomOps(ctx, c, seed+uint64(ahead), ops)
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

// StagingBytes: per socket 3 send buffers and ReceiveAhead receive buffers
// (2 when off) of ChunkBytes: 56 MiB with 8 sockets, 1 MiB chunks and the
// default read-ahead of 4; an unresolved config is refused.
func TestStagingBytes(t *testing.T) {
	for _, c := range []struct {
		cfg  channels.NetworkConfig
		want int
	}{
		{channels.NetworkConfig{Sockets: 8, ChunkBytes: 1 << 20, ReceiveAhead: 4}, 56 << 20},
		{channels.NetworkConfig{Sockets: 8, ChunkBytes: 1 << 20, ReceiveAhead: channels.ReceiveAheadOff}, 40 << 20},
		{channels.NetworkConfig{Sockets: 2, ChunkBytes: 4 << 10, ReceiveAhead: 16}, 2 * 19 * (4 << 10)},
	} {
		got, err := c.cfg.StagingBytes()
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%+v", c.cfg)
	}
	_, err := channels.NetworkConfig{}.StagingBytes()
	require.ErrorContains(t, err, "resolve the config first")
	nc, err := channels.NetworkConfig{Sockets: 3, ChunkBytes: 64 << 10}.Resolve(2)
	require.NoError(t, err)
	got, err := nc.StagingBytes()
	require.NoError(t, err)
	require.Equal(t, 3*(3+nc.ReceiveAhead)*(64<<10), got)
}
