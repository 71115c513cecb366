package intranode_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/intranode"
)

// Huge sizes are errors, never a wrapped byte count or a panic: the
// reference refuses them, the layout refuses them, and a value packed into
// a 32-bit kernel argument (the expert alignment) is range-checked.
func TestHugeSizesAreRefused(t *testing.T) {
	for _, hidden := range []int{1 << 62, math.MaxInt, intranode.MaxHidden + 8} {
		s := intranode.Shape{Hidden: hidden, TopK: 2, Experts: 4, Ranks: 2}
		in := []intranode.RankInput{{TopK: []int64{0, 1}, X: make([]uint16, 8)}, {}}
		require.NotPanics(t, func() {
			_, err := intranode.ReferenceDispatch(s, in, 0)
			require.Error(t, err, "hidden %d", hidden)
		})
		require.NotPanics(t, func() {
			_, err := intranode.ReferenceCombine(s, []int{1, 0}, make([]intranode.RankOutput, 2), make([]intranode.CombineInput, 2))
			require.Error(t, err, "hidden %d", hidden)
		})
		_, err := intranode.NewLayout(intranode.Config{Ranks: 2, MaxTokens: 16, Hidden: max(hidden&^127, intranode.MaxHidden+128), TopK: 2, LocalExperts: 2})
		require.Error(t, err, "layout with hidden %d", hidden)
	}
	// A token count whose product with hidden overflows.
	s := intranode.Shape{Hidden: 1 << 20, TopK: 1, Experts: 2, Ranks: 1}
	require.NotPanics(t, func() {
		_, err := intranode.ReferenceCombine(s, []int{math.MaxInt / 2}, make([]intranode.RankOutput, 1), make([]intranode.CombineInput, 1))
		require.Error(t, err)
	})
	require.NotPanics(t, func() {
		_, err := intranode.ReferenceCombine(s, []int{-1}, make([]intranode.RankOutput, 1), make([]intranode.CombineInput, 1))
		require.Error(t, err)
	})

	// The largest layout still sizes without wrapping.
	l, err := intranode.NewLayout(intranode.Config{Ranks: 8, MaxTokens: 1 << 20, Hidden: intranode.MaxHidden, TopK: 32, LocalExperts: 512, FP8: true})
	require.NoError(t, err)
	require.Greater(t, l.Size, 2*intranode.MaxHidden*(8<<20))
	for _, r := range l.Regions() {
		require.GreaterOrEqual(t, r.Offset, 0, r.Name)
		require.GreaterOrEqual(t, r.Size, 0, r.Name)
	}
}

// The expert alignment goes to the notify kernel as an int32: values that
// would be truncated, or that make the rounded counts overflow int32, are
// refused before the launch.
func TestExpertAlignmentRange(t *testing.T) {
	l, err := intranode.NewLayout(intranode.Config{Ranks: 2, MaxTokens: 8, Hidden: 128, TopK: 2, LocalExperts: 2})
	require.NoError(t, err)
	ws := intranode.Workspace{Layout: l, Rank: 0, Base: 1 << 20, Size: l.Size, Peers: 0x7000, Watchdog: 0x7100}
	h := intranode.Handle{Tokens: 4, SendPos: 0x8004, RankPrefix: 0x8104, RecvBase: 0x8204, NumRecv: 0x8304}
	for _, a := range []int{1 << 32, 1<<32 + 64, math.MaxInt32, intranode.MaxExpertAlignment + 1, -1} {
		rec := &recorder{}
		err := ws.Notify(rec, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h, ExpertAlignment: a}, intranode.LaunchConfig{})
		require.Error(t, err, "alignment %d", a)
		require.Empty(t, rec.kernel, "nothing launched for alignment %d", a)
	}
	rec := &recorder{}
	require.NoError(t, ws.Notify(rec, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h, ExpertAlignment: intranode.MaxExpertAlignment}, intranode.LaunchConfig{}))
	require.Equal(t, uint32(intranode.MaxExpertAlignment), rec.args.GetU32(10))
	// Token counts above the layout's are refused by every launcher.
	h.Tokens = 9
	require.Error(t, ws.Notify(&recorder{}, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h}, intranode.LaunchConfig{}))
	require.Error(t, ws.Dispatch(&recorder{}, nil, intranode.DispatchArgs{X: 0x9000, TopK: 0x9008, Handle: h}, intranode.LaunchConfig{}))
	require.Error(t, ws.Combine(&recorder{}, nil, intranode.CombineArgs{Y: 0x9000, Out: 0x9100, Handle: h}, intranode.LaunchConfig{}))
}
