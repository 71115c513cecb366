package userkernel

import (
	"errors"
	"fmt"
	"slices"

	"github.com/goep-dev/goep/internal/device"
)

// Launch is the shape and place of one kernel launch.
type Launch struct {
	// Grid and Block are the launch shape; a zero Y or Z means 1.
	Grid, Block Dim3
	// SharedMem is the dynamic shared memory per block, in bytes.
	SharedMem int
	// Stream orders the launch; nil means the device's default stream.
	Stream Stream
	// NoPeerWaits declares that the kernel waits on no other rank (no
	// semaphore wait, flush, packet read or counter wait). Only such a
	// launch may exceed the spin budget when ranks share a GPU.
	NoPeerWaits bool
}

// CUDA's launch limits.
const (
	maxGridX       = 1<<31 - 1
	maxGridYZ      = 65535
	maxBlockThread = 1024
	maxBlockZ      = 64
)

// blocks validates l and returns the number of blocks of its grid.
func (l *Launch) blocks() (int, error) {
	norm := func(d *Dim3) error {
		if d.X <= 0 || d.Y < 0 || d.Z < 0 {
			return fmt.Errorf("%+v has a non-positive extent", *d)
		}
		d.Y, d.Z = max(d.Y, 1), max(d.Z, 1)
		return nil
	}
	if err := norm(&l.Grid); err != nil {
		return 0, fmt.Errorf("grid %w", err)
	}
	if err := norm(&l.Block); err != nil {
		return 0, fmt.Errorf("block %w", err)
	}
	g, b := l.Grid, l.Block
	switch {
	case g.X > maxGridX || g.Y > maxGridYZ || g.Z > maxGridYZ:
		return 0, fmt.Errorf("grid %+v is beyond CUDA's limits (%d x %d x %d)", g, maxGridX, maxGridYZ, maxGridYZ)
	case b.X > maxBlockThread || b.Y > maxBlockThread || b.Z > maxBlockZ || b.X*b.Y*b.Z > maxBlockThread:
		return 0, fmt.Errorf("block %+v has more than %d threads", b, maxBlockThread)
	case l.SharedMem < 0:
		return 0, fmt.Errorf("negative shared memory %d", l.SharedMem)
	}
	// X < 2^31 and Y, Z < 2^16: the product fits in 63 bits.
	return g.X * g.Y * g.Z, nil
}

// Launch runs kernel on the module's device in stream order with args (nil:
// none) and returns once it is queued. It refuses, before anything runs, a
// kernel the source does not define, a shape beyond CUDA's limits, a
// communicator that a timeout or an abort broke, and, unless
// l.NoPeerWaits, a grid above the spin budget when ranks share a GPU (the
// error states the budget). Synchronize waits for it and reports its
// timeouts.
func (m *Module) Launch(kernel string, l Launch, args *Args) error {
	if m == nil || m.comm == nil {
		return errors.New("userkernel: Launch on a nil Module (Load makes one)")
	}
	errorf := func(format string, a ...any) error {
		return fmt.Errorf("userkernel: rank %d: launch %s of %s: "+format, append([]any{m.comm.Rank(), kernel, m.name}, a...)...)
	}
	if !slices.Contains(m.kernels, kernel) {
		return errorf("the source defines no such kernel (it defines %v)", m.kernels)
	}
	blocks, err := l.blocks()
	if err != nil {
		return errorf("%w", err)
	}
	if err := m.comm.Check(); err != nil {
		return errorf("%w", err)
	}
	if !l.NoPeerWaits {
		if err := m.comm.CheckSpinLaunch(fmt.Sprintf("userkernel: launch %s", kernel), blocks); err != nil {
			return fmt.Errorf("%w (a kernel that waits on no other rank may say so: Launch.NoPeerWaits)", err)
		}
	}
	if args == nil {
		args = device.NewArgs(0)
	}
	if err := m.dev.Launch(kernel, l.Grid, l.Block, l.SharedMem, l.Stream, args); err != nil {
		return errorf("%w", err)
	}
	return nil
}

// Synchronize waits for the work queued on s (nil: the device's default
// stream) and then reports a device wait of the communicator that gave up:
// a *channels.TimeoutError naming the channel, the peer, the stage and what
// was awaited (errors.Is(err, channels.ErrTimeout)). After one, the
// communicator refuses further calls until Close.
func (m *Module) Synchronize(s Stream) error {
	if m == nil || m.comm == nil {
		return errors.New("userkernel: Synchronize on a nil Module (Load makes one)")
	}
	if s == nil {
		s = m.dev.DefaultStream()
	}
	serr := s.Synchronize()
	if err := m.comm.Check(); err != nil {
		return fmt.Errorf("userkernel: rank %d: %w", m.comm.Rank(), err)
	}
	if serr != nil {
		return fmt.Errorf("userkernel: rank %d: synchronize: %w", m.comm.Rank(), serr)
	}
	return nil
}
