package internode

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
)

// The default grid: the Buffer's pick (or DefaultSMs), capped by the
// device's SMs and the spin budget where they are known.
func TestDefaultGrid(t *testing.T) {
	for _, tc := range []struct{ want, devSMs, spin, grid int }{
		{0, 132, 0, DefaultSMs},
		{PortSMs, 132, 0, PortSMs},
		{PortSMs, 20, 0, 20},
		{PortSMs, 132, 8, 8},
		{PortSMs, 0, 0, PortSMs},
		{0, 2, 0, 2},
		{3, 132, 66, 3},
	} {
		require.Equal(t, tc.grid, defaultGrid(tc.want, tc.devSMs, tc.spin), "%+v", tc)
	}
	require.Equal(t, PortSMs, DefaultSMsOver(channels.TransportCudaIPC))
	require.Equal(t, DefaultSMs, DefaultSMsOver(channels.TransportEthernet))
}
