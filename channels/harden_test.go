package channels_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/apicheck"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
)

// apiTable is one value of every exported type of package channels with
// exported methods (nil pointers for pointer methods, zero values for value
// types); TestNilReceivers fails when a new one is not added here.
var apiTable = []any{(*channels.Communicator)(nil), (*channels.Proxy)(nil), (*channels.PacketBuffer)(nil),
	(*channels.DeviceArray)(nil), (*channels.MemoryChannel)(nil), (*channels.PortChannel)(nil),
	(*channels.Mesh)(nil), (*channels.PortMesh)(nil), (*channels.MemorySemaphore)(nil), (*channels.HostSemaphore)(nil),
	(*channels.TimeoutError)(nil), (*channels.PeerGoneError)(nil), new(channels.PeerGoneError), channels.RegisteredMemory{}, channels.Topology{}, channels.NetworkConfig{}, channels.Transport(0),
	channels.Transport(255), channels.TransportSet(0), channels.TransportSet(255),
	(*channels.ProxyTrace)(nil), channels.TraceSummary{}, channels.TraceOp(0), channels.TraceOp(255),
	channels.TraceStage(0), channels.TraceStage(255)}

// Class 1: every exported method of the channel layer's types answers on a
// nil receiver with an error or a zero value (MemoryChannel.Semaphore
// included), and every type is in the table.
func TestNilReceivers(t *testing.T) {
	apicheck.Cover(t, ".", apiTable, apicheck.Options{})
	require.Nil(t, (*channels.MemoryChannel)(nil).Semaphore())
	_, err := channels.NewCommunicator(nil, nil, channels.Config{})
	require.Error(t, err)
}

// Class 1: after Close every method of the communicator and of what it
// built answers without a panic, and calls fail with ErrClosed.
func TestUseAfterClose(t *testing.T) {
	runRaw(t, world{device.Host, 2}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{})
		if err != nil {
			return err
		}
		buf, err := dev.Alloc(4096)
		if err != nil {
			return err
		}
		mem, err := c.RegisterMemory(buf)
		if err != nil {
			return err
		}
		pkts, err := c.NewPacketBuffer(8192)
		if err != nil {
			return err
		}
		mesh, err := c.NewMemoryChannelMesh(ctx, channels.MeshConfig{Local: mem})
		if err != nil {
			return err
		}
		proxy, err := c.NewProxy(channels.ProxyConfig{})
		if err != nil {
			return err
		}
		arr, err := c.UploadMemoryChannels(mesh.Channels)
		if err != nil {
			return err
		}
		if err := bs.Barrier(ctx); err != nil {
			return err
		}
		// Accessors polled from another goroutine while Close runs (under
		// -race: Close must not free or rewrite what they read unguarded).
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = c.Rank() + c.Size()
				_ = c.Check()
				_ = c.Device()
				_ = c.Timeouts()
				_ = c.Watchdog()
				_ = arr.Ptr() + uintptr(arr.Len())
				_ = pkts.Size()
				_ = mesh.ByRank(c.Size())
				_ = proxy.Err()
			}
		}()
		if err := c.Close(); err != nil {
			stop.Store(true)
			wg.Wait()
			return err
		}
		stop.Store(true)
		wg.Wait()
		closed := []any{c, pkts, mesh, proxy, arr, mem}
		for _, ch := range mesh.Channels {
			closed = append(closed, ch, ch.Semaphore())
		}
		for _, v := range closed {
			for _, f := range apicheck.Call(v, apicheck.Options{}) {
				t.Error(f)
			}
		}
		if _, err := c.RegisterMemory(buf); !errors.Is(err, channels.ErrClosed) {
			t.Errorf("RegisterMemory after Close: %v", err)
		}
		if err := c.Barrier(ctx); !errors.Is(err, channels.ErrClosed) {
			t.Errorf("Barrier after Close: %v", err)
		}
		return nil
	})
}

// Class 3: AgreeConfig names every differing field with the ranks holding
// each value, and a rank whose configuration is invalid, on every rank.
func TestAgreeConfig(t *testing.T) {
	ctx := context.Background()
	errs := bootstrap.RunInProcess(ctx, 4, bootstrap.Config{}, func(ctx context.Context, bs bootstrap.Bootstrap) error {
		fields := []string{"A=1", "B=2"}
		if bs.Rank() == 3 {
			fields[1] = "B=3"
		}
		return channels.AgreeConfig(ctx, bs, "Thing", fields, nil)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, channels.ErrConfigMismatch, "rank %d", r)
		require.ErrorContains(t, err, "Thing.B: 2 on ranks 0 1 2, 3 on rank 3", "rank %d", r)
		require.NotContains(t, err.Error(), "Thing.A", "rank %d", r)
	}
	errs = bootstrap.RunInProcess(ctx, 3, bootstrap.Config{}, func(ctx context.Context, bs bootstrap.Bootstrap) error {
		var bad error
		if bs.Rank() == 1 {
			bad = errors.New("Threads 33: want a multiple of 32")
		}
		return channels.AgreeConfig(ctx, bs, "Thing", []string{"A=1"}, bad)
	})
	for r, err := range errs {
		require.ErrorContains(t, err, "rank 1: Threads 33", "rank %d", r)
	}
	errs = bootstrap.RunInProcess(ctx, 3, bootstrap.Config{}, func(ctx context.Context, bs bootstrap.Bootstrap) error {
		return channels.AgreeConfig(ctx, bs, "Thing", []string{"A=1"}, nil)
	})
	ranktest.NoErrors(t, errs)
}
