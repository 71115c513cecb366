package buffer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internode"
)

// notifyConfig's network tuning (NetworkTuningFromEnv): the put size from
// $GOEP_INTERNODE_PUT_BYTES and the forwarding from $GOEP_INTERNODE_FORWARD
// when set, else the defaults of the network transport in
// $GOEP_NET_TRANSPORT (TCP unset: 1 MiB pieces, by node; the port over
// CUDA IPC: one put per block, auto); a value it cannot parse is an error
// naming its variable.
func TestNotifyConfigNetwork(t *testing.T) {
	c := Config{MaxTokens: 8}
	for _, tc := range []struct {
		transport, put, forward, rate string
		wantPut                       int
		wantForward                   internode.Forward
		wantSMs                       int
	}{
		{"", "", "", "", internode.DefaultPutBytes, internode.ForwardNodes, 16},
		{"tcp", "", "", "", internode.DefaultPutBytes, internode.ForwardNodes, 16},
		{"ipc", "", "", "", 0, internode.ForwardAuto, 24},
		{"ipc", "", "", "50", internode.DefaultPutBytes, internode.ForwardAuto, 24},
		{"ipc", "4m", "nodes", "", 4 << 20, internode.ForwardNodes, 24},
		{"ipc", "0", "", "50", 0, internode.ForwardAuto, 24},
		{"tcp", "0", " Blocks ", "", 0, internode.ForwardBlocks, 16},
	} {
		t.Setenv(channels.NetTransportEnv, tc.transport)
		t.Setenv(internode.PutBytesEnv, tc.put)
		t.Setenv(internode.ForwardEnv, tc.forward)
		t.Setenv(channels.NetEmulateEnv, tc.rate)
		nc, err := c.notifyConfig()
		require.NoError(t, err, "%+v", tc)
		require.Equal(t, tc.wantPut, nc.PutBytes, "%+v", tc)
		require.Equal(t, tc.wantForward, nc.Forward, "%+v", tc)
		require.Equal(t, tc.wantSMs, nc.DefaultSMs, "%+v", tc)
		require.Zero(t, nc.SMs, "%+v: the caller named no grid", tc)
	}
	for _, bad := range []struct{ env, value string }{
		{channels.NetTransportEnv, "nvlink"}, {internode.PutBytesEnv, "lots"}, {internode.ForwardEnv, "pieces"},
		{channels.NetEmulateEnv, "fast"}, {channels.NetEmulateEnv, "-5"},
	} {
		for _, env := range []string{channels.NetTransportEnv, internode.PutBytesEnv, internode.ForwardEnv, channels.NetEmulateEnv} {
			t.Setenv(env, "")
		}
		t.Setenv(bad.env, bad.value)
		_, err := c.notifyConfig()
		require.ErrorContains(t, err, bad.env)
		require.ErrorContains(t, err, bad.value)
	}
}
