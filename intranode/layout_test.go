package intranode_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/kernels"
)

func TestLayoutRegions(t *testing.T) {
	for _, c := range []intranode.Config{
		{Ranks: 8, MaxTokens: 4096, Hidden: 7168, TopK: 8, LocalExperts: 32, FP8: true},
		{Ranks: 8, MaxTokens: 4096, Hidden: 7168, TopK: 8, LocalExperts: 32},
		{Ranks: 1, MaxTokens: 1, Hidden: 8, TopK: 1, LocalExperts: 1},
		{Ranks: 3, MaxTokens: 17, Hidden: 384, TopK: 9, LocalExperts: 5, FP8: true},
	} {
		l, err := intranode.NewLayout(c)
		require.NoError(t, err, "%+v", c)
		end := 0
		for _, r := range l.Regions() {
			assert.Zero(t, r.Offset%256, "%s at %v", r.Name, r.Region)
			assert.GreaterOrEqual(t, r.Offset, end, "%s overlaps the region before it", r.Name)
			end = r.End()
		}
		assert.LessOrEqual(t, end, l.Size)
		n := c.Ranks * c.MaxTokens
		assert.Equal(t, intranode.CtrlBytes, l.Ctrl.Size)
		assert.Equal(t, 2*c.Hidden*n, l.RecvX.Size, "BF16 rows of the worst case")
		assert.Equal(t, 8*c.TopK*n, l.RecvTopK.Size)
		assert.Equal(t, 2*c.Hidden*c.MaxTokens*c.Ranks, l.CombineX.Size)
		assert.Equal(t, 4*c.MaxTokens*c.Ranks, l.SendPos.Size)
		if c.FP8 {
			assert.Equal(t, 4*c.Hidden/128*n, l.RecvScales.Size)
		} else {
			assert.Zero(t, l.RecvScales.Size)
		}
	}
	l, _ := intranode.NewLayout(intranode.Config{Ranks: 8, MaxTokens: 4096, Hidden: 7168, TopK: 8, LocalExperts: 32})
	t.Logf("DeepEP shape: workspace of %.1f MiB per rank", float64(l.Size)/(1<<20))
}

func TestLayoutRefusesBadConfigs(t *testing.T) {
	good := intranode.Config{Ranks: 8, MaxTokens: 128, Hidden: 7168, TopK: 8, LocalExperts: 32}
	for _, tc := range []struct {
		mod  func(*intranode.Config)
		want string
	}{
		{func(c *intranode.Config) { c.Ranks = 9 }, "9 ranks"},
		{func(c *intranode.Config) { c.Ranks = 0 }, "0 ranks"},
		{func(c *intranode.Config) { c.MaxTokens = 0 }, "max tokens"},
		{func(c *intranode.Config) { c.Hidden = 100 }, "multiple of 8"},
		{func(c *intranode.Config) { c.Hidden = 136; c.FP8 = true }, "hidden % 128"},
		{func(c *intranode.Config) { c.TopK = 0 }, "top-k"},
		{func(c *intranode.Config) { c.TopK = 33 }, "top-k"},
		{func(c *intranode.Config) { c.LocalExperts = 0 }, "local experts"},
		{func(c *intranode.Config) { c.LocalExperts = 513 }, "at most 4096"},
		{func(c *intranode.Config) { c.MaxTokens = 1 << 29 }, "overflow"},
	} {
		c := good
		tc.mod(&c)
		_, err := intranode.NewLayout(c)
		assert.ErrorContains(t, err, tc.want, "%+v", c)
	}
}

// A workspace is checked once, when built (Validate); launches check only
// what depends on their geometry. Inputs are validated once, by package ep
// (its tests cover null, misaligned and mis-shaped tensors).
func TestWorkspaceValidateAndLaunchLimits(t *testing.T) {
	dev := device.OpenHost(0)
	defer dev.Close()
	l, err := intranode.NewLayout(intranode.Config{Ranks: 4, MaxTokens: 64, Hidden: 256, TopK: 4, LocalExperts: 2})
	require.NoError(t, err)
	ws := intranode.Workspace{Layout: l, Rank: 1, Base: 1 << 20, Size: l.Size, Peers: 1 << 30, Watchdog: 1 << 31}
	require.NoError(t, ws.Validate())
	h := ws.DefaultHandle(10)
	okD := intranode.DispatchArgs{X: 1 << 32, TopK: 1 << 33, Handle: h}
	okC := intranode.CombineArgs{Y: 1 << 32, Out: 1 << 33, Handle: h}
	okN := intranode.NotifyArgs{TopK: 1 << 33, Handle: h}
	validate := func(mod func(w *intranode.Workspace)) error { w := ws; mod(&w); return w.Validate() }
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"small workspace", validate(func(w *intranode.Workspace) { w.Size-- }), "smaller than its layout"},
		{"no layout", validate(func(w *intranode.Workspace) { w.Layout = intranode.Layout{} }), "no layout"},
		{"rank", validate(func(w *intranode.Workspace) { w.Rank = 4 }), "rank 4 of 4"},
		{"null peers", validate(func(w *intranode.Workspace) { w.Peers = 0 }), "peer table"},
		{"null watchdog", validate(func(w *intranode.Workspace) { w.Watchdog = 0 }), "watchdog"},
		{"misaligned base", validate(func(w *intranode.Workspace) { w.Base += 8 }), "workspace pointer"},
		{"fp8 without region", func() error {
			a := okD
			a.FP8, a.Scales = true, 1<<34
			return ws.Dispatch(dev, nil, a, intranode.LaunchConfig{})
		}(), "no FP8 scales region"},
		{"threads", func() error { return ws.Dispatch(dev, nil, okD, intranode.LaunchConfig{Threads: 48}) }(), "48 threads"},
		{"combine threads", func() error { return ws.Combine(dev, nil, okC, intranode.LaunchConfig{Threads: 1024}) }(), "1024 threads"},
		{"sms", func() error { return ws.Combine(dev, nil, okC, intranode.LaunchConfig{NumSMs: -1}) }(), "-1 SMs"},
		{"combine rows", func() error {
			a := okC
			a.Rows = l.MaxRecv() + 1
			return ws.Combine(dev, nil, a, intranode.LaunchConfig{})
		}(), "rows"},
		{"notify threads", func() error { return ws.Notify(dev, nil, okN, intranode.LaunchConfig{Threads: 2048}) }(), "2048 threads"},
		{"nil device", ws.Dispatch(nil, nil, okD, intranode.LaunchConfig{}), "nil device"},
	}
	for _, c := range cases {
		assert.ErrorContains(t, c.err, c.want, c.name)
	}
}

func TestKernelsAreRegistered(t *testing.T) {
	for _, k := range []string{intranode.KernelNotify, intranode.KernelDispatch, intranode.KernelCombine} {
		m, ok := kernels.ModuleForKernel(k)
		require.True(t, ok, k)
		assert.Equal(t, "intranode", m.Name)
	}
}
