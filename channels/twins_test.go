package channels_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
)

// The channel twins on one host-backend rank talking to itself: a channel
// whose remote buffers are its own (a loopback), built by hand from
// devapi, so the twins are checked without package channels.

type loop struct {
	dev                  device.Device
	buf, pkts, ctl, hnds device.Buffer
	wd, rec              uintptr
	ch                   devapi.MemoryChannel
}

func newLoop(t *testing.T, timeout time.Duration) *loop {
	t.Helper()
	d := device.OpenHost(0)
	t.Cleanup(func() { d.Close() })
	alloc := func(n int) device.Buffer {
		b, err := d.Alloc(n)
		require.NoError(t, err)
		return b
	}
	l := &loop{dev: d, buf: alloc(8192), pkts: alloc(8192), ctl: alloc(4096), hnds: alloc(devapi.MemoryChannelSize)}
	// ctl: [0,32) watchdog, [64,112) record, [128] token, [256] expected, [384] LL flag.
	l.wd, l.rec = l.ctl.Ptr, l.ctl.Ptr+64
	w := make([]byte, devapi.WatchdogSize)
	devapi.Watchdog{TimeoutNS: uint64(timeout), Record: l.rec}.Encode(w)
	require.NoError(t, d.CopyIn(l.wd, w))
	token := l.ctl.Ptr + 128
	l.ch = devapi.MemoryChannel{
		Sem:    devapi.Semaphore{Inbound: token, Expected: l.ctl.Ptr + 256, Remote: token, Watchdog: l.wd, Peer: 0, ID: 9},
		Remote: l.buf.Ptr + 4096, Local: l.buf.Ptr, RemotePackets: l.pkts.Ptr, LocalPackets: l.pkts.Ptr,
		Flag: l.ctl.Ptr + 384, RemoteSize: 4096, LocalSize: 4096, RemotePacketsSize: 8192, LocalPacketsSize: 8192,
	}
	require.NoError(t, d.CopyIn(l.hnds.Ptr, l.ch.Bytes()))
	return l
}

func (l *loop) launch(t *testing.T, name string, grid int, a *device.Args) {
	t.Helper()
	require.NoError(t, l.dev.Launch(name, device.D1(grid), device.D1(64), 0, nil, a))
}

func TestChannelTwinsLoopback(t *testing.T) {
	l := newLoop(t, time.Minute)
	src := devapi.Bytes(l.buf.Ptr, 4096)
	kernels.FillPattern(device.HostSlice[uint32](l.buf.Ptr, 1024), 3)

	// put: 3 blocks copy then signal once each; 3 waits consume them.
	l.launch(t, devapi.KernelChanPut, 3, device.NewArgs(6).Ptr(l.hnds.Ptr).U32(0).U64(5).U64(1).U64(1000).U32(1))
	require.Equal(t, src[1:1001], devapi.Bytes(l.ch.Remote+5, 1000))
	out := l.ctl.Ptr + 2048
	l.launch(t, devapi.KernelChanSemWait, 1, device.NewArgs(7).Ptr(l.hnds.Ptr).U32(devapi.MemoryChannelSize).U32(0).U32(3).U32(2).U32(0).Ptr(out))
	o := device.HostSlice[uint64](out, 4)
	require.Equal(t, []uint64{3, 3, 3, 0}, o, "consumed, token, expected, empty polls")

	// get: the reverse direction.
	l.launch(t, devapi.KernelChanGet, 2, device.NewArgs(5).Ptr(l.hnds.Ptr).U32(0).U64(5).U64(2000).U64(1000))
	require.Equal(t, src[1:1001], src[2000:3000])

	// LL16 and LL8 exchange of an odd size, twice each: the flag advances.
	clear(o)
	for i, proto := range []uint32{16, 8, 16, 8} {
		clear(devapi.Bytes(l.ch.Remote, 4096))
		l.launch(t, devapi.KernelChanLLExchange, 1, device.NewArgs(10).Ptr(l.hnds.Ptr).U32(0).U32(0).U32(proto).
			U64(3).U64(4096+7).U64(1001).U64(4096).U32(1).Ptr(out))
		require.Zero(t, o[0])
		require.True(t, bytes.Equal(src[3:1004], devapi.Bytes(l.ch.Remote+7, 1001)), "LL%d", proto)
		require.Equal(t, uint32(i+1), devapi.U32(l.ch.Flag).Load())
	}

	// Pattern exchange, several rounds in one launch, verified in the twin.
	clear(o)
	l.launch(t, devapi.KernelChanLLPattern, 1, device.NewArgs(12).Ptr(l.hnds.Ptr).U32(0).U32(0).U32(16).U32(0).
		U64(100).U64(0).U64(1600).U32(77).U32(5).U32(1).Ptr(out))
	require.Equal(t, []uint64{0, 0, 5}, o[:3])
	require.Equal(t, uint32(9), devapi.U32(l.ch.Flag).Load())

	// compare counts differences and trampled guards.
	got, want := devapi.Bytes(l.buf.Ptr+100, 300), devapi.Bytes(l.buf.Ptr+600, 300)
	copy(got, want)
	got[7] ^= 1
	devapi.Bytes(l.buf.Ptr+96, 4)[0] = 0xA5
	clear(o)
	l.launch(t, devapi.KernelChanCompare, 1, device.NewArgs(7).Ptr(l.buf.Ptr+100).Ptr(l.buf.Ptr+600).U64(200).U32(0xA5).
		U64(4).U64(2).Ptr(out))
	require.Equal(t, uint64(1), o[0])
	require.Equal(t, uint64(3+2), o[1], "3 of the 4 bytes below and both above differ from the guard")
}

// A wait nobody satisfies gives up after the watchdog's timeout and fills
// the record; later waits give up at once.
func TestChannelTwinsTimeout(t *testing.T) {
	l := newLoop(t, 50*time.Millisecond)
	out := l.ctl.Ptr + 2048
	start := time.Now()
	l.launch(t, devapi.KernelChanSemWait, 1, device.NewArgs(7).Ptr(l.hnds.Ptr).U32(devapi.MemoryChannelSize).U32(0).U32(1).U32(0).U32(6).Ptr(out))
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	rec := devapi.DecodeTimeoutRecord(devapi.Bytes(l.rec, devapi.TimeoutRecordSize))
	require.Equal(t, devapi.TimeoutRecord{State: devapi.TimeoutExpired, Op: devapi.OpSemWait, ID: 9, Stage: 6,
		WaitedNS: rec.WaitedNS, Expected: 1}, rec)
	require.Equal(t, uint32(devapi.AbortTimeout), devapi.U32(l.wd+devapi.WatchdogAbort).Load())
	// An aborted watchdog ends waits at once: with the timeout raised to an
	// hour, the wait still gives up (a hang would be the test's timeout).
	devapi.U64(l.wd + devapi.WatchdogTimeoutNS).Store(uint64(time.Hour))
	l.launch(t, devapi.KernelChanWaitValue, 1, device.NewArgs(7).Ptr(out+512).U64(1).Ptr(l.wd).U32(1).U32(0).U32(0).Ptr(out))
	require.Zero(t, device.HostSlice[uint64](out, 1)[0])
}
