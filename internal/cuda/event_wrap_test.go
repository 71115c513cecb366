package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A wrapped event is not owned: Destroy does nothing (no driver call, so
// this runs without a GPU).
func TestWrapEventNotOwned(t *testing.T) {
	e := WrapEvent(&Context{}, 0x1234)
	assert.Equal(t, uintptr(0x1234), e.Handle())
	require.NoError(t, e.Destroy())
	assert.Equal(t, uintptr(0x1234), e.Handle(), "Destroy of a wrapped event leaves the handle alone")
}

// An engine's CUevent, wrapped: a second stream waits on it, and after the
// wrapper's Destroy the owner's event still works.
func TestWrapEventGPU(t *testing.T) {
	ctx := gpuContext(t)
	s1, s2 := newStream(t, ctx), newStream(t, ctx)
	owner, err := NewEvent(ctx, EventDisableTiming)
	require.NoError(t, err)
	defer owner.Destroy()
	w := WrapEvent(ctx, owner.Handle())
	assert.Equal(t, owner.Handle(), w.Handle())

	// s1: a long fill, then the marker value; the engine records its event.
	m := loadTestModule(t, ctx)
	fill := function(t, m, "fill_u32")
	const n = 16 << 20
	big := memAlloc(t, ctx, 4*n)
	p := memAlloc(t, ctx, 1024)
	require.NoError(t, MemsetD32Async(p, 0, 256, s1))
	for i := 0; i < 4; i++ {
		require.NoError(t, Launch(fill, Dim3{X: 1024}, Dim3{X: 256}, 0, s1, NewKernelArgs().Ptr(big).U32(n).U32(uint32(i))))
	}
	require.NoError(t, MemsetD32Async(p, 0x600d, 256, s1))
	require.NoError(t, owner.Record(s1))
	// s2 waits on the wrapped handle, then overwrites the first word: it
	// must land after s1's marker.
	require.NoError(t, s2.WaitEvent(w))
	require.NoError(t, MemsetD32Async(p, 0xbeef, 1, s2))
	require.NoError(t, s2.Synchronize())
	got := u32s(readDevice(t, ctx, p, 1024))
	assert.Equal(t, uint32(0xbeef), got[0], "s2 ran after the wrapped event")
	assert.Equal(t, uint32(0x600d), got[1])

	// Record and Synchronize through the wrapper; Destroy is a no-op.
	require.NoError(t, w.Record(s2))
	require.NoError(t, w.Synchronize())
	require.NoError(t, w.Destroy())
	require.NoError(t, owner.Record(s1))
	require.NoError(t, owner.Synchronize())
}
