package channeltest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// failRig is a throwaway communicator for the failure checks, which leave
// their communicator refusing further work.
type failRig struct {
	comm *channels.Communicator
	dev  device.Device
	me   int
	out  device.Buffer
}

func newFailRig(bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) (*failRig, error) {
	comm, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: timeout}})
	if err != nil {
		return nil, err
	}
	out, err := dev.Alloc(4096)
	if err == nil {
		err = dev.CopyIn(out.Ptr, make([]byte, 4096))
	}
	if err != nil {
		return nil, errors.Join(err, dev.Free(out), comm.Close())
	}
	return &failRig{comm: comm, dev: dev, me: bs.Rank(), out: out}, nil
}

func (f *failRig) close() error { return errors.Join(f.dev.Free(f.out), f.comm.Close()) }

func (f *failRig) errorf(format string, a ...any) error {
	return fmt.Errorf("rank %d: "+format, append([]any{f.me}, a...)...)
}

// launchAndWait runs a kernel and waits for it, returning how long it took.
func (f *failRig) launchAndWait(kernel string, grid int, args *device.Args) (time.Duration, error) {
	start := time.Now()
	if err := f.dev.Launch(kernel, device.D1(grid), device.D1(32), 0, nil, args); err != nil {
		return 0, err
	}
	err := f.dev.DefaultStream().Synchronize()
	return time.Since(start), err
}

// expectTimeout checks that the rig's communicator reports a timeout with
// these particulars and refuses further calls.
func (f *failRig) expectTimeout(what string, took, timeout time.Duration, op string, peer int, stage uint32, ids []uint32) error {
	err := f.comm.Check()
	var te *channels.TimeoutError
	switch {
	case err == nil:
		return f.errorf("%s: no timeout reported", what)
	case !errors.As(err, &te) || !errors.Is(err, channels.ErrTimeout):
		return f.errorf("%s: want a *TimeoutError, got %v", what, err)
	case te.Op != op || te.Peer != peer || te.Stage != stage || !slices.Contains(ids, te.ID) || te.Object == "":
		return f.errorf("%s: the error names the wrong wait: %v (want %s on rank %d at stage %d, one of ids %v)", what, err, op, peer, stage, ids)
	case te.Waited < timeout:
		return f.errorf("%s: gave up after %s, before the %s timeout", what, te.Waited, timeout)
	case took > timeout+10*time.Second:
		return f.errorf("%s: the kernel took %s to end after a %s timeout", what, took, timeout)
	}
	if _, err := f.comm.NewPacketBuffer(16); !errors.Is(err, channels.ErrTimeout) {
		return f.errorf("%s: the communicator accepted work after the timeout (err %v)", what, err)
	}
	return nil
}

// CheckTimeout checks bounded waits with a short timeout (e.g. 200 ms):
//   - rank 0 waits on three semaphores from rank 1, which never signals:
//     the kernel ends (the first wait to expire aborts the others), and
//     Check names one of the semaphores, rank 1 and the stage;
//   - rank 0 waits for LL packets rank 1 never sends: "LL packet read";
//   - every rank waits for a counter nobody raises: the error names the
//     wait id's description.
//
// After each, the communicator refuses new work with the same error. It
// builds (and closes) its own communicators on bs and dev.
func CheckTimeout(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) error {
	if err := timeoutSemaphores(ctx, bs, dev, timeout); err != nil {
		return err
	}
	if err := timeoutPackets(ctx, bs, dev, timeout); err != nil {
		return err
	}
	if err := timeoutCounter(bs, dev, timeout); err != nil {
		return err
	}
	return bs.Barrier(ctx)
}

func timeoutSemaphores(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) (err error) {
	if onlookers(bs) {
		return bs.Barrier(ctx)
	}
	f, err := newFailRig(bs, dev, timeout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	peer := 1 - f.me
	conns, err := f.comm.ConnectAll(ctx, []int{peer, peer, peer}, 0)
	if err != nil {
		return err
	}
	sems, err := f.comm.NewMemorySemaphores(ctx, conns)
	if err != nil {
		return err
	}
	arr, err := f.comm.UploadSemaphores([]channels.Semaphore{sems[0], sems[1], sems[2]})
	if err != nil {
		return err
	}
	if f.me == 0 {
		args := device.NewArgs(7).Ptr(arr.Ptr()).U32(devapi.SemaphoreSize).U32(0).U32(1).U32(0).U32(7).Ptr(f.out.Ptr)
		took, err := f.launchAndWait(devapi.KernelChanSemWait, 3, args)
		if err != nil {
			return err
		}
		ids := []uint32{sems[0].ID(), sems[1].ID(), sems[2].ID()}
		if err := f.expectTimeout("semaphore wait", took, timeout, "semaphore wait", 1, 7, ids); err != nil {
			return err
		}
		if err := conns[0].Flush(); !errors.Is(err, channels.ErrTimeout) {
			return f.errorf("the connection accepted work after the timeout (err %v)", err)
		}
	}
	return bs.Barrier(ctx) // rank 1 keeps its side alive until rank 0 is done
}

func timeoutPackets(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) (err error) {
	if onlookers(bs) {
		return bs.Barrier(ctx)
	}
	f, err := newFailRig(bs, dev, timeout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	buf, err := dev.Alloc(8192)
	if err != nil {
		return err
	}
	defer dev.Free(buf)
	mem, err := f.comm.RegisterMemory(buf)
	if err != nil {
		return err
	}
	pb, err := f.comm.NewPacketBuffer(16384)
	if err != nil {
		return err
	}
	mesh, err := f.comm.NewMemoryChannelMesh(ctx, channels.MeshConfig{Tag: 1, Peers: []int{1 - f.me}, Local: mem, Packets: pb})
	if err != nil {
		return err
	}
	arr, err := f.comm.UploadMemoryChannels(mesh.Channels)
	if err != nil {
		return err
	}
	if f.me == 0 {
		args := device.NewArgs(10).Ptr(arr.Ptr()).U32(0).U32(0).U32(16).U64(0).U64(4096).U64(4096).U64(8192).U32(9).Ptr(f.out.Ptr)
		took, err := f.launchAndWait(devapi.KernelChanLLExchange, 2, args)
		if err != nil {
			return err
		}
		if err := f.expectTimeout("LL packet read", took, timeout, "LL packet read", 1, 9, []uint32{mesh.Channels[0].ID()}); err != nil {
			return err
		}
	}
	return bs.Barrier(ctx)
}

func timeoutCounter(bs bootstrap.Bootstrap, dev device.Device, timeout time.Duration) (err error) {
	f, err := newFailRig(bs, dev, timeout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	id := f.comm.NewWaitID("never-raised test counter")
	ctr := f.out.Ptr + 1024 // zero, and nobody raises it
	args := device.NewArgs(7).Ptr(ctr).U64(1).Ptr(f.comm.Watchdog()).U32(id).U32(uint32(f.me)).U32(11).Ptr(f.out.Ptr)
	took, err := f.launchAndWait(devapi.KernelChanWaitValue, 1, args)
	if err != nil {
		return err
	}
	if err := f.expectTimeout("counter wait", took, timeout, "counter wait", f.me, 11, []uint32{id}); err != nil {
		return err
	}
	var te *channels.TimeoutError
	if errors.As(f.comm.Check(), &te) && te.Object != "never-raised test counter" {
		return f.errorf("counter wait: the error names %q, not the wait id's description", te.Object)
	}
	return nil
}

// onlookers reports whether this rank sits out a check between ranks 0 and
// 1 (it still joins the check's one barrier).
func onlookers(bs bootstrap.Bootstrap) bool { return bs.Size() < 2 || bs.Rank() >= 2 }

// CheckAbort checks Communicator.Abort: rank 0 waits on three semaphores
// from rank 1 (which never signals) under a long timeout, the host aborts
// after a moment, and every waiting block gives up at once.
func CheckAbort(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) (err error) {
	if onlookers(bs) {
		return bs.Barrier(ctx)
	}
	me := bs.Rank()
	const long = 30 * time.Second
	f, err := newFailRig(bs, dev, long)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.close()) }()
	peer := 1 - me
	conns, err := f.comm.ConnectAll(ctx, []int{peer, peer, peer}, 0)
	if err != nil {
		return err
	}
	sems, err := f.comm.NewMemorySemaphores(ctx, conns)
	if err != nil {
		return err
	}
	arr, err := f.comm.UploadSemaphores([]channels.Semaphore{sems[0], sems[1], sems[2]})
	if err != nil {
		return err
	}
	if me == 0 {
		var wg sync.WaitGroup
		var took time.Duration
		var launchErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := device.NewArgs(7).Ptr(arr.Ptr()).U32(devapi.SemaphoreSize).U32(0).U32(1).U32(0).U32(8).Ptr(f.out.Ptr)
			took, launchErr = f.launchAndWait(devapi.KernelChanSemWait, 3, args)
		}()
		time.Sleep(200 * time.Millisecond)
		abortErr := f.comm.Abort()
		wg.Wait()
		if err := errors.Join(abortErr, launchErr); err != nil {
			return f.errorf("abort: %w", err)
		}
		if took > 10*time.Second {
			return f.errorf("abort: the waiting kernel took %s to end", took)
		}
		if err := f.comm.Check(); !errors.Is(err, channels.ErrAborted) {
			return f.errorf("abort: Check returned %v, want ErrAborted", err)
		}
	}
	return bs.Barrier(ctx)
}
