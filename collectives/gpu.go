package collectives

import (
	"fmt"

	"github.com/goep-dev/goep/internal/cuda"
	"github.com/goep-dev/goep/internal/device"
)

// gpuState is what only the CUDA backend has: the primary context, for
// events, capture status and pointer checks. It is nil on the host backend,
// where streams run work as it is issued.
type gpuState struct {
	ctx     *cuda.Context
	ordinal int
	ranges  [16]ptrRange // allocations already checked
	next    int
}

type ptrRange struct{ lo, hi uintptr }

func newGPUState(dev device.Device) (*gpuState, error) {
	cd, ok := dev.(interface{ Context() *cuda.Context })
	if !ok || dev.Info().Kind != device.CUDA {
		return nil, nil
	}
	return &gpuState{ctx: cd.Context(), ordinal: dev.Info().Ordinal}, nil
}

// stream is s as an internal/cuda stream (not owned).
func (g *gpuState) stream(s device.Stream) *cuda.Stream { return cuda.WrapStream(g.ctx, s.Handle()) }

// capturing reports whether s is being captured into a CUDA graph.
func (g *gpuState) capturing(s device.Stream) (bool, error) {
	if g == nil {
		return false, nil
	}
	st, err := g.stream(s).CaptureStatus()
	if err != nil {
		return false, err
	}
	if st == cuda.CaptureStatusInvalidated {
		return false, fmt.Errorf("the stream's capture has been invalidated")
	}
	return st == cuda.CaptureStatusActive, nil
}

// checkRange checks that [p, p+n) lies in one allocation of device memory
// of this GPU. Allocations that passed are remembered (a few), so steady
// calls on the same buffers cost no driver call; an allocation freed and
// replaced by a smaller one at the same address is not noticed.
func (g *gpuState) checkRange(what string, p uintptr, n int) error {
	if g == nil || n == 0 {
		return nil
	}
	end := p + uintptr(n)
	for _, r := range g.ranges {
		if p >= r.lo && end <= r.hi {
			return nil
		}
	}
	start, size, err := cuda.PointerRange(cuda.DevicePtr(p))
	if err != nil {
		return fmt.Errorf("%s %#x is not device memory this process can use (%v)", what, p, err)
	}
	mt, err := cuda.PointerMemoryType(cuda.DevicePtr(p))
	if err != nil {
		return fmt.Errorf("%s %#x: %v", what, p, err)
	}
	if mt != cuda.MemoryTypeDevice {
		return fmt.Errorf("%s %#x is %s memory, not device memory", what, p, mt)
	}
	ord, err := cuda.PointerDeviceOrdinal(cuda.DevicePtr(p))
	if err != nil {
		return fmt.Errorf("%s %#x: %v", what, p, err)
	}
	if ord != g.ordinal {
		return fmt.Errorf("%s %#x is memory of GPU %d, this rank uses GPU %d", what, p, ord, g.ordinal)
	}
	hi := uintptr(start) + uintptr(size)
	if end > hi {
		return fmt.Errorf("%s [%#x, +%d) runs %d bytes past the end of its allocation [%#x, +%d)", what, p, n, end-hi, uintptr(start), size)
	}
	g.ranges[g.next] = ptrRange{uintptr(start), hi}
	g.next = (g.next + 1) % len(g.ranges)
	return nil
}
