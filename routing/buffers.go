package routing

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goep-dev/goep/internal/device"
)

// errNoLayout is what a nil or closed DeviceLayout answers.
var errNoLayout = errors.New("layout: nil or closed DeviceLayout")

// DeviceLayout owns a layout's output buffers, an invalid-entry counter and
// a workspace on one device: what tests, benchmarks and tools need around
// LaunchLayout.
type DeviceLayout struct {
	Shape
	Out  LayoutOutput
	dev  device.Device
	bufs []device.Buffer
}

// NewDeviceLayout allocates the outputs for shape s and a zeroed workspace.
func NewDeviceLayout(dev device.Device, s Shape) (_ *DeviceLayout, err error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	d := &DeviceLayout{Shape: s, dev: dev}
	defer func() {
		if err != nil {
			_ = d.Close()
		}
	}()
	alloc := func(n int) (uintptr, error) {
		b, err := dev.Alloc(n)
		if err != nil {
			return 0, fmt.Errorf("layout buffers for %v: %w", s, err)
		}
		d.bufs = append(d.bufs, b)
		return b.Ptr, nil
	}
	if d.Out.TokensPerRank, err = alloc(4 * s.Ranks); err != nil {
		return nil, err
	}
	if d.Out.TokensPerExpert, err = alloc(4 * s.Experts); err != nil {
		return nil, err
	}
	if d.Out.IsTokenInRank, err = alloc(s.Tokens * s.Ranks); err != nil {
		return nil, err
	}
	if d.Out.Invalid, err = alloc(4); err != nil {
		return nil, err
	}
	ws, err := NewLayoutWorkspace(dev)
	if err != nil {
		return nil, err
	}
	d.bufs = append(d.bufs, ws)
	d.Out.Workspace = ws.Ptr
	return d, nil
}

// Launch runs the layout kernel on in (whose shape must be d's) into d.
func (d *DeviceLayout) Launch(s device.Stream, in LayoutInput, cfg LayoutConfig) error {
	if d == nil || d.bufs == nil {
		return errNoLayout
	}
	if in.Shape != d.Shape {
		return fmt.Errorf("layout: input shape %v, buffers are for %v", in.Shape, d.Shape)
	}
	return LaunchLayout(d.dev, s, in, d.Out, cfg)
}

// Poison fills every output (not the workspace) with v, synchronously, so a
// check can tell an element the kernel wrote from one it skipped.
func (d *DeviceLayout) Poison(v byte) error {
	if d == nil || d.bufs == nil {
		return errNoLayout
	}
	for _, o := range []struct {
		p uintptr
		n int
	}{
		{d.Out.TokensPerRank, 4 * d.Ranks}, {d.Out.TokensPerExpert, 4 * d.Experts},
		{d.Out.IsTokenInRank, d.Tokens * d.Ranks}, {d.Out.Invalid, 4},
	} {
		b := make([]byte, o.n)
		for i := range b {
			b[i] = v
		}
		if err := d.dev.CopyIn(o.p, b); err != nil {
			return fmt.Errorf("layout: poison outputs: %w", err)
		}
	}
	return nil
}

// Read copies the outputs back: the layout and the invalid-entry count.
// Synchronize the launch's stream first.
func (d *DeviceLayout) Read() (*Layout, int, error) {
	if d == nil || d.bufs == nil {
		return nil, 0, errNoLayout
	}
	l := NewLayout(d.Shape)
	pr, pe, inv := make([]byte, 4*d.Ranks), make([]byte, 4*d.Experts), make([]byte, 4)
	err := errors.Join(
		d.dev.CopyOut(pr, d.Out.TokensPerRank),
		d.dev.CopyOut(pe, d.Out.TokensPerExpert),
		d.dev.CopyOut(l.IsTokenInRank, d.Out.IsTokenInRank),
		d.dev.CopyOut(inv, d.Out.Invalid),
	)
	if err != nil {
		return nil, 0, fmt.Errorf("layout: read outputs: %w", err)
	}
	decodeI32(l.TokensPerRank, pr)
	decodeI32(l.TokensPerExpert, pe)
	return l, int(int32(binary.LittleEndian.Uint32(inv))), nil
}

// WorkspaceClean reports whether the workspace is all zeros, as every
// completed launch must leave it. Synchronize first.
func (d *DeviceLayout) WorkspaceClean() (bool, error) {
	if d == nil || d.bufs == nil {
		return false, errNoLayout
	}
	b := make([]byte, LayoutWorkspaceBytes)
	if err := d.dev.CopyOut(b, d.Out.Workspace); err != nil {
		return false, fmt.Errorf("layout: read workspace: %w", err)
	}
	for _, v := range b {
		if v != 0 {
			return false, nil
		}
	}
	return true, nil
}

// Close frees the buffers; later calls answer errNoLayout (closing twice
// is a no-op).
func (d *DeviceLayout) Close() error {
	if d == nil {
		return nil
	}
	var errs []error
	for _, b := range d.bufs {
		errs = append(errs, d.dev.Free(b))
	}
	d.bufs = nil
	return errors.Join(errs...)
}

// Upload copies r's topk_idx to a new device buffer as int32 or int64; free
// it with dev.Free. The input's Shape is r's.
func Upload(dev device.Device, r *Routing, asInt32 bool) (device.Buffer, LayoutInput, error) {
	data := r.Encode(asInt32)
	b, err := dev.Alloc(len(data))
	if err != nil {
		return device.Buffer{}, LayoutInput{}, fmt.Errorf("upload routing %v: %w", r.Shape, err)
	}
	if err := dev.CopyIn(b.Ptr, data); err != nil {
		_ = dev.Free(b)
		return device.Buffer{}, LayoutInput{}, fmt.Errorf("upload routing %v: %w", r.Shape, err)
	}
	return b, LayoutInput{TopK: b.Ptr, Int32: asInt32, Shape: r.Shape}, nil
}

func decodeI32(dst []int32, b []byte) {
	for i := range dst {
		dst[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
}
