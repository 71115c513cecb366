package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internode"
)

// The transport's own put bandwidth beside internode's network leg: rank 0
// puts the same byte count as its dispatch (or combine) sends across
// nodes to its forwarder on node 1 (rank RanksPerNode, the peer its network
// leg talks to), through a port channel of a communicator of its own with
// the Buffer's node split, hence the same transport between the same
// ranks. One thread pushes iters puts of the whole count and a flush
// (channels' port put benchmark kernel, timed inside the kernel from the
// first push to the flush's completion). The puts come from the kind of
// memory the network leg sends from (device memory, or pinned host memory
// with $GOEP_INTERNODE_SEND_MEMORY=host). Collective: every rank builds
// the communicator and port channels; only rank 0 times.

// interPut is rank 0's put timing of one byte count: alone (every other
// rank idle, the transport's best case) and with every rank putting the
// same count to its forwarder on the next node at once (All*: the load
// internode's network leg runs under, where every rank sends and receives
// at the same time; on virtual nodes of one host all these connections
// share its CPUs and memory).
type interPut struct {
	Bytes   int64   `json:"bytes"`
	Iters   int     `json:"iters"`
	US      float64 `json:"us_per_put"`
	GBps    float64 `json:"gbps"`
	AllUS   float64 `json:"all_us_per_put,omitempty"`
	AllGBps float64 `json:"all_gbps,omitempty"`
	// Once*: every rank at once again, but each put of the count alone
	// with its flush (one launch each, timed in the kernel from the push
	// to the flush's completion, the mean of iters): one transfer paying
	// its own pipeline fill and drain, the shape of a dispatch or combine,
	// where All* streams iters puts back to back before one flush.
	OnceUS   float64 `json:"once_us,omitempty"`
	OnceGBps float64 `json:"once_gbps,omitempty"`
}

// measureInterPuts times puts of each byte count (0: skipped) from rank 0
// to its forwarder on node 1, then from every rank to its forwarder on the
// next node at once; other ranks return zeros.
func measureInterPuts(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device, topo internode.Topology, timeout time.Duration,
	sizes []int64, iters int, from internode.SendMemory, trace bool) (_ []interPut, traces []interTrace, err error) {
	maxBytes := int64(1)
	for _, s := range sizes {
		maxBytes = max(maxBytes, s)
	}
	if maxBytes > 1<<34 {
		return nil, nil, fmt.Errorf("port put of %d bytes: too large", maxBytes)
	}
	comm, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: timeout},
		Network: channels.NetworkConfig{VirtualNodes: topo.Nodes}})
	if err != nil {
		return nil, nil, fmt.Errorf("port put: communicator: %w", err)
	}
	defer func() { err = errors.Join(err, comm.Close()) }()
	l := channeltest.LayoutFor(int(maxBytes))
	r, err := channeltest.NewRank(ctx, comm, l)
	if err != nil {
		return nil, nil, fmt.Errorf("port put: %w", err)
	}
	defer func() { err = errors.Join(err, r.Close()) }()
	if err := r.EnsurePort(ctx); err != nil {
		return nil, nil, fmt.Errorf("port put: port channels: %w", err)
	}
	handles := r.PortHandles
	if from == internode.SendHost {
		hs, free, err := hostSourcePorts(r, int(maxBytes))
		if err != nil {
			return nil, nil, fmt.Errorf("port put: %w", err)
		}
		defer func() { err = errors.Join(err, free()) }()
		handles = hs
	}
	buf, err := dev.Alloc(16)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, dev.Free(buf)) }()
	st, err := dev.NewStream()
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	// The destination region's offset (channeltest's: after the source
	// region and its guard).
	dst := uint64(l.Region + l.Guard)
	// put times n puts of size bytes to peer and a flush (ns, in the
	// kernel).
	put := func(peer int, size int64, n int) (uint64, error) {
		if err := dev.CopyIn(buf.Ptr, make([]byte, 16)); err != nil {
			return 0, err
		}
		args := device.NewArgs(8).Ptr(handles.Ptr()).U32(uint32(peer)).U64(dst).U64(0).U64(uint64(size)).
			U32(uint32(n)).U32(23).Ptr(buf.Ptr)
		if err := dev.Launch(devapi.KernelPortPutBench, device.Dim3{X: 1}, device.Dim3{X: 32}, 0, st, args); err != nil {
			return 0, err
		}
		if err := st.Synchronize(); err != nil {
			return 0, err
		}
		b := make([]byte, 16)
		if err := dev.CopyOut(b, buf.Ptr); err != nil {
			return 0, err
		}
		if binary.LittleEndian.Uint64(b) != 1 {
			return 0, fmt.Errorf("port put of %d bytes to rank %d: the flush did not complete", size, peer)
		}
		return binary.LittleEndian.Uint64(b[8:]), nil
	}
	rate := func(size int64, ns uint64) (us, gbps float64) {
		if ns == 0 {
			return 0, 0
		}
		return float64(ns) / 1e3 / float64(iters), float64(size) * float64(iters) / float64(ns)
	}
	out := make([]interPut, len(sizes))
	if bs.Rank() == 0 {
		peer := topo.RanksPerNode // rank 0's forwarder on node 1
		for j, size := range sizes {
			if size <= 0 {
				continue
			}
			var ns uint64
			for _, n := range []int{1, iters} { // a warm-up put, then the timed ones
				if ns, err = put(peer, size, n); err != nil {
					return nil, nil, err
				}
			}
			out[j] = interPut{Bytes: size, Iters: iters}
			out[j].US, out[j].GBps = rate(size, ns)
		}
	}
	// All ranks at once: rank r to its forwarder on the next node (a
	// permutation: every rank receives from one), each launch after a
	// barrier so the puts overlap.
	peer := (bs.Rank() + topo.RanksPerNode) % (topo.Nodes * topo.RanksPerNode)
	for j, size := range sizes {
		if size <= 0 {
			continue
		}
		var ns uint64
		for _, n := range []int{1, iters} {
			if err := comm.Barrier(ctx); err != nil {
				return nil, nil, err
			}
			if ns, err = put(peer, size, n); err != nil {
				return nil, nil, fmt.Errorf("rank %d: %w", bs.Rank(), err)
			}
		}
		if bs.Rank() == 0 {
			out[j].AllUS, out[j].AllGBps = rate(size, ns)
		}
		var once uint64
		for range iters {
			if err := comm.Barrier(ctx); err != nil {
				return nil, nil, err
			}
			if ns, err = put(peer, size, 1); err != nil {
				return nil, nil, fmt.Errorf("rank %d: %w", bs.Rank(), err)
			}
			once += ns
		}
		if bs.Rank() == 0 {
			out[j].OnceUS, out[j].OnceGBps = rate(size, once)
		}
		if trace {
			// One put of the count by every rank at once, traced.
			tr, err := traceCall(bs.Rank(), dev, st, fmt.Sprintf("put all %.1f MB", float64(size)/1e6),
				func() error { return comm.Barrier(ctx) }, func() error { _, err := put(peer, size, 1); return err }, nil)
			if err != nil {
				return nil, nil, fmt.Errorf("rank %d: traced put: %w", bs.Rank(), err)
			}
			traces = append(traces, tr)
		}
	}
	if err := comm.Barrier(ctx); err != nil {
		return nil, nil, err
	}
	return out, traces, nil
}

// hostSourcePorts gives r's peers port channels on r's proxy and
// semaphores whose puts come from size bytes of pinned host memory
// (channels.RegisterHostMemory) instead of r's device memory, and uploads
// their handles in rank order. free releases the memory; the caller calls
// it once every put it issued was flushed.
func hostSourcePorts(r *channeltest.Rank, size int) (_ *channels.DeviceArray, free func() error, err error) {
	dev := r.Dev
	h, err := dev.AllocHostMapped(size)
	if err != nil {
		return nil, nil, fmt.Errorf("host source of %d bytes: %w", size, err)
	}
	mem, err := r.Comm.RegisterHostMemory(h)
	if err != nil {
		return nil, nil, errors.Join(err, dev.FreeHostMapped(h))
	}
	var handles *channels.DeviceArray
	free = func() error {
		var errs []error
		if handles != nil {
			errs = append(errs, handles.Close())
		}
		return errors.Join(append(errs, r.Comm.DeregisterMemory(mem), dev.FreeHostMapped(h))...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, free())
		}
	}()
	id, err := r.Proxy.AddMemory(mem)
	if err != nil {
		return nil, nil, err
	}
	m := r.PortMesh
	chs := make([]*channels.PortChannel, len(m.Peers))
	for j := range m.Peers {
		if chs[j], err = r.Proxy.NewPortChannel(m.Semaphores[j], m.RemoteIDs[j], id); err != nil {
			return nil, nil, err
		}
	}
	byRank := (&channels.PortMesh{Peers: m.Peers, Channels: chs}).ByRank(r.Comm.Size())
	if handles, err = r.Comm.UploadPortChannels(byRank); err != nil {
		return nil, nil, err
	}
	return handles, free, nil
}
