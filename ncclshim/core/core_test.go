package core

import (
	"math/rand"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/internal/device"
)

func TestUniqueIDRoundTrip(t *testing.T) {
	id, err := NewUniqueID()
	require.NoError(t, err)
	uid, addr, err := id.parse()
	require.NoError(t, err)
	require.Len(t, uid, 32)
	require.Contains(t, addr, "127.0.0.1:")

	var bad UniqueID
	_, _, err = bad.parse()
	require.Error(t, err)
	copy(bad[:], idMagic)
	_, _, err = bad.parse()
	require.ErrorContains(t, err, "corrupt")
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, InvalidArgument, e.Code)
}

func TestValidate(t *testing.T) {
	c := &Comm{rank: 1, size: 4}
	ok := Call{Kind: AllReduce, Send: 8, Recv: 8, Count: 10, Type: nccl.Float32, Op: nccl.Sum}
	require.Nil(t, c.validate(&ok))
	for _, tc := range []struct {
		name string
		x    Call
	}{
		{"bad type", Call{Kind: AllReduce, Send: 8, Recv: 8, Count: 1, Type: 12}},
		{"negative type", Call{Kind: AllReduce, Send: 8, Recv: 8, Count: 1, Type: -1}},
		{"bad op", Call{Kind: ReduceScatter, Send: 8, Recv: 8, Count: 1, Type: nccl.Float32, Op: 5}},
		{"null send", Call{Kind: AllGather, Recv: 8, Count: 1, Type: nccl.Float32}},
		{"null recv", Call{Kind: AllReduce, Send: 8, Count: 1, Type: nccl.Float32}},
		{"root out of range", Call{Kind: Broadcast, Send: 8, Recv: 8, Count: 1, Type: nccl.Float32, Root: 4}},
		{"peer out of range", Call{Kind: Recv, Recv: 8, Count: 1, Type: nccl.Float32, Root: -1}},
		{"overflow", Call{Kind: AllGather, Send: 8, Recv: 8, Count: 1 << 61, Type: nccl.Float64}},
	} {
		err := c.validate(&tc.x)
		require.NotNil(t, err, tc.name)
		require.Equal(t, InvalidArgument, err.Code, tc.name)
	}
	// NCCL ignores the buffers a rank does not use.
	require.Nil(t, c.validate(&Call{Kind: Broadcast, Recv: 8, Count: 1, Type: nccl.Float32, Root: 0}), "non-root broadcast without send")
	require.Nil(t, c.validate(&Call{Kind: Reduce, Send: 8, Count: 1, Type: nccl.Float32, Root: 0}), "non-root reduce without recv")
	require.Nil(t, c.validate(&Call{Kind: AllReduce, Count: 0, Type: nccl.Float32}), "count 0")
	// An op is not checked where none is used.
	require.Nil(t, c.validate(&Call{Kind: AllGather, Send: 8, Recv: 8, Count: 1, Type: nccl.Int8, Op: 99}))
}

// TestInitAllRandom runs ncclCommInitAll's communicators on the host
// backend, each rank a goroutine, with random counts: allreduce sums and
// allgathers compare with a plain reference, a group drives every rank
// from one goroutine, and broadcast without NCCL takes the staged path.
func TestInitAllRandom(t *testing.T) {
	t.Setenv(EnvBackend, "host")
	t.Setenv("GOEP_NCCL", "/nonexistent/libnccl.so.2")
	const W = 3
	comms, err := InitAll(W, nil)
	require.NoError(t, err)
	defer func() {
		for _, c := range comms {
			require.NoError(t, c.Destroy())
		}
	}()
	rng := rand.New(rand.NewSource(1))
	alloc := func(n int) []float32 {
		d := device.OpenHost(0)
		b, err := d.Alloc(4 * n)
		require.NoError(t, err)
		return device.HostSlice[float32](b.Ptr, n)
	}
	ptr := func(s []float32) uintptr { return uintptr(unsafe.Pointer(&s[0])) }
	each := func(fn func(r int) error) {
		var wg sync.WaitGroup
		errs := make([]error, W)
		for r := 0; r < W; r++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = fn(r) }()
		}
		wg.Wait()
		for _, e := range errs {
			require.NoError(t, e)
		}
	}
	for iter := 0; iter < 4; iter++ {
		n := 1 + rng.Intn(5000)
		send, recv := make([][]float32, W), make([][]float32, W)
		for r := range send {
			send[r], recv[r] = alloc(W*n), alloc(W*n)
			for i := range send[r] {
				send[r][i] = float32(rng.Intn(2000)-1000) / 8
			}
		}
		each(func(r int) error {
			return comms[r].Do(uint64(100+r), Call{Kind: AllReduce, Send: ptr(send[r]), Recv: ptr(recv[r]), Count: uint64(n), Type: nccl.Float32, Op: nccl.Sum})
		})
		for r := 0; r < W; r++ {
			for i := 0; i < n; i++ {
				want := send[0][i] + send[1][i] + send[2][i]
				require.Equal(t, want, recv[r][i], "allreduce n=%d rank %d [%d]", n, r, i)
			}
		}
		// One goroutine, one group, every rank.
		GroupStart(7)
		for r := 0; r < W; r++ {
			require.NoError(t, comms[r].Do(7, Call{Kind: AllGather, Send: ptr(send[r]), Recv: ptr(recv[r]), Count: uint64(n), Type: nccl.Float32}))
		}
		require.NoError(t, GroupEnd(7))
		for r := 0; r < W; r++ {
			for q := 0; q < W; q++ {
				require.Equal(t, send[q][:n], recv[r][q*n:(q+1)*n], "allgather rank %d part %d", r, q)
			}
		}
		root := rng.Intn(W)
		each(func(r int) error {
			return comms[r].Do(uint64(100+r), Call{Kind: Broadcast, Send: ptr(send[r]), Recv: ptr(recv[r]), Count: uint64(n), Type: nccl.Float32, Root: root})
		})
		for r := 0; r < W; r++ {
			require.Equal(t, send[root][:n], recv[r][:n], "broadcast rank %d", r)
		}
	}
	counts := comms[0].Counts()
	require.EqualValues(t, 4, counts[AllReduce][PathNative])
	require.EqualValues(t, 4, counts[AllGather][PathNative])
	require.EqualValues(t, 4, counts[Broadcast][PathStaged])
	require.Contains(t, comms[0].CountsString(), "rank 0/3 (host): allreduce: native 4; allgather: native 4; broadcast: staged 4")
	require.Error(t, GroupEnd(7), "no group is open")
}

// TestOneRank: every collective of one rank is a copy, for any type and
// reduction, with no NCCL.
func TestOneRank(t *testing.T) {
	t.Setenv(EnvBackend, "host")
	comms, err := InitAll(1, nil)
	require.NoError(t, err)
	c := comms[0]
	d := device.OpenHost(0)
	defer d.Close()
	a, err := d.Alloc(64)
	require.NoError(t, err)
	b, err := d.Alloc(64)
	require.NoError(t, err)
	in, out := device.HostSlice[int32](a.Ptr, 16), device.HostSlice[int32](b.Ptr, 16)
	for i := range in {
		in[i] = int32(i*7 - 20)
	}
	for _, k := range []Kind{AllReduce, AllGather, ReduceScatter, Broadcast, Reduce} {
		clear(out)
		require.NoError(t, c.Do(1, Call{Kind: k, Send: a.Ptr, Recv: b.Ptr, Count: 16, Type: nccl.Int32, Op: nccl.Prod}), k.String())
		require.Equal(t, in, out, k.String())
	}
	require.EqualValues(t, 1, c.Counts()[Reduce][PathNative])
	require.NoError(t, c.Destroy())
	require.Error(t, c.Do(1, Call{Kind: AllReduce, Send: a.Ptr, Recv: b.Ptr, Count: 1, Type: nccl.Int32}), "after destroy")
}
