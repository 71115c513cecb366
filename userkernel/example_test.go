package userkernel_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/userkernel"
)

// The user's kernel: thread p puts this rank's slice into slice `rank` of
// peer p's buffer with one port-channel trigger (put, signal, flush), then
// waits for peer p's signal. Every wait is bounded: false means the
// communicator's watchdog gave up, and Synchronize will say which wait.
const allGather = `#include "channel_device.cuh"
extern "C" __global__ void example_all_gather(const goep_port_channel* chans, u32 rank, u32 nranks, u64 slice) {
  const u32 p = threadIdx.x;
  if (p >= nranks || p == rank) return;
  if (!goep_pc_put_with_signal_and_flush(chans[p], rank * slice, rank * slice, slice)) return;
  (void)goep_pc_wait(chans[p]);
}
`

// openDevice opens rank r's device: its GPU when there is one (ranks share
// GPUs when there are fewer GPUs than ranks), else goep's CPU emulation of
// CUDA sources, which goep's own tests use on machines without a GPU.
func openDevice(r int) (device.Device, error) {
	if n, err := device.CUDADeviceCount(); err == nil && n > 0 {
		return device.OpenRank(device.CUDA, r)
	}
	return cpuemu.Open(r, cpuemu.Options{})
}

// One rank of the tutorial: a buffer of nranks slices, port channels to
// every peer over it, the proxy, and the user's kernel; then the check that
// every peer's slice arrived.
func rank(ctx context.Context, comm *channels.Communicator, slice int) (err error) {
	n, me := comm.Size(), comm.Rank()
	mod, err := userkernel.Load(ctx, comm, userkernel.Source{Name: "example", Code: allGather})
	if err != nil {
		return err
	}
	dev := comm.Device()
	buf, err := dev.Alloc(n * slice)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Free(buf)) }()
	data := make([]byte, n*slice)
	for i := range data[me*slice : (me+1)*slice] {
		data[me*slice+i] = byte(me + 1)
	}
	if err := dev.CopyIn(buf.Ptr, data); err != nil {
		return err
	}
	mem, err := comm.RegisterMemory(buf)
	if err != nil {
		return err
	}
	proxy, err := comm.NewProxy(channels.ProxyConfig{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, proxy.Close()) }()
	mesh, err := proxy.NewPortChannelMesh(ctx, channels.PortMeshConfig{Local: mem})
	if err != nil {
		return err
	}
	handles, err := comm.UploadPortChannels(mesh.ByRank(n))
	if err != nil {
		return err
	}
	if err := proxy.Start(); err != nil {
		return err
	}
	if err := comm.Barrier(ctx); err != nil { // every buffer is filled
		return err
	}
	args := userkernel.NewArgs(4).Ptr(handles.Ptr()).U32(uint32(me)).U32(uint32(n)).U64(uint64(slice))
	if err := mod.Launch("example_all_gather", userkernel.Launch{Grid: userkernel.D1(1), Block: userkernel.D1(32)}, args); err != nil {
		return err
	}
	if err := mod.Synchronize(nil); err != nil {
		return err
	}
	if err := dev.CopyOut(data, buf.Ptr); err != nil {
		return err
	}
	for p := 0; p < n; p++ {
		if !bytes.Equal(data[p*slice:(p+1)*slice], bytes.Repeat([]byte{byte(p + 1)}, slice)) {
			return fmt.Errorf("rank %d: slice %d did not arrive", me, p)
		}
	}
	return comm.Barrier(ctx) // no rank frees what a peer may reach
}

// MSCCL++'s channel tutorial with a user kernel: four goroutine ranks, one
// buffer each, port channels to every peer, and a kernel compiled at run
// time in which rank r puts its slice to every peer with signal and flush
// and waits for theirs.
func Example() {
	const ranks, slice = 4, 1000
	ctx := context.Background()
	var mu sync.Mutex
	lines := make([]string, ranks)
	var done sync.WaitGroup
	done.Add(ranks)
	errs := bootstrap.RunInProcess(ctx, ranks, bootstrap.Config{Timeout: time.Minute},
		func(ctx context.Context, bs bootstrap.Bootstrap) (err error) {
			dev, err := openDevice(bs.Rank())
			if err != nil {
				done.Done()
				return err
			}
			comm, err := channels.NewCommunicator(bs, dev, channels.Config{})
			if err == nil {
				err = rank(ctx, comm, slice)
			}
			if err == nil {
				mu.Lock()
				lines[bs.Rank()] = fmt.Sprintf("rank %d: every peer's slice arrived", bs.Rank())
				mu.Unlock()
			}
			done.Done()
			done.Wait()
			if comm != nil {
				err = errors.Join(err, comm.Close())
			}
			return errors.Join(err, dev.Close())
		})
	for r, err := range errs {
		if err != nil {
			fmt.Printf("rank %d: %v\n", r, err)
		}
	}
	for _, l := range lines {
		if l != "" {
			fmt.Println(l)
		}
	}
	// Output:
	// rank 0: every peer's slice arrived
	// rank 1: every peer's slice arrived
	// rank 2: every peer's slice arrived
	// rank 3: every peer's slice arrived
}
