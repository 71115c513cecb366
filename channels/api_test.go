package channels_test

import (
	"context"
	"errors"
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

// Host-side behaviour of the API (validation, exchanges, errors) on two
// goroutine ranks of the host backend.

// errAssert ends a rank's function after a failed assertion: rank
// goroutines must not call t.FailNow.
var errAssert = errors.New("assertion failed")

func hostPair(t *testing.T, fn func(ctx context.Context, c *channels.Communicator) error) {
	t.Helper()
	runRaw(t, world{device.Host, 2}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) (err error) {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.Close()) }()
		if err := fn(ctx, c); err != nil {
			return err
		}
		return bs.Barrier(ctx)
	})
}

func TestTimeoutsFromEnv(t *testing.T) {
	t.Setenv(channels.TimeoutEnv, "")
	got, err := channels.TimeoutsFromEnv()
	require.NoError(t, err)
	require.Equal(t, channels.DefaultWaitTimeout, got.Wait)
	for in, want := range map[string]time.Duration{"200ms": 200 * time.Millisecond, "1.5": 1500 * time.Millisecond, " 90 ": 90 * time.Second} {
		t.Setenv(channels.TimeoutEnv, in)
		got, err := channels.TimeoutsFromEnv()
		require.NoError(t, err, in)
		require.Equal(t, want, got.Wait, in)
	}
	for _, bad := range []string{"soon", "-1", "0"} {
		t.Setenv(channels.TimeoutEnv, bad)
		_, err := channels.TimeoutsFromEnv()
		require.ErrorContains(t, err, channels.TimeoutEnv, bad)
	}
	// Config wins over the environment; the environment is not even parsed.
	bss, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	defer bss[0].Close()
	dev := device.OpenHost(0)
	defer dev.Close()
	c, err := channels.NewCommunicator(bss[0], dev, channels.Config{Timeouts: channels.Timeouts{Wait: time.Second}})
	require.NoError(t, err)
	require.Equal(t, time.Second, c.Timeouts().Wait)
	require.NoError(t, c.SetWaitTimeout(3*time.Second))
	require.Equal(t, 3*time.Second, c.Timeouts().Wait)
	require.Error(t, c.SetWaitTimeout(0))
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close is idempotent")
	_, err = c.RegisterMemory(device.Buffer{Ptr: 1, Size: 1})
	require.ErrorIs(t, err, channels.ErrClosed)
	require.ErrorIs(t, c.Check(), channels.ErrClosed)
}

func TestRegisteredMemoryExchange(t *testing.T) {
	hostPair(t, func(ctx context.Context, c *channels.Communicator) error {
		dev := c.Device()
		buf, err := dev.Alloc(4096)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		copy(devapi.Bytes(buf.Ptr, 4096), []byte{byte(c.Rank() + 1)})
		mem, err := c.RegisterMemory(buf)
		if err != nil {
			return err
		}
		peer := 1 - c.Rank()
		assert.True(t, mem.IsLocal())
		assert.Equal(t, c.Rank(), mem.Rank())
		// Host memory within the process; the network transport (TCP) from other nodes.
		assert.Equal(t, channels.TransportSet(0).With(channels.TransportHostMemory).With(channels.TransportEthernet), mem.Transports())
		part, err := mem.Slice(1024, 512)
		if !assert.NoError(t, err) {
			return errAssert
		}
		_, err = mem.Slice(4000, 100)
		assert.Error(t, err, "slice past the end")

		// Two sends on one tag arrive in order; a slice opens at its offset.
		if !assert.NoError(t, c.SendMemory(ctx, mem, peer, 5)) {
			return errAssert
		}
		if !assert.NoError(t, c.SendMemory(ctx, part, peer, 5)) {
			return errAssert
		}
		whole, err := c.RecvMemory(ctx, peer, 5)
		if !assert.NoError(t, err) {
			return errAssert
		}
		slice, err := c.RecvMemory(ctx, peer, 5)
		if !assert.NoError(t, err) {
			return errAssert
		}
		assert.False(t, whole.IsLocal())
		assert.Equal(t, peer, whole.Rank())
		assert.Equal(t, 4096, whole.Size())
		assert.Equal(t, whole.Ptr()+1024, slice.Ptr(), "both views share one mapping")
		assert.Equal(t, byte(peer+1), devapi.Bytes(whole.Ptr(), 1)[0])

		// ExchangeMemory is the all-peers form.
		all, err := c.ExchangeMemory(ctx, part, []int{peer}, 6)
		if !assert.NoError(t, err) {
			return errAssert
		}
		assert.Equal(t, slice.Ptr(), all[0].Ptr())

		// Bad input is an error, not a panic.
		_, err = c.OpenMemory([]byte("not a handle"))
		assert.ErrorContains(t, err, "not serialised registered memory")
		data, err := mem.MarshalBinary()
		if !assert.NoError(t, err) {
			return errAssert
		}
		data[8] = 1 // claim it is CUDA memory
		_, err = c.OpenMemory(data)
		assert.ErrorContains(t, err, "host backend")
		assert.Error(t, c.SendMemory(ctx, mem, 7, 0), "no rank 7")
		assert.Error(t, c.SendMemory(ctx, mem, peer, -1), "negative tag")
		_, err = channels.RegisteredMemory{}.MarshalBinary()
		assert.Error(t, err)
		return c.Barrier(ctx) // keep buffers until the peer is done reading
	})
}

func TestConnectionWriteAndUpdate(t *testing.T) {
	hostPair(t, func(ctx context.Context, c *channels.Communicator) error {
		dev := c.Device()
		buf, err := dev.Alloc(4096)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		src := devapi.Bytes(buf.Ptr, 64)
		for i := range src {
			src[i] = byte(i + 10*c.Rank())
		}
		mem, err := c.RegisterMemory(buf)
		if !assert.NoError(t, err) {
			return errAssert
		}
		peer := 1 - c.Rank()
		conn, err := c.Connect(ctx, peer, 0)
		if !assert.NoError(t, err) {
			return errAssert
		}
		assert.Equal(t, channels.TransportHostMemory, conn.Transport())
		assert.Equal(t, peer, conn.RemoteRank())
		remote, err := c.ExchangeMemory(ctx, mem, []int{peer}, 0)
		if !assert.NoError(t, err) {
			return errAssert
		}
		require.NoError(t, c.Barrier(ctx)) // both sources are filled

		// Write lands in the peer's buffer at the offset; UpdateAndSync
		// stores one aligned word after it.
		if !assert.NoError(t, conn.Write(remote[0], 1000, mem, 3, 40)) {
			return errAssert
		}
		if !assert.NoError(t, conn.UpdateAndSync(remote[0], 2048, 77)) {
			return errAssert
		}
		if !assert.NoError(t, conn.Flush()) {
			return errAssert
		}
		if !assert.NoError(t, c.Barrier(ctx)) {
			return errAssert
		}
		got := devapi.Bytes(buf.Ptr+1000, 40)
		for i, b := range got {
			if !assert.Equal(t, byte(3+i+10*peer), b, "byte %d", i) {
				return errAssert
			}
		}
		if !assert.Equal(t, uint64(77), devapi.U64(buf.Ptr+2048).Load()) {
			return errAssert
		}

		assert.ErrorContains(t, conn.Write(remote[0], 4090, mem, 0, 40), "out of range")
		assert.ErrorContains(t, conn.Write(mem, 0, remote[0], 0, 8), "source must be local")
		assert.ErrorContains(t, conn.UpdateAndSync(remote[0], 2044, 1), "aligned 8-byte word")
		if !assert.NoError(t, conn.Close()) {
			return errAssert
		}
		assert.ErrorIs(t, conn.Flush(), channels.ErrClosed)
		return c.Barrier(ctx)
	})
}

func TestSemaphoreKindsMustPair(t *testing.T) {
	hostPair(t, func(ctx context.Context, c *channels.Communicator) error {
		conn, err := c.Connect(ctx, 1-c.Rank(), 0)
		if !assert.NoError(t, err) {
			return errAssert
		}
		if c.Rank() == 0 {
			_, err = c.NewMemorySemaphore(ctx, conn)
		} else {
			_, err = c.NewHostSemaphore(ctx, conn)
		}
		if !assert.Error(t, err) {
			return errAssert
		}
		assert.Contains(t, err.Error(), "built a")
		return nil
	})
}

func TestMemoryChannelValidation(t *testing.T) {
	hostPair(t, func(ctx context.Context, c *channels.Communicator) error {
		dev := c.Device()
		buf, err := dev.Alloc(4096)
		if !assert.NoError(t, err) {
			return errAssert
		}
		defer dev.Free(buf)
		mem, err := c.RegisterMemory(buf)
		if !assert.NoError(t, err) {
			return errAssert
		}
		pb, err := c.NewPacketBuffer(1024)
		if !assert.NoError(t, err) {
			return errAssert
		}
		_, err = c.NewPacketBuffer(1000)
		assert.Error(t, err, "not a multiple of 16")
		mesh, err := c.NewMemoryChannelMesh(ctx, channels.MeshConfig{Tag: 2, Local: mem, Packets: pb})
		if !assert.NoError(t, err) {
			return errAssert
		}
		peer := 1 - c.Rank()
		if !assert.Equal(t, []int{peer}, mesh.Peers) {
			return errAssert
		}
		byRank := mesh.ByRank(2)
		if !assert.Nil(t, byRank[c.Rank()]) {
			return errAssert
		}
		ch := byRank[peer]
		if !assert.NotNil(t, ch) {
			return errAssert
		}
		h := ch.DeviceHandle()
		assert.Equal(t, mesh.Remote[0].Ptr(), h.Remote)
		assert.Equal(t, mem.Ptr(), h.Local)
		assert.Equal(t, mesh.RemotePackets[0].Ptr(), h.RemotePackets)
		assert.Equal(t, pb.Memory().Ptr(), h.LocalPackets)
		assert.Equal(t, pb.FlagPtr(), h.Flag)
		assert.Equal(t, ch.ID(), h.Sem.ID, "waits on the channel name the channel")
		assert.Equal(t, uint32(peer), h.Sem.Peer)
		assert.Equal(t, c.Watchdog(), h.Sem.Watchdog)

		sem := ch.Semaphore()
		_, err = channels.NewMemoryChannel(sem, channels.MemoryChannelConfig{Remote: mem})
		assert.ErrorContains(t, err, "not the peer's memory")
		_, err = channels.NewMemoryChannel(sem, channels.MemoryChannelConfig{Local: mesh.Remote[0]})
		assert.ErrorContains(t, err, "not this rank's memory")
		_, err = channels.NewMemoryChannel(nil, channels.MemoryChannelConfig{})
		assert.Error(t, err)

		arr, err := c.UploadMemoryChannels(byRank)
		if !assert.NoError(t, err) {
			return errAssert
		}
		assert.Equal(t, 2, arr.Len())
		assert.Equal(t, devapi.MemoryChannelSize, arr.Stride())
		raw := devapi.Bytes(arr.Ptr(), 2*devapi.MemoryChannelSize)
		self := raw[c.Rank()*devapi.MemoryChannelSize:][:devapi.MemoryChannelSize]
		assert.Equal(t, make([]byte, devapi.MemoryChannelSize), self, "the missing channel is a zero handle")
		assert.Equal(t, h, devapi.DecodeMemoryChannel(raw[peer*devapi.MemoryChannelSize:]))
		if !assert.NoError(t, arr.Close()) {
			return errAssert
		}
		_, err = c.UploadSemaphores(nil)
		assert.Error(t, err)
		return c.Barrier(ctx)
	})
}

// Device-side timeouts are sticky: every object of the communicator
// refuses work with the same error, until Close.
func TestTimeoutIsSticky(t *testing.T) {
	runRaw(t, world{device.Host, 2}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) (err error) {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: 50 * time.Millisecond}})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.Close()) }()
		conn, err := c.Connect(ctx, 1-c.Rank(), 0)
		if !assert.NoError(t, err) {
			return errAssert
		}
		sems, err := c.NewHostSemaphores(ctx, []channels.Connection{conn})
		if !assert.NoError(t, err) {
			return errAssert
		}
		if !assert.NoError(t, c.Check()) {
			return errAssert
		}
		if c.Rank() == 0 {
			arr, err := c.UploadSemaphores([]channels.Semaphore{sems[0]})
			if !assert.NoError(t, err) {
				return errAssert
			}
			out, err := dev.Alloc(64)
			if !assert.NoError(t, err) {
				return errAssert
			}
			require.NoError(t, dev.Launch(devapi.KernelChanSemWait, device.D1(1), device.D1(1), 0, nil,
				device.NewArgs(7).Ptr(arr.Ptr()).U32(devapi.SemaphoreSize).U32(0).U32(1).U32(0).U32(42).Ptr(out.Ptr)))
			err = c.Check()
			var te *channels.TimeoutError
			if !assert.ErrorAs(t, err, &te) {
				return errAssert
			}
			assert.Equal(t, 1, te.Peer)
			assert.Equal(t, uint32(42), te.Stage)
			assert.Equal(t, sems[0].ID(), te.ID)
			assert.Contains(t, err.Error(), "host-to-device semaphore")
			assert.Contains(t, err.Error(), "stage 42")
			for _, err := range []error{sems[0].Signal(), conn.Flush(), c.Barrier(ctx), c.Check(), c.Abort()} {
				if err != nil { // Abort after a timeout is allowed
					assert.ErrorIs(t, err, channels.ErrTimeout)
				}
			}
			_, err = sems[0].Inbound()
			assert.ErrorIs(t, err, channels.ErrTimeout)
		}
		return bs.Barrier(ctx)
	})
}

// Goroutine-rank setups in either order of peers cannot deadlock.
func TestConnectAllAnyOrder(t *testing.T) {
	var mu sync.Mutex
	seen := map[int][]int{}
	runRaw(t, world{device.Host, 4}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) (err error) {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, c.Close()) }()
		var peers []int
		for i := 1; i < 4; i++ { // each rank lists its peers starting at a different one
			peers = append(peers, (c.Rank()+i)%4)
		}
		conns, err := c.ConnectAll(ctx, peers, 9)
		if err != nil {
			return err
		}
		if _, err := c.NewMemorySemaphores(ctx, conns); err != nil {
			return err
		}
		mu.Lock()
		for _, k := range conns {
			seen[c.Rank()] = append(seen[c.Rank()], k.RemoteRank())
		}
		mu.Unlock()
		return bs.Barrier(ctx)
	})
	for r := 0; r < 4; r++ {
		assert.Len(t, seen[r], 3)
	}
}
