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
