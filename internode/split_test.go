package internode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// The split's forms, defaults and refusals.
func TestSplit(t *testing.T) {
	for _, c := range []struct {
		in   string
		want internode.Split
	}{
		{"", internode.Split{}}, {"default", internode.Split{}}, {"shared", internode.Split{Shared: true}},
		{"4,8,4", internode.Split{Senders: 4, Forwarders: 8, Receivers: 4}}, {" 1, 1 ,1 ", internode.Split{Senders: 1, Forwarders: 1, Receivers: 1}},
	} {
		got, err := internode.ParseSplit(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
		back, err := internode.ParseSplit(got.String())
		require.NoError(t, err)
		require.Equal(t, got, back, "String and ParseSplit round trip")
	}
	for _, bad := range []string{"0,1,1", "1,-1,1", "1,1", "1,1,1,1", "a,b,c", "sharedx", "70000,1,1", "1023,1,1", "1,1,1023"} {
		_, err := internode.ParseSplit(bad)
		require.Error(t, err, bad)
	}
	require.Error(t, internode.Split{Senders: 1, Forwarders: 1, Receivers: 1, Shared: true}.Validate())
	// A grid holds at most 1024 blocks (a unit word per sender block).
	require.NoError(t, internode.Split{Senders: 1022, Forwarders: 1, Receivers: 1}.Validate())
	require.ErrorContains(t, internode.Split{Senders: 1 << 30, Forwarders: 1 << 30, Receivers: 1 << 30}.Validate(), "more than 1024 blocks")
	// Defaults: a quarter senders and receivers, the rest forwarders; small
	// grids shared.
	for g, want := range map[int]internode.Split{1: {Shared: true}, 3: {Shared: true}, 4: {Senders: 1, Forwarders: 2, Receivers: 1},
		16: {Senders: 4, Forwarders: 8, Receivers: 4}, 24: {Senders: 6, Forwarders: 12, Receivers: 6}, 7: {Senders: 1, Forwarders: 5, Receivers: 1}} {
		got := internode.DefaultSplit(g)
		require.Equal(t, want, got, "grid %d", g)
		if !got.Shared {
			require.Equal(t, g, got.Total())
		}
	}
}

// With no split configured a launch runs the grid's role split below
// SharedSplitTokens tokens and Shared from there on; a configured split,
// Shared or counts, is run at every token count.
func TestLaunchSplitFollowsTokens(t *testing.T) {
	roles := internode.DefaultSplit(16)
	shared := internode.Split{Shared: true}
	counts := internode.Split{Senders: 2, Forwarders: 12, Receivers: 2}
	for _, c := range []struct {
		configured, resolved internode.Split
		tokens               int
		want                 internode.Split
	}{
		{internode.Split{}, roles, 0, roles},
		{internode.Split{}, roles, 128, roles},
		{internode.Split{}, roles, internode.SharedSplitTokens - 1, roles},
		{internode.Split{}, roles, internode.SharedSplitTokens, shared},
		{internode.Split{}, roles, 4096, shared},
		{counts, counts, 4096, counts},
		{counts, counts, 1, counts},
		{shared, shared, 1, shared},
	} {
		require.Equal(t, c.want, internode.LaunchSplitFor(c.configured, c.resolved, c.tokens), "%+v", c)
	}
	require.Equal(t, internode.Split{Senders: 4, Forwarders: 8, Receivers: 4}, roles)
}

// ParseForward's forms and refusals, and the default per transport.
func TestParseForward(t *testing.T) {
	for in, want := range map[string]internode.Forward{"nodes": internode.ForwardNodes, " Blocks ": internode.ForwardBlocks, "node": internode.ForwardNodes, "block": internode.ForwardBlocks, "Auto": internode.ForwardAuto} {
		got, err := internode.ParseForward(in, internode.ForwardNodes)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, def := range []internode.Forward{internode.ForwardNodes, internode.ForwardBlocks, internode.ForwardAuto} {
		got, err := internode.ParseForward(" ", def)
		require.NoError(t, err)
		require.Equal(t, def, got, "unset gives the default")
	}
	for _, bad := range []string{"pieces", "0", "nodes,blocks"} {
		_, err := internode.ParseForward(bad, internode.ForwardNodes)
		require.ErrorContains(t, err, bad)
	}
	require.Equal(t, "blocks", internode.ForwardBlocks.String())
	require.Equal(t, "auto", internode.ForwardAuto.String())
	require.Equal(t, "Forward(7)", internode.Forward(7).String())
}

// The grid a Notify launches when its caller names none: NotifyConfig's
// DefaultSMs (the Buffer's pick per transport) in place of DefaultSMs,
// capped alike by the device's SMs and the spin budget; a named grid or a
// split's total wins over both. Checked in the CPU emulation against the
// caps read from the rank's own device and placement (its 2 SMs cap both
// defaults: TestDefaultGrid tells them apart).
func TestEmulatedDefaultGrid(t *testing.T) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 1}
	s := internode.Shape{Topology: topo, Hidden: 64, TopK: 2, Experts: 4}
	for _, tc := range []struct {
		name            string
		sms, defaultSMs int
		split           internode.Split
		want            func(capped func(int) int) int
	}{
		{"default", 0, 0, internode.Split{}, func(c func(int) int) int { return c(internode.DefaultSMs) }},
		{"port default", 0, internode.PortSMs, internode.Split{}, func(c func(int) int) int { return c(internode.PortSMs) }},
		{"small default", 0, 3, internode.Split{}, func(c func(int) int) int { return c(3) }},
		{"named grid", 5, internode.PortSMs, internode.Split{}, func(func(int) int) int { return 5 }},
		{"split total", 0, internode.PortSMs, internode.Split{Senders: 1, Forwarders: 2, Receivers: 1}, func(func(int) int) int { return 4 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := make([]int, topo.World()), make([]int, topo.World())
			errs := runNotifyRanksOn(t, emuBackend, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
				nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 91, MaxTokens: 8, SMs: tc.sms,
					DefaultSMs: tc.defaultSMs, Split: tc.split})
				if err != nil {
					return nil, err
				}
				pl, err := c.Placement(ctx)
				if err != nil {
					return nt, err
				}
				capped := func(b int) int {
					if n := c.Device().Info().SMs; n > 0 {
						b = min(b, n)
					}
					if pl.SpinBlocks > 0 {
						b = min(b, pl.SpinBlocks)
					}
					return b
				}
				got[c.Rank()], _ = nt.Launch()
				want[c.Rank()] = tc.want(capped)
				return nt, nil
			})
			ranktest.NoErrors(t, errs)
			require.Equal(t, want, got)
			require.NotZero(t, got[0])
		})
	}
	t.Run("negative default refused", func(t *testing.T) {
		errs := runNotifyRanksOn(t, emuBackend, topo, 30*time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, error) {
			nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 92, MaxTokens: 8, DefaultSMs: -1})
			if err == nil || !containsAll(err.Error(), "default grid of -1 SMs") {
				return nt, fmt.Errorf("want the negative default grid refused, got %v", err)
			}
			return nt, nil
		})
		ranktest.NoErrors(t, errs)
	})
}
