package channeltest

import (
	"context"
	"errors"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// CheckPortTimeouts checks bounded waits of port channels with a short
// timeout (e.g. 200 ms), between ranks 0 and 1 whose proxies are never
// started (a stuck proxy):
//   - rank 0 pushes a signal and a flush: the flush wait gives up and the
//     error names "port channel flush", the channel and rank 1;
//   - with a 4-slot FIFO, rank 0 pushes 10 signals: the fifth push finds
//     the ring full and gives up ("FIFO push"), after exactly 4 pushes.
//
// It builds (and closes) its own communicators on bs and dev.
func CheckPortTimeouts(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) error {
	for _, c := range []struct {
		what         string
		fifo         int
		count, flush uint32
		op           uint32
		pushed       uint64
		stage        uint32
	}{
		{"flush with a stopped proxy", 0, 1, 1, devapi.OpFlush, 1, 15},
		{"push into a full FIFO", 4, 10, 0, devapi.OpFifoPush, 4, 16},
	} {
		if err := portTimeout(ctx, bs, dev, timeout, c.what, c.fifo, c.count, c.flush, c.op, c.pushed, c.stage); err != nil {
			return err
		}
	}
	return bs.Barrier(ctx)
}

func portTimeout(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration, what string,
	fifo int, count, flush, op uint32, pushed uint64, stage uint32) (err error) {
	if onlookers(bs) {
		return bs.Barrier(ctx)
	}
	f, err := newFailRig(bs, dev, timeout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	buf, err := dev.Alloc(4096)
	if err != nil {
		return err
	}
	defer dev.Free(buf)
	mem, err := f.comm.RegisterMemory(buf)
	if err != nil {
		return err
	}
	proxy, err := f.comm.NewProxy(channels.ProxyConfig{FIFOSize: fifo})
	if err != nil {
		return err
	}
	mesh, err := proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Tag: 2, Peers: []int{1 - f.me}, Local: mem})
	if err != nil {
		return err
	}
	arr, err := f.comm.UploadPortChannels(mesh.Channels)
	if err != nil {
		return err
	}
	if f.me == 0 {
		args := device.NewArgs(6).Ptr(arr.Ptr()).U32(0).U32(count).U32(flush).U32(stage).Ptr(f.out.Ptr)
		took, err := f.launchAndWait(devapi.KernelPortSignalBurst, 1, args)
		if err != nil {
			return err
		}
		if err := f.expectTimeout(what, took, timeout, devapi.OpName(op), 1, stage, []uint32{mesh.Channels[0].ID()}); err != nil {
			return err
		}
		b := make([]byte, 16)
		if err := dev.CopyOut(b, f.out.Ptr); err != nil {
			return err
		}
		if got := le64(b); got != pushed {
			return f.errorf("%s: %d signals were pushed before the wait gave up, want %d", what, got, pushed)
		}
		if err := proxy.Start(); !errors.Is(err, channels.ErrTimeout) {
			return f.errorf("%s: the proxy started after the timeout (err %v)", what, err)
		}
	}
	return bs.Barrier(ctx)
}

func le64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}
