package channels_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// The proxy and the FIFO driven from Go through devapi (the host version of
// the device API), on one host-backend rank talking to itself through a
// loopback connection.

type loopPort struct {
	c     *channels.Communicator
	dev   device.Device
	buf   device.Buffer
	mem   channels.RegisteredMemory
	proxy *channels.Proxy
	ch    *channels.PortChannel
	h     devapi.PortChannel
}

func newLoopPort(t *testing.T, cfg channels.ProxyConfig, timeout time.Duration) *loopPort {
	t.Helper()
	bss, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { bss[0].Close() })
	dev := device.OpenHost(0)
	t.Cleanup(func() { dev.Close() })
	c, err := channels.NewCommunicator(bss[0], dev, channels.Config{Timeouts: channels.Timeouts{Wait: timeout}})
	require.NoError(t, err)
	l := &loopPort{c: c, dev: dev}
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	l.buf, err = dev.Alloc(1 << 16)
	require.NoError(t, err)
	l.mem, err = c.RegisterMemory(l.buf)
	require.NoError(t, err)
	ctx := context.Background()
	conn, err := c.Connect(ctx, 0, 0)
	require.NoError(t, err)
	sem, err := c.NewHostSemaphore(ctx, conn)
	require.NoError(t, err)
	l.proxy, err = c.NewProxy(cfg)
	require.NoError(t, err)
	id, err := l.proxy.AddMemory(l.mem)
	require.NoError(t, err)
	l.ch, err = l.proxy.NewPortChannel(sem, id, id)
	require.NoError(t, err)
	l.h = l.ch.DeviceHandle()
	return l
}

// Many goroutines push atomic adds, puts and signals at once into a
// 4-slot FIFO: pushers wait for room, the ring wraps thousands of times,
// and the counter ends at exactly the sum of the values pushed.
func TestProxyFIFOUnderPressure(t *testing.T) {
	l := newLoopPort(t, channels.ProxyConfig{FIFOSize: 4, MaxPending: 3}, 30*time.Second)
	require.NoError(t, l.proxy.Start())
	const pushers = 8
	per := 500
	if testing.Short() {
		per = 100
	}
	var want [pushers]uint64
	var wg sync.WaitGroup
	failed := make(chan error, pushers)
	for g := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < per; i++ {
				v := rng.Uint64()
				var ok bool
				switch i % 5 {
				case 3: // a put between the adds (inside the buffer, away from the counter)
					ok = devapi.PortPut(l.h, 4096+uint64(g)*64, 8192, 64, 0, 1)
					v = 0
				case 4:
					ok = devapi.PortSignal(l.h, 1) && devapi.PortAtomicAdd(l.h, l.h.Dst, 0, v, 1)
				default:
					ok = devapi.PortAtomicAdd(l.h, l.h.Dst, 0, v, 1)
				}
				if !ok {
					failed <- errors.New("a push gave up")
					return
				}
				want[g] += v
			}
		}()
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		require.NoError(t, err)
	}
	require.True(t, devapi.PortFlush(l.h, 2), "flush")
	var sum uint64
	for _, w := range want {
		sum += w
	}
	require.Equal(t, sum, devapi.U64(l.buf.Ptr).Load(), "the counter holds the sum of every add")
	in, err := l.ch.Semaphore().Inbound()
	require.NoError(t, err)
	require.Equal(t, uint64(pushers*per/5), in, "one signal per fifth push went through the loopback")
	require.NoError(t, l.proxy.Err())
	require.NoError(t, l.proxy.Stop())
	require.NoError(t, l.proxy.Start(), "a stopped proxy starts again")
	require.True(t, devapi.PortFlush(l.h, 3), "flush after a restart")
}

// A trigger the proxy cannot carry out (an unknown memory id) stops the
// proxy with an error naming it, breaks the communicator with that error,
// and ends the pusher's flush wait at once instead of after the timeout.
func TestProxyBadTriggerBreaksCommunicator(t *testing.T) {
	l := newLoopPort(t, channels.ProxyConfig{}, time.Minute)
	require.NoError(t, l.proxy.Start())
	start := time.Now()
	ok := devapi.PortPutIDs(l.h, 9, 0, l.h.Src, 0, 16, devapi.TriggerFlush, 4)
	require.False(t, ok, "the flush of a failed trigger must not complete")
	require.Less(t, time.Since(start), 10*time.Second, "the abort must end the wait, not the timeout")
	require.ErrorContains(t, l.proxy.Err(), "no memory id 9")
	require.ErrorContains(t, l.c.Check(), "no memory id 9")
	_, err := l.c.NewProxy(channels.ProxyConfig{})
	require.ErrorContains(t, err, "no memory id 9", "the communicator refuses work after the failure")
	require.Error(t, l.proxy.Start())
	require.NoError(t, l.proxy.Close())
	require.NoError(t, l.proxy.Close(), "Close is idempotent")
}

// Out-of-range puts are refused by the proxy's checks, not carried out.
func TestProxyRejectsOutOfRangePut(t *testing.T) {
	l := newLoopPort(t, channels.ProxyConfig{}, time.Minute)
	require.NoError(t, l.proxy.Start())
	require.False(t, devapi.PortPut(l.h, 1<<16-8, 0, 64, devapi.TriggerFlush, 5))
	require.ErrorContains(t, l.proxy.Err(), "out of range")
}

func TestProxyValidation(t *testing.T) {
	_, err := channels.NewCommunicator(nil, nil, channels.Config{})
	require.Error(t, err)
	l := newLoopPort(t, channels.ProxyConfig{}, time.Minute)
	_, err = l.c.NewProxy(channels.ProxyConfig{FIFOSize: 6})
	require.ErrorContains(t, err, "power of two")
	_, err = l.proxy.AddMemory(channels.RegisteredMemory{})
	require.ErrorContains(t, err, "no memory")
	_, err = l.proxy.NewPortChannel(l.ch.Semaphore(), 7, 0)
	require.ErrorContains(t, err, "no memory id 7")
	_, err = l.proxy.NewPortChannel(nil, 0, 0)
	require.Error(t, err)
	for i := 1; i < devapi.TriggerMaxMemories; i++ {
		_, err = l.proxy.AddMemory(l.mem)
		require.NoError(t, err)
	}
	_, err = l.proxy.AddMemory(l.mem)
	require.ErrorContains(t, err, "already holds 256")
	h := l.ch.DeviceHandle()
	require.Equal(t, h, devapi.DecodePortChannel(h.Bytes()))
	require.Equal(t, l.ch.ID(), h.Sem.ID, "waits on the channel are reported under its id")
	require.NotZero(t, h.Fifo.Triggers)
	require.Equal(t, uint32(512), h.Fifo.Size)
	arr, err := l.c.UploadPortChannels([]*channels.PortChannel{nil, l.ch})
	require.NoError(t, err)
	got := devapi.DecodePortChannel(devapi.Bytes(arr.Ptr()+devapi.PortChannelSize, devapi.PortChannelSize))
	require.Equal(t, h, got)
	require.Equal(t, devapi.PortChannel{}, devapi.DecodePortChannel(devapi.Bytes(arr.Ptr(), devapi.PortChannelSize)))
	// Closing the communicator stops and frees a running proxy.
	require.NoError(t, l.proxy.Start())
	require.NoError(t, l.c.Close())
	require.ErrorIs(t, l.proxy.Start(), channels.ErrClosed)
}

// Close carries out every trigger already in the FIFO before it stops: the
// last completion flags a finished kernel pushed (atomic adds nobody on
// its rank waits for) must still land, or a peer waiting for them times
// out. Adds to distinct words (none merge), pushed while the proxy is
// stopped, then Start and at once Close: every word holds its add.
func TestProxyCloseCarriesOutTheFIFO(t *testing.T) {
	for round := 0; round < 20; round++ {
		l := newLoopPort(t, channels.ProxyConfig{FIFOSize: 1024}, 30*time.Second)
		const adds = 500
		for i := 0; i < adds; i++ {
			require.True(t, devapi.PortAtomicAdd(l.h, l.h.Dst, uint64(8*i), uint64(i+1), 1), "push %d", i)
		}
		require.NoError(t, l.proxy.Start())
		require.NoError(t, l.proxy.Close())
		for i := 0; i < adds; i++ {
			require.Equal(t, uint64(i+1), devapi.U64(l.buf.Ptr+uintptr(8*i)).Load(), "round %d: add %d of %d", round, i, adds)
		}
	}
}

// Store triggers: each lands its value whole, after the channel's earlier
// puts, and later stores to the word replace it (no sum); the proxy's
// merging of adjacent atomic adds never folds a store into them.
func TestProxyStore(t *testing.T) {
	l := newLoopPort(t, channels.ProxyConfig{FIFOSize: 8, MaxPending: 3}, 30*time.Second)
	require.NoError(t, l.proxy.Start())
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 200 {
		v := rng.Uint64() | 1<<63 // bit 63 travels in word 1
		require.True(t, devapi.PortAtomicAdd(l.h, l.h.Dst, 8, 5, 1), "add %d", i)
		require.True(t, devapi.PortStore(l.h, 8, v, 1), "store %d", i)
		require.True(t, devapi.PortAtomicAdd(l.h, l.h.Dst, 8, 3, 1), "add %d", i)
		require.True(t, devapi.PortFlush(l.h, 2), "flush %d", i)
		require.Equal(t, v+3, devapi.U64(l.buf.Ptr+8).Load(), "round %d: the store replaced the word, the later add added to it", i)
	}
	require.NoError(t, l.proxy.Err())
	require.NoError(t, l.proxy.Stop())
}
