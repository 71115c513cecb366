package channels

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// The budget keeps every rank's spinning blocks, together, below the SM
// count: a block waiting to start always finds an empty SM.
func TestSpinBudget(t *testing.T) {
	for _, c := range []struct{ sms, shared, want int }{
		{132, 1, 131}, {132, 2, 65}, {132, 4, 32}, {132, 8, 15}, {78, 8, 8}, {8, 8, 1}, {4, 8, 1}, {0, 8, 0}, {132, 0, 0},
	} {
		got := SpinBudget(c.sms, c.shared)
		require.Equal(t, c.want, got, "%d SMs, %d ranks", c.sms, c.shared)
		if c.sms >= 2*c.shared && c.shared > 0 {
			// shared ranks x (budget + one kept for non-spinning kernels) fit.
			require.LessOrEqual(t, c.shared*(got+1), c.sms)
		}
	}
	// The example: 8 ranks x 32 SMs on one 132-SM GPU is refused.
	require.Less(t, SpinBudget(132, 8), 32)
}

func TestPlacementMessageRoundTrip(t *testing.T) {
	p := placeInfo{pid: 4242, sms: 132, bus: "0000:1A:00.0"}
	copy(p.host[:], "host-identity-16")
	q, err := unmarshalPlaceInfo(p.marshal())
	require.NoError(t, err)
	require.Equal(t, p, q)
	_, err = unmarshalPlaceInfo([]byte("short"))
	require.Error(t, err)
	require.Equal(t, p.gpu(), placeInfo{host: p.host, bus: "0000:1a:00.0"}.gpu(), "bus ids compare case-insensitively")
}

// On the host backend placement is local (no limit) and costs no exchange.
func TestPlacementHost(t *testing.T) {
	bss, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	defer bss[0].Close()
	dev := device.OpenHost(0)
	defer dev.Close()
	c, err := NewCommunicator(bss[0], dev, Config{})
	require.NoError(t, err)
	defer c.Close()
	pl, err := c.Placement(context.Background())
	require.NoError(t, err)
	require.Equal(t, []int{0}, pl.SharedGPU)
	require.Zero(t, pl.SpinBlocks)
	require.NoError(t, c.CheckSpinLaunch("anything", 1<<20))
}
