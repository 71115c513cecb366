package device

import (
	"math"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func init() {
	// Reads n bytes at p, one at a time, sleeping between steps until
	// released: a kernel still reading while something frees its memory.
	RegisterHostKernel("test_slow_reader", func(l *HostLaunch) error {
		p, n := l.Args.GetPtr(0), int(l.Args.GetU64(1))
		started, release := slowReader.started, slowReader.release
		close(started)
		<-release
		var sum byte
		for _, b := range HostSlice[byte](p, n) {
			sum += b
		}
		slowReader.sum = sum
		return nil
	})
	// Dereferences whatever pointer it is given.
	RegisterHostKernel("test_deref", func(l *HostLaunch) error {
		derefSink = HostSlice[byte](l.Args.GetPtr(0), 1)[0]
		return nil
	})
	RegisterHostKernel("test_nop", func(l *HostLaunch) error { return nil })
}

var derefSink byte

var slowReader struct {
	started, release chan struct{}
	sum              byte
}

// Class 5: every copy checks its ranges against the allocation table; the
// reference says a range is valid iff it lies inside [0, size) of one live
// allocation.
func TestHostCopiesCheckRanges(t *testing.T) {
	d := OpenHost(0)
	defer d.Close()
	const size = 4096
	b, err := d.Alloc(size)
	require.NoError(t, err)
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, 3*size)
	for i := 0; i < 500; i++ {
		off := rng.Intn(2*size) - size/2
		n := rng.Intn(size + 64)
		p := uintptr(int(b.Ptr) + off)
		valid := off >= 0 && off+n <= size || n == 0
		check := func(what string, err error) {
			if valid {
				require.NoError(t, err, "%s off %d n %d", what, off, n)
			} else {
				require.ErrorIs(t, err, ErrBadPointer, "%s off %d n %d", what, off, n)
			}
		}
		check("copy in", d.CopyIn(p, buf[:n]))
		check("copy out", d.CopyOut(buf[:n], p))
		check("memset", d.MemsetAsync(p, 1, n, nil))
		check("copy d2d dst", d.CopyAsync(p, b.Ptr, min(n, size), nil))
		check("check range", d.(RangeChecker).CheckRange(p, n))
	}
	// Addresses that are no allocation at all: would crash the process
	// without the table.
	for _, p := range []uintptr{1, 0x1000, 0xdead0000, math.MaxUint64 - 8} {
		require.ErrorIs(t, d.CopyIn(p, buf[:8]), ErrBadPointer, "%#x", p)
		require.ErrorIs(t, d.CopyOut(buf[:8], p), ErrBadPointer, "%#x", p)
	}
	require.Error(t, d.CopyAsync(b.Ptr, b.Ptr, -1, nil))
	require.Error(t, d.MemsetAsync(b.Ptr, 0, -5, nil))
	require.Error(t, d.(RangeChecker).CheckRange(math.MaxUint64-2, 8), "a range that wraps")
	// Freed memory is refused.
	require.NoError(t, d.Free(b))
	require.ErrorIs(t, d.CopyIn(b.Ptr, buf[:1]), ErrBadPointer)
	require.Error(t, d.Free(b), "double free")
}

// Class 1: after Close every method returns an error (or nothing to do),
// never a crash.
func TestHostUseAfterClose(t *testing.T) {
	d := OpenHost(2)
	b, err := d.Alloc(64)
	require.NoError(t, err)
	h, err := d.Export(b)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	buf := make([]byte, 8)
	require.ErrorIs(t, d.CopyIn(b.Ptr, buf), ErrClosed)
	require.ErrorIs(t, d.CopyOut(buf, b.Ptr), ErrClosed)
	require.ErrorIs(t, d.CopyAsync(b.Ptr, b.Ptr, 8, nil), ErrClosed)
	require.ErrorIs(t, d.MemsetAsync(b.Ptr, 0, 8, nil), ErrClosed)
	require.ErrorIs(t, d.Launch("test_nop", D1(1), D1(1), 0, nil, NewArgs(0)), ErrClosed)
	_, err = d.Alloc(8)
	require.ErrorIs(t, err, ErrClosed)
	require.Error(t, d.Free(b))
	_, err = d.Export(b)
	require.ErrorIs(t, err, ErrClosed)
	_, err = d.AllocHostMapped(8)
	require.ErrorIs(t, err, ErrClosed)
	_, err = d.Capture(nil, func() error { return nil })
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, d.Preload("test_nop"), ErrClosed)
	// A peer importing the closed rank's export is refused, not handed
	// unmapped memory.
	peer := OpenHost(3)
	defer peer.Close()
	_, err = peer.Import(h)
	require.ErrorContains(t, err, "gone")
}

// Class 1: memory a peer imported stays readable until the import closes,
// whatever its owner does.
func TestHostImportOutlivesOwner(t *testing.T) {
	owner, peer := OpenHost(0), OpenHost(1)
	defer peer.Close()
	b, err := owner.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, owner.CopyIn(b.Ptr, []byte("still here")))
	h, err := owner.Export(b)
	require.NoError(t, err)
	view, err := peer.Import(h)
	require.NoError(t, err)
	require.NoError(t, owner.Close())
	got := make([]byte, 10)
	// The owner's device is closed; the peer's view is still mapped (a
	// stale but readable page rather than a SIGSEGV).
	require.Equal(t, "still here", string(HostSlice[byte](view.Ptr, 10)))
	require.ErrorIs(t, peer.CopyOut(got, view.Ptr), ErrBadPointer, "copies refuse released memory all the same")
	require.ErrorIs(t, peer.(RangeChecker).CheckRange(view.Ptr, 1), ErrBadPointer, "a peer's memory is not this rank's")
	require.NoError(t, peer.CloseImport(view))
	require.Error(t, peer.CloseImport(view), "closing an import twice")
}

// Class 1: Free while a kernel twin reads the buffer: the memory is
// unmapped only after the kernel returns.
func TestHostFreeDuringKernel(t *testing.T) {
	d := OpenHost(0)
	defer d.Close()
	const n = 1 << 16
	b, err := d.Alloc(n)
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(b.Ptr, 1, n, nil))
	slowReader.started, slowReader.release = make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var lerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		lerr = d.Launch("test_slow_reader", D1(1), D1(1), 0, nil, NewArgs(2).Ptr(b.Ptr).U64(n))
	}()
	<-slowReader.started
	require.NoError(t, d.Free(b))
	time.Sleep(10 * time.Millisecond)
	close(slowReader.release)
	wg.Wait()
	require.NoError(t, lerr)
	require.Equal(t, byte(n%256), slowReader.sum)
	require.ErrorIs(t, d.(RangeChecker).CheckRange(b.Ptr, 1), ErrBadPointer)
	hostMem.Lock()
	left := len(hostMem.graveyard)
	hostMem.Unlock()
	require.Zero(t, left, "the freed buffer is unmapped once the kernel is done")
}

// Classes 2 and 5: values that would wrap in a 32-bit parameter, bad
// launch shapes and a twin following a wild pointer are errors.
func TestHostLaunchRefusesWrappedArguments(t *testing.T) {
	d := OpenHost(0)
	defer d.Close()
	for _, a := range []*Args{
		NewArgs(1).U32Int(1 << 32), NewArgs(1).U32Int(-1), NewArgs(1).I32Int(math.MaxInt32 + 1),
		NewArgs(2).U64(1).U64Int(-3),
	} {
		require.ErrorContains(t, d.Launch("test_nop", D1(1), D1(1), 0, nil, a), "does not fit")
	}
	ok := NewArgs(3).U32Int(math.MaxUint32).I32Int(math.MinInt32).U64Int(7)
	require.NoError(t, d.Launch("test_nop", D1(1), D1(1), 0, nil, ok))
	require.Equal(t, uint32(math.MaxUint32), ok.GetU32(0))
	require.Equal(t, int32(math.MinInt32), ok.GetI32(1))
	require.NoError(t, ok.Reset().Err())
	for _, s := range []struct{ grid, block Dim3 }{
		{D1(-1), D1(1)}, {D1(1 << 31), D1(1)}, {D1(1), D1(2048)}, {Dim3{1, 70000, 1}, D1(1)}, {D1(1), Dim3{64, 64, 1}},
	} {
		require.Error(t, d.Launch("test_nop", s.grid, s.block, 0, nil, nil), "%+v", s)
	}
	require.Error(t, d.Launch("test_nop", D1(1), D1(1), -1, nil, nil))
	require.NoError(t, d.Launch("test_nop", D1(1), D1(1), 0, nil, nil), "nil arguments are an empty list")
	err := d.Launch("test_deref", D1(1), D1(1), 0, nil, NewArgs(1).Ptr(0xdead0000))
	require.ErrorContains(t, err, "test_deref")
}
