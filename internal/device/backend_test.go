package device_test

// The same checks on every backend this machine has: the host backend always,
// the CUDA backend when a GPU is present (skipped with the reason otherwise).
// Results are compared against the plain-Go reference in package kernels.

import (
	"encoding/binary"
	"math"
	"math/rand"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/kernels"
)

// backends returns an opener per backend and how many ranks each can host.
func backends(t *testing.T) map[device.Kind]int {
	out := map[device.Kind]int{device.Host: 4}
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		t.Logf("CUDA backend skipped: no CUDA GPU (%v)", err)
	} else {
		out[device.CUDA] = n
	}
	return out
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

func TestFillAndCheckPatternMatchesReference(t *testing.T) {
	for kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, err := device.Open(kind, 0)
			require.NoError(t, err)
			defer func() { require.NoError(t, d.Close()) }()
			for _, n := range []int{1, 31, 1000, 1 << 20, 3<<20 + 17} {
				seed := rand.Uint32()
				buf, err := d.Alloc(4 * n)
				require.NoError(t, err)
				bad, err := d.Alloc(8)
				require.NoError(t, err)
				require.NoError(t, d.MemsetAsync(buf.Ptr, 0x5A, buf.Size, nil)) // poison
				require.NoError(t, d.Launch(device.KernelFillPattern, device.D1(264), device.D1(256), 0, nil,
					device.NewArgs(3).Ptr(buf.Ptr).U64(uint64(n)).U32(seed)))
				require.NoError(t, d.DefaultStream().Synchronize())
				got := make([]byte, 4*n)
				require.NoError(t, d.CopyOut(got, buf.Ptr))
				want := make([]uint32, n)
				kernels.FillPattern(want, seed)
				require.Equal(t, want, u32s(got), "n=%d", n)

				// The check kernel counts exactly the corrupted elements.
				corrupt := rand.Intn(n) + 1
				if corrupt > 5 {
					corrupt = 5
				}
				for i := 0; i < corrupt; i++ {
					idx := (i * 7919) % n
					var w [4]byte
					binary.LittleEndian.PutUint32(w[:], want[idx]^0xFFFFFFFF)
					require.NoError(t, d.CopyIn(buf.Ptr+uintptr(4*idx), w[:]))
				}
				distinct := map[int]bool{}
				for i := 0; i < corrupt; i++ {
					distinct[(i*7919)%n] = true
				}
				require.NoError(t, d.CopyIn(bad.Ptr, make([]byte, 8)))
				require.NoError(t, d.Launch(device.KernelCheckPattern, device.D1(132), device.D1(512), 0, nil,
					device.NewArgs(4).Ptr(buf.Ptr).U64(uint64(n)).U32(seed).Ptr(bad.Ptr)))
				var cnt [8]byte
				require.NoError(t, d.DefaultStream().Synchronize())
				require.NoError(t, d.CopyOut(cnt[:], bad.Ptr))
				require.Equal(t, uint64(len(distinct)), binary.LittleEndian.Uint64(cnt[:]), "n=%d", n)
				require.NoError(t, d.Free(buf))
				require.NoError(t, d.Free(bad))
			}
		})
	}
}

func TestConversionsMatchReference(t *testing.T) {
	// Random normals at several scales, plus the edges: ties, saturation,
	// subnormals, infinities and NaN.
	in := []float32{0, -0, 1, -1, 448, -448, 449, 464, 1e6, -1e6, 1e-9, -1e-9, 1.0 / 512, 1.0 / 1024,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1.00390625, 1.01171875}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 100000; i++ {
		in = append(in, float32(r.NormFloat64()*math.Pow(2, float64(r.Intn(40)-20))))
	}
	n := len(in)
	for kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, err := device.Open(kind, 0)
			require.NoError(t, err)
			defer func() { require.NoError(t, d.Close()) }()
			alloc := func(size int) uintptr {
				b, err := d.Alloc(size)
				require.NoError(t, err)
				return b.Ptr
			}
			pin, pbf, pq, pbfb, pqb := alloc(4*n), alloc(2*n), alloc(n), alloc(4*n), alloc(4*n)
			raw := make([]byte, 4*n)
			for i, x := range in {
				binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
			}
			require.NoError(t, d.CopyIn(pin, raw))
			require.NoError(t, d.Launch(device.KernelConvertTest, device.D1(128), device.D1(256), 0, nil,
				device.NewArgs(6).Ptr(pin).Ptr(pbf).Ptr(pq).Ptr(pbfb).Ptr(pqb).U64(uint64(n))))
			require.NoError(t, d.DefaultStream().Synchronize())
			bf, q := make([]byte, 2*n), make([]byte, n)
			require.NoError(t, d.CopyOut(bf, pbf))
			require.NoError(t, d.CopyOut(q, pq))
			for i, x := range in {
				require.Equal(t, kernels.Float32ToBF16(x), binary.LittleEndian.Uint16(bf[2*i:]), "bf16 of %g", x)
				require.Equal(t, kernels.Float32ToFP8E4M3(x), q[i], "fp8 of %g", x)
			}
		})
	}
}

// Goroutine ranks share memory: each rank fills its buffer with its own seed,
// exports it, and every other rank imports it and checks it in place (over
// NVLink on GPUs, through peer access).
func TestGoroutineRanksReadEachOther(t *testing.T) {
	for kind, ranks := range backends(t) {
		if ranks < 2 {
			t.Logf("%s: one device, nothing to share", kind)
			continue
		}
		t.Run(string(kind), func(t *testing.T) {
			const n = 1 << 20
			devs := make([]device.Device, ranks)
			bufs := make([]device.Buffer, ranks)
			shared := make([]device.Shared, ranks)
			for r := range devs {
				d, err := device.Open(kind, r)
				require.NoError(t, err)
				defer d.Close()
				devs[r] = d
				bufs[r], err = d.Alloc(4 * n)
				require.NoError(t, err)
				require.NoError(t, d.Launch(device.KernelFillPattern, device.D1(132), device.D1(256), 0, nil,
					device.NewArgs(3).Ptr(bufs[r].Ptr).U64(n).U32(uint32(1000+r))))
				require.NoError(t, d.DefaultStream().Synchronize())
				shared[r], err = d.Export(bufs[r])
				require.NoError(t, err)
			}
			var wg sync.WaitGroup
			errs := make([]error, ranks)
			for r := range devs {
				wg.Add(1)
				go func(r int) {
					defer wg.Done()
					errs[r] = checkPeers(devs[r], shared, r, n)
				}(r)
			}
			wg.Wait()
			ranktest.NoErrors(t, errs)
		})
	}
}

func checkPeers(d device.Device, shared []device.Shared, self, n int) error {
	cnt, err := d.Alloc(8)
	if err != nil {
		return err
	}
	defer d.Free(cnt)
	for peer, h := range shared {
		if peer == self {
			continue
		}
		view, err := d.Import(h)
		if err != nil {
			return err
		}
		if err := d.CopyIn(cnt.Ptr, make([]byte, 8)); err != nil {
			return err
		}
		if err := d.Launch(device.KernelCheckPattern, device.D1(132), device.D1(256), 0, nil,
			device.NewArgs(4).Ptr(view.Ptr).U64(uint64(n)).U32(uint32(1000+peer)).Ptr(cnt.Ptr)); err != nil {
			return err
		}
		if err := d.DefaultStream().Synchronize(); err != nil {
			return err
		}
		var b [8]byte
		if err := d.CopyOut(b[:], cnt.Ptr); err != nil {
			return err
		}
		if bad := binary.LittleEndian.Uint64(b[:]); bad != 0 {
			return &mismatch{peer, bad}
		}
		if err := d.CloseImport(view); err != nil {
			return err
		}
	}
	return nil
}

type mismatch struct {
	peer int
	bad  uint64
}

func (m *mismatch) Error() string {
	return "peer " + string(rune('0'+m.peer)) + ": mismatches " + string(rune('0'+m.bad%10))
}

func TestEventsTimeWork(t *testing.T) {
	for kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, err := device.Open(kind, 0)
			require.NoError(t, err)
			defer d.Close()
			s, err := d.NewStream()
			require.NoError(t, err)
			defer s.Close()
			a, err := d.NewEvent()
			require.NoError(t, err)
			b, err := d.NewEvent()
			require.NoError(t, err)
			buf, err := d.Alloc(64 << 20)
			require.NoError(t, err)
			require.NoError(t, a.Record(s))
			require.NoError(t, d.Launch(device.KernelFillPattern, device.D1(132), device.D1(256), 0, s,
				device.NewArgs(3).Ptr(buf.Ptr).U64(16<<20).U32(7)))
			require.NoError(t, b.Record(s))
			require.NoError(t, b.Synchronize())
			el, err := d.Elapsed(a, b)
			require.NoError(t, err)
			require.Greater(t, el.Nanoseconds(), int64(0))
			t.Logf("%s: fill of 64 MiB took %v", kind, el)
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
		})
	}
}

func TestHostMappedFlagWrittenByKernel(t *testing.T) {
	for kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, err := device.Open(kind, 0)
			require.NoError(t, err)
			defer d.Close()
			m, err := d.AllocHostMapped(64)
			require.NoError(t, err)
			for i := range m.Host {
				m.Host[i] = 0
			}
			v := rand.Uint32() | 1
			require.NoError(t, d.Launch(device.KernelWriteHostFlag, device.D1(1), device.D1(32), 0, nil,
				device.NewArgs(2).Ptr(m.Dev+8).U32(v)))
			require.NoError(t, d.DefaultStream().Synchronize())
			require.Equal(t, v, binary.LittleEndian.Uint32(m.Host[8:]))
			require.Equal(t, uint32(0), binary.LittleEndian.Uint32(m.Host[0:]), "neighbouring word untouched")
			require.NoError(t, d.FreeHostMapped(m))
			require.Error(t, d.FreeHostMapped(m), "double free is refused")
		})
	}
}

// A captured graph replays its work: poison the buffer between replays and
// check every replay restores the pattern.
func TestCapturedGraphReplays(t *testing.T) {
	for kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, err := device.Open(kind, 0)
			require.NoError(t, err)
			defer d.Close()
			s, err := d.NewStream()
			require.NoError(t, err)
			defer s.Close()
			const n = 1 << 16
			buf, err := d.Alloc(4 * n)
			require.NoError(t, err)
			seed := rand.Uint32()
			g, err := d.Capture(s, func() error {
				if err := d.MemsetAsync(buf.Ptr, 0, 4*n, s); err != nil {
					return err
				}
				return d.Launch(device.KernelFillPattern, device.D1(64), device.D1(256), 0, s,
					device.NewArgs(3).Ptr(buf.Ptr).U64(n).U32(seed))
			})
			require.NoError(t, err)
			defer g.Close()
			want := make([]uint32, n)
			kernels.FillPattern(want, seed)
			poison := make([]byte, 4*n)
			for i := range poison {
				poison[i] = 0xEE
			}
			for rep := 0; rep < 100; rep++ {
				require.NoError(t, d.CopyIn(buf.Ptr, poison))
				require.NoError(t, g.Launch(s))
				require.NoError(t, s.Synchronize())
				if rep%10 == 0 || rep == 99 {
					got := make([]byte, 4*n)
					require.NoError(t, d.CopyOut(got, buf.Ptr))
					require.Equal(t, want, u32s(got), "replay %d", rep)
				}
			}
		})
	}
}
