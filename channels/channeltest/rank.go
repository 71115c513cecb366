// Package channeltest holds the correctness checks and benchmarks of
// package channels, written once and run by the channels tests (goroutine
// ranks, host backend and GPUs) and by `ep-bench channels` (goroutine ranks
// or one process per GPU). Every check is collective: all ranks call it with
// the same arguments, in the same order, and each returns what it found
// wrong on its side. The kernels it launches are in
// kernels/channel_kernels.cu and port_kernels.cu; package channels registers
// them and their host-backend twins.

package channeltest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// Layout sizes a Rank's memory. The data buffer is
//
//	[0, Region)                          source region
//	[Region, Region+Guard)               guard
//	[Region+Guard, 2*Region+Guard)       destination region
//	[2*Region+Guard, 2*Region+2*Guard)   guard
//
// and the packet buffer is two halves of HalfPackets bytes.
type Layout struct {
	Region      int
	Guard       int
	HalfPackets int
}

// LayoutFor returns a layout whose regions hold transfers of up to
// maxBytes at any of the offsets the checks use.
func LayoutFor(maxBytes int) Layout {
	region := (maxBytes + maxOffset + 4095) &^ 4095
	return Layout{Region: region, Guard: 4096, HalfPackets: 2 * region}
}

// maxOffset bounds the misalignment the checks add to offsets.
const maxOffset = 64

// dst is the offset of the destination region.
func (l Layout) dst() int { return l.Region + l.Guard }

func (l Layout) bufferSize() int { return 2*l.Region + 2*l.Guard }

// guardByte fills guards and not-yet-written destinations.
const guardByte = 0xA5

// Rank is one rank's side of the checks: a communicator, a registered data
// buffer and packet buffer, and memory channels to every other rank over
// them (a mesh; handles uploaded in rank order, this rank's slot zero).
type Rank struct {
	Comm    *channels.Communicator
	Dev     device.Device
	Layout  Layout
	Buf     device.Buffer
	Mem     channels.RegisteredMemory
	Packets *channels.PacketBuffer
	Mesh    *channels.Mesh
	ByRank  []*channels.MemoryChannel
	Handles *channels.DeviceArray

	// Port channels, built on first use by EnsurePort.
	Proxy       *channels.Proxy
	PortMesh    *channels.PortMesh
	PortByRank  []*channels.PortChannel
	PortHandles *channels.DeviceArray

	me, n int
	out   device.Buffer // kernel results
	// spin caps the grids of kernels that wait on peers (ranks sharing a
	// GPU must be co-resident); 0: no cap.
	spin int
	// shared: some GPU of the group runs several ranks.
	shared bool
}

// NewRank builds a Rank on comm (collective: every rank calls it).
func NewRank(ctx context.Context, comm *channels.Communicator, l Layout) (_ *Rank, err error) {
	r := &Rank{Comm: comm, Dev: comm.Device(), Layout: l, me: comm.Rank(), n: comm.Size()}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	pl, err := comm.Placement(ctx)
	if err != nil {
		return nil, err
	}
	r.spin, r.shared = pl.SpinBlocks, pl.AnyShared
	// The test kernels are loaded before any rank launches one (a module
	// load waits for the kernels running in the context, which ranks
	// sharing a GPU share).
	if err := r.Dev.Preload("goep_chan_put", "goep_port_stream", "goep_fill_pattern"); err != nil {
		return nil, err
	}
	if r.Buf, err = r.Dev.Alloc(l.bufferSize()); err != nil {
		return nil, err
	}
	if r.out, err = r.Dev.Alloc(4096); err != nil {
		return nil, err
	}
	if r.Mem, err = comm.RegisterMemory(r.Buf); err != nil {
		return nil, err
	}
	if r.Packets, err = comm.NewPacketBuffer(2 * l.HalfPackets); err != nil {
		return nil, err
	}
	// Memory channels need every peer's memory mapped: one node (virtual
	// nodes, or hosts, run the port-channel checks over the network).
	topo, err := comm.Topology(ctx)
	if err != nil {
		return nil, err
	}
	if r.n > 1 && topo.Nodes == 1 {
		if r.Mesh, err = comm.NewMemoryChannelMesh(ctx, channels.MeshConfig{Local: r.Mem, Packets: r.Packets}); err != nil {
			return nil, err
		}
		r.ByRank = r.Mesh.ByRank(r.n)
		if r.Handles, err = comm.UploadMemoryChannels(r.ByRank); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Close stops the Rank's proxy (nothing it queued may still touch the
// buffers) and frees the Rank's buffers (the communicator's are its own).
func (r *Rank) Close() error {
	var errs []error
	if r.Proxy != nil {
		errs = append(errs, r.Proxy.Close())
		r.Proxy = nil
	}
	if r.Buf.Ptr != 0 {
		errs = append(errs, r.Dev.Free(r.Buf))
		r.Buf = device.Buffer{}
	}
	if r.out.Ptr != 0 {
		errs = append(errs, r.Dev.Free(r.out))
		r.out = device.Buffer{}
	}
	return errors.Join(errs...)
}

func (r *Rank) errorf(format string, a ...any) error {
	return fmt.Errorf("rank %d: "+format, append([]any{r.me}, a...)...)
}

// ring returns the ranks this rank sends to and receives from at shift s.
func (r *Rank) ring(s int) (to, from int) { return (r.me + s) % r.n, (r.me - s%r.n + r.n) % r.n }

// spinGrid is grid capped to what a kernel that waits on peers may use
// (the same on every rank).
func (r *Rank) spinGrid(grid int) int {
	if r.spin > 0 {
		return min(grid, r.spin)
	}
	return grid
}

func (r *Rank) launch(kernel string, grid, block int, args *device.Args) error {
	if err := r.Dev.Launch(kernel, device.D1(grid), device.D1(block), 0, nil, args); err != nil {
		return r.errorf("launch %s: %w", kernel, err)
	}
	return nil
}

// sync waits for the default stream and turns a device-side timeout into
// its error.
func (r *Rank) sync() error {
	if err := r.Dev.DefaultStream().Synchronize(); err != nil {
		return r.errorf("synchronize: %w", err)
	}
	return r.Comm.Check()
}

func (r *Rank) clearOut(words int) error {
	return r.Dev.CopyIn(r.out.Ptr, make([]byte, 8*words))
}

// launchOut clears words result words, runs kernel to completion and
// returns them.
func (r *Rank) launchOut(kernel string, grid, block, words int, args *device.Args) ([]uint64, error) {
	if err := r.clearOut(words); err != nil {
		return nil, err
	}
	if err := r.launch(kernel, grid, block, args); err != nil {
		return nil, err
	}
	if err := r.sync(); err != nil {
		return nil, err
	}
	return r.readOut(words)
}

// rank0Pairs runs fn on rank 0 and rank p for p = 1..n-1 in turn (other is
// the partner's rank), the remaining ranks meeting them at a barrier after
// each pair; rows are what rank 0's calls return.
func (r *Rank) rank0Pairs(ctx context.Context, fn func(p, other int) (Result, error)) ([]Result, error) {
	var rows []Result
	for p := 1; p < r.n; p++ {
		if r.me == 0 || r.me == p {
			other := p
			if r.me == p {
				other = 0
			}
			row, err := fn(p, other)
			if err != nil {
				return nil, err
			}
			if r.me == 0 {
				rows = append(rows, row)
			}
		}
		if err := r.barrier(ctx); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

func (r *Rank) readOut(words int) ([]uint64, error) {
	b := make([]byte, 8*words)
	if err := r.Dev.CopyOut(b, r.out.Ptr); err != nil {
		return nil, err
	}
	out := make([]uint64, words)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out, nil
}

// fill writes the test pattern (kernels.PatternValue words) over the first
// bytes of the source region (rounded up to whole words).
func (r *Rank) fill(seed uint32, bytes int) error {
	words := uint64(bytes+3) / 4
	return r.launch(device.KernelFillPattern, 132, 512, device.NewArgs(3).Ptr(r.Buf.Ptr).U64(words).U32(seed))
}

// poison sets [off, off+n) of the buffer to the guard byte.
func (r *Rank) poison(off, n int) error {
	return r.Dev.MemsetAsync(r.Buf.Ptr+uintptr(off), guardByte, n, nil)
}

// compare checks got[0, n) against want[0, n) and that the before bytes
// below got and the after bytes above it still hold the guard byte.
func (r *Rank) compare(got, want uintptr, n, before, after int) (bad, trampled uint64, err error) {
	if err := r.clearOut(2); err != nil {
		return 0, 0, err
	}
	if err := r.launch(devapi.KernelChanCompare, 264, 512, device.NewArgs(7).Ptr(got).Ptr(want).U64(uint64(n)).
		U32(guardByte).U64(uint64(before)).U64(uint64(after)).Ptr(r.out.Ptr)); err != nil {
		return 0, 0, err
	}
	if err := r.sync(); err != nil {
		return 0, 0, err
	}
	out, err := r.readOut(2)
	if err != nil {
		return 0, 0, err
	}
	return out[0], out[1], nil
}

// exact copies both ranges to the host and compares them byte for byte, a
// check that does not rely on the compare kernel.
func (r *Rank) exact(got, want uintptr, n int) error {
	a, b := make([]byte, n), make([]byte, n)
	if err := r.Dev.CopyOut(a, got); err != nil {
		return err
	}
	if err := r.Dev.CopyOut(b, want); err != nil {
		return err
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Errorf("byte %d of %d is %#02x, want %#02x", i, n, a[i], b[i])
		}
	}
	return nil
}

func (r *Rank) barrier(ctx context.Context) error { return r.Comm.Barrier(ctx) }
