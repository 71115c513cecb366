package buffer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internode"
)

// notifyConfig's put size: $GOEP_INTERNODE_PUT_BYTES when set, else the
// default of the network transport in $GOEP_NET_TRANSPORT (TCP unset); a
// transport it cannot parse is an error naming the variable.
func TestNotifyConfigPutBytes(t *testing.T) {
	c := Config{MaxTokens: 8}
	for _, tc := range []struct {
		transport, put string
		want           int
	}{
		{"", "", internode.DefaultPutBytes},
		{"tcp", "", internode.DefaultPutBytes},
		{"ipc", "", 0},
		{"ipc", "4m", 4 << 20},
		{"tcp", "0", 0},
	} {
		t.Setenv(channels.NetTransportEnv, tc.transport)
		t.Setenv(internode.PutBytesEnv, tc.put)
		nc, err := c.notifyConfig()
		require.NoError(t, err, "%+v", tc)
		require.Equal(t, tc.want, nc.PutBytes, "%+v", tc)
	}
	t.Setenv(internode.PutBytesEnv, "")
	t.Setenv(channels.NetTransportEnv, "nvlink")
	_, err := c.notifyConfig()
	require.ErrorContains(t, err, channels.NetTransportEnv)
}

// notifyConfig's forwarding: $GOEP_INTERNODE_FORWARD when set, else by
// block for large calls (auto) over the port over CUDA IPC and by node over
// TCP; a value it
// cannot parse is an error naming the variable.
func TestNotifyConfigForward(t *testing.T) {
	c := Config{MaxTokens: 8}
	for _, tc := range []struct {
		transport, forward string
		want               internode.Forward
	}{
		{"", "", internode.ForwardNodes},
		{"tcp", "", internode.ForwardNodes},
		{"ipc", "", internode.ForwardAuto},
		{"ipc", "nodes", internode.ForwardNodes},
		{"tcp", " Blocks ", internode.ForwardBlocks},
	} {
		t.Setenv(channels.NetTransportEnv, tc.transport)
		t.Setenv(internode.ForwardEnv, tc.forward)
		nc, err := c.notifyConfig()
		require.NoError(t, err, "%+v", tc)
		require.Equal(t, tc.want, nc.Forward, "%+v", tc)
	}
	t.Setenv(channels.NetTransportEnv, "")
	t.Setenv(internode.ForwardEnv, "pieces")
	_, err := c.notifyConfig()
	require.ErrorContains(t, err, internode.ForwardEnv)
	require.ErrorContains(t, err, "pieces")
}
