package device

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

func init() {
	// A twin used only by these tests: out[i] = in[i]*scale + bias over n
	// uint32 elements.
	RegisterHostKernel("test_axpb_u32", func(l *HostLaunch) error {
		out, in := l.Args.GetPtr(0), l.Args.GetPtr(1)
		n := int(l.Args.GetU64(2))
		scale, bias := l.Args.GetU32(3), l.Args.GetU32(4)
		src, dst := HostSlice[uint32](in, n), HostSlice[uint32](out, n)
		for i := range src {
			dst[i] = src[i]*scale + bias
		}
		return nil
	})
	RegisterHostKernel("test_fails", func(l *HostLaunch) error { return errors.New("planted failure") })
	RegisterHostKernel("test_misreads", func(l *HostLaunch) error { _ = l.Args.GetF32(0); return nil })
}

func TestArgsPackingFollowsNaturalAlignment(t *testing.T) {
	a := NewArgs(4).U32(7).Ptr(0x1000).I32(-1).F32(1.5).I64(-2)
	require.Equal(t, []uint32{0, 8, 16, 20, 24}, a.Offsets())
	require.Len(t, a.Bytes(), 32)
	require.Equal(t, uint32(7), a.GetU32(0))
	require.Equal(t, uintptr(0x1000), a.GetPtr(1))
	require.Equal(t, int32(-1), a.GetI32(2))
	require.Equal(t, float32(1.5), a.GetF32(3))
	require.Equal(t, int64(-2), a.GetI64(4))
	require.Panics(t, func() { a.GetU64(0) }, "reading a 32-bit argument as 64-bit must be caught")
	require.Panics(t, func() { a.GetU32(9) })
	a.Reset().U64(3)
	require.Equal(t, []uint32{0}, a.Offsets())
}

func TestHostAllocCopyLaunchRoundTrip(t *testing.T) {
	d := OpenHost(0)
	defer d.Close()
	for _, n := range []int{1, 7, 4096, 100003} {
		in, err := d.Alloc(4 * n)
		require.NoError(t, err)
		out, err := d.Alloc(4 * n)
		require.NoError(t, err)
		src := make([]byte, 4*n)
		rand.Read(src)
		require.NoError(t, d.CopyIn(in.Ptr, src))
		require.NoError(t, d.MemsetAsync(out.Ptr, 0xAB, out.Size, d.DefaultStream()))
		args := NewArgs(5).Ptr(out.Ptr).Ptr(in.Ptr).U64(uint64(n)).U32(3).U32(11)
		require.NoError(t, d.Launch("test_axpb_u32", D1(1), D1(1), 0, d.DefaultStream(), args))
		got := make([]byte, 4*n)
		require.NoError(t, d.CopyOut(got, out.Ptr))
		want := HostSlice[uint32](in.Ptr, n)
		have := HostSlice[uint32](out.Ptr, n)
		for i := range want {
			require.Equal(t, want[i]*3+11, have[i], "element %d of %d", i, n)
		}
		require.NoError(t, d.Free(in))
		require.NoError(t, d.Free(out))
	}
}

func TestHostLaunchErrorsNameTheKernel(t *testing.T) {
	d := OpenHost(3)
	defer d.Close()
	err := d.Launch("no_such_kernel", D1(1), D1(1), 0, nil, NewArgs(0))
	require.ErrorContains(t, err, "no_such_kernel")
	err = d.Launch("test_fails", D1(1), D1(1), 0, nil, NewArgs(0))
	require.ErrorContains(t, err, "test_fails: planted failure")
	err = d.Launch("test_misreads", D1(1), D1(1), 0, nil, NewArgs(1).U32(1))
	require.ErrorContains(t, err, "test_misreads")
	require.ErrorContains(t, err, "read as a float32")
}

func TestHostShareBetweenGoroutineRanks(t *testing.T) {
	owner, peer := OpenHost(0), OpenHost(1)
	defer owner.Close()
	defer peer.Close()
	b, err := owner.Alloc(64)
	require.NoError(t, err)
	h, err := owner.Export(b)
	require.NoError(t, err)
	view, err := peer.Import(h)
	require.NoError(t, err)
	require.Equal(t, b, view)
	require.NoError(t, peer.CopyIn(view.Ptr, []byte("written by rank 1")))
	got := make([]byte, 17)
	require.NoError(t, owner.CopyOut(got, b.Ptr))
	require.Equal(t, "written by rank 1", string(got))

	_, err = peer.Import(Shared("garbage"))
	require.Error(t, err)
	forged := append(Shared(nil), h...)
	forged[len(hostShareTag)]++ // another pid
	_, err = peer.Import(forged)
	require.ErrorContains(t, err, "goroutine ranks of one process")
	_, err = peer.Export(b)
	require.Error(t, err, "a rank cannot export memory it does not own")
}

func TestHostFreeAndClose(t *testing.T) {
	d := OpenHost(0)
	b, err := d.Alloc(10)
	require.NoError(t, err)
	require.Error(t, OpenHost(1).Free(b), "free through the wrong device")
	z, err := d.Alloc(0)
	require.NoError(t, err)
	require.NoError(t, d.Free(z))
	_, err = d.Alloc(-1)
	require.Error(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "Close twice is harmless")
	_, err = d.Alloc(8)
	require.ErrorIs(t, err, ErrClosed)
}

func TestParseKind(t *testing.T) {
	k, _, err := ParseKind("host")
	require.NoError(t, err)
	require.Equal(t, Host, k)
	_, _, err = ParseKind("tpu")
	require.ErrorContains(t, err, "tpu")
	k, why, err := ParseKind("auto")
	require.NoError(t, err)
	if k == Host {
		require.NotEmpty(t, why, "auto must say why it fell back to the host backend")
	}
}
