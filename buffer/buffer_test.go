package buffer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
)

func TestSizeHints(t *testing.T) {
	c := Config{MaxTokens: 4096, Hidden: 7168, TopK: 8, Experts: 256, FP8: true}
	h, err := SizeHints(c, 8)
	require.NoError(t, err)
	l, err := intranode.NewLayout(intranode.Config{Ranks: 8, MaxTokens: 4096, Hidden: 7168, TopK: 8, LocalExperts: 32, FP8: true})
	require.NoError(t, err)
	require.Equal(t, l, h.Layout)
	require.Equal(t, l.Size, h.Workspace)
	require.Equal(t, DefaultHandles*h.HandleSlot, h.Handles, "DefaultHandles slots by default")
	require.Equal(t, 16, DefaultHandles)
	require.GreaterOrEqual(t, h.HandleSlot, 4*4096*8+8*4096*8, "send positions and a copy of the routing")
	require.Equal(t, 8*4096*8, h.IDScratch, "int64 [MaxTokens][TopK] for widened int32 ids")
	require.Equal(t, h.Workspace+h.PeerTable+h.Handles+h.LayoutOutputs+h.CombineOutputs+h.Barrier+h.IDScratch, h.Device)
	// The receive region alone is 8 ranks x 4096 rows x 14 KiB.
	require.Greater(t, h.Workspace, 8*4096*7168*2)

	c.WorkspaceBytes = l.Size + 4096
	h2, err := SizeHints(c, 8)
	require.NoError(t, err)
	require.Equal(t, l.Size+4096, h2.Workspace)
	c.WorkspaceBytes = l.Size - 1
	_, err = SizeHints(c, 8)
	require.ErrorContains(t, err, "need a workspace of")

	for _, bad := range []Config{
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 6},          // 6 experts over 4 ranks
		{MaxTokens: 8, Hidden: 12, TopK: 2, Experts: 8},           // hidden
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 8, Tag: -1}, // tag
		{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 8, Handles: -1},
	} {
		_, err := SizeHints(bad, 4)
		require.Error(t, err, "%+v", bad)
	}
	_, err = SizeHints(Config{MaxTokens: 8, Hidden: 128, TopK: 2, Experts: 18}, 9)
	require.ErrorContains(t, err, "9 ranks")
}

// New and Close on goroutine ranks: the workspace of every peer is in the
// peer table, the control block is zero, the Buffer's own accounting
// returns to zero, and Memory counts the communicator's allocations too.
func TestNewAndClose(t *testing.T) {
	const ranks = 3
	boots, err := bootstrap.NewInProcess(ranks, bootstrap.Config{})
	require.NoError(t, err)
	cfg := Config{MaxTokens: 16, Hidden: 256, TopK: 4, Experts: 12, Handles: 2}
	bufs := make([]*Buffer, ranks)
	devs := make([]device.Device, ranks)
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for i := range ranks {
		devs[i] = device.OpenHost(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs[i], errs[i] = New(context.Background(), boots[i], devs[i], cfg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	bases := make([]uint64, ranks)
	for i, b := range bufs {
		bases[i] = uint64(b.work.Base)
	}
	for i, b := range bufs {
		ws := b.work
		require.Equal(t, i, ws.Rank)
		require.Equal(t, bases, device.HostSlice[uint64](ws.Peers, ranks), "rank %d peer table", i)
		for _, v := range device.HostSlice[byte](ws.Base, intranode.CtrlBytes) {
			require.Zero(t, v)
		}
		require.Equal(t, b.comm.Watchdog(), ws.Watchdog)
		m := b.Memory()
		require.GreaterOrEqual(t, m.Device, int64(b.SizeHint().Device))
		require.Equal(t, 2, b.HandleSlots())
		s0, s1 := b.slot(0, 0), b.slot(1, 0)
		require.Equal(t, uintptr(b.SizeHint().HandleSlot), s1.handle.SendPos-s0.handle.SendPos)
		e, err := b.NewEvent()
		require.NoError(t, err)
		require.NoError(t, e.Record(b.Stream()))
		require.NoError(t, e.Wait(b.Stream()))
		require.NoError(t, e.Synchronize())
		require.Zero(t, e.Handle(), "host events have no CUevent")
	}
	for i := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = bufs[i].Close(context.Background())
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err)
		require.Zero(t, bufs[i].Memory().Allocations)
		require.Zero(t, bufs[i].Memory().HostAllocations)
		require.NoError(t, bufs[i].Close(context.Background()))
		require.ErrorContains(t, bufs[i].Check(), "closed")
		require.NoError(t, devs[i].Close())
		require.NoError(t, boots[i].Close())
	}
}

// The host wait for the received count is bounded (here by ctx) and a
// wait that gives up leaves the Buffer refusing calls until Close.
func TestWaitRecvCountGivesUp(t *testing.T) {
	boots, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	dev := device.OpenHost(0)
	b, err := New(context.Background(), boots[0], dev, Config{MaxTokens: 4, Hidden: 128, TopK: 1, Experts: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = b.waitRecvCount(ctx, "dispatch")
	require.ErrorContains(t, err, "rank 0: dispatch: waiting for the received count: context deadline exceeded")
	require.Equal(t, err, b.Check())
	require.Equal(t, err, b.Barrier(nil))
	require.NoError(t, b.Close(context.Background()))
	require.NoError(t, dev.Close())
	require.NoError(t, boots[0].Close())
}
