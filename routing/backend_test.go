package routing_test

// The layout kernel on every backend this machine has (host always, CUDA
// when a GPU is present), compared exactly with the plain-Go reference.
// Outputs are poisoned before every launch so an element the kernel skips
// cannot pass for a zero.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/kernels"
	"github.com/goep-dev/goep/routing"
)

func backends(t testing.TB) []device.Kind {
	kinds := []device.Kind{device.Host}
	if n, err := device.CUDADeviceCount(); err != nil || n == 0 {
		t.Logf("CUDA backend skipped: no CUDA GPU (%v)", err)
	} else {
		kinds = append(kinds, device.CUDA)
	}
	return kinds
}

func open(t testing.TB, kind device.Kind) (device.Device, device.Stream) {
	d, err := device.Open(kind, 0)
	require.NoError(t, err)
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, s.Close())
		assert.NoError(t, d.Close())
	})
	return d, s
}

type layoutCase struct {
	s     routing.Shape
	gen   routing.GenOptions
	int32 bool
	cfg   routing.LayoutConfig
}

func (c layoutCase) String() string {
	dt := "i64"
	if c.int32 {
		dt = "i32"
	}
	return fmt.Sprintf("%v/%s/threads=%d,blocks<=%d/mask=%d,hot=%v,empty=%v",
		c.s, dt, c.cfg.Threads, c.cfg.MaxBlocks, c.gen.Masked, c.gen.Always, c.gen.EmptyRanks)
}

// layoutCases are fixed edge cases plus seeded random shapes. Configs with
// few threads and capped blocks push small T through the multi-block,
// grid-stride and last-block paths that large T takes on a GPU.
func layoutCases() []layoutCase {
	cases := []layoutCase{
		{s: routing.Shape{Tokens: 0, K: 8, Experts: 256, Ranks: 8}},
		{s: routing.Shape{Tokens: 0, K: 8, Experts: 256, Ranks: 8}, cfg: routing.LayoutConfig{Threads: 32}},
		{s: routing.Shape{Tokens: 1, K: 8, Experts: 256, Ranks: 8}},
		{s: routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}},
		{s: routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}, int32: true},
		{s: routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}, cfg: routing.LayoutConfig{Threads: 128, MaxBlocks: 7}},
		{s: routing.Shape{Tokens: 257, K: 1, Experts: 64, Ranks: 8}, gen: routing.GenOptions{Always: []int{9}}},
		{s: routing.Shape{Tokens: 1000, K: 8, Experts: 256, Ranks: 8}, gen: routing.GenOptions{Always: []int{255}}, cfg: routing.LayoutConfig{Threads: 64}},
		{s: routing.Shape{Tokens: 1000, K: 8, Experts: 256, Ranks: 8}, gen: routing.GenOptions{EmptyRanks: []int{2, 3}}},
		{s: routing.Shape{Tokens: 300, K: 4, Experts: 32, Ranks: 4}, gen: routing.GenOptions{Masked: 1 << 20}, cfg: routing.LayoutConfig{Threads: 32}},
		{s: routing.Shape{Tokens: 700, K: 9, Experts: 512, Ranks: 64}, cfg: routing.LayoutConfig{Threads: 64, MaxBlocks: 3}},
		{s: routing.Shape{Tokens: 200, K: 16, Experts: 4096, Ranks: 64}, gen: routing.GenOptions{Masked: 300}},
		{s: routing.Shape{Tokens: 100, K: 32, Experts: 64, Ranks: 32}, int32: true, cfg: routing.LayoutConfig{Threads: 1024}},
		{s: routing.Shape{Tokens: 513, K: 2, Experts: 6, Ranks: 3}, cfg: routing.LayoutConfig{Threads: 32, MaxBlocks: 1}},
		{s: routing.Shape{Tokens: 9000, K: 6, Experts: 160, Ranks: 40}, int32: true},
	}
	rng := rand.New(rand.NewPCG(7, 11))
	pick := func(v ...int) int { return v[rng.IntN(len(v))] }
	for i := 0; i < 40; i++ {
		r := pick(1, 2, 4, 8, 8, 8, 16, 64)
		e := r * min(pick(1, 2, 4, 8, 16, 32, 64), 512/r) // generating costs T*E draws
		k := min(1+rng.IntN(9), e)
		cases = append(cases, layoutCase{
			s:     routing.Shape{Tokens: pick(0, 1, 31, 32, 33, 255, 256, 257, 1000, 2048, 4097), K: k, Experts: e, Ranks: r},
			gen:   routing.GenOptions{Seed: uint64(i), Masked: pick(0, 0, 5, 500)},
			int32: rng.IntN(2) == 0,
			cfg:   routing.LayoutConfig{Threads: pick(0, 0, 32, 64, 128, 1024), MaxBlocks: pick(0, 0, 1, 2, 5)},
		})
	}
	return cases
}

func TestLayoutKernelIsRegistered(t *testing.T) {
	for _, k := range []string{routing.KernelLayoutInt64, routing.KernelLayoutInt32} {
		m, ok := kernels.ModuleForKernel(k)
		require.True(t, ok, k)
		assert.Equal(t, "layout", m.Name)
	}
}

func TestLayoutKernelMatchesReference(t *testing.T) {
	for _, kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, s := open(t, kind)
			for _, c := range layoutCases() {
				r, err := routing.Generate(c.s, c.gen)
				require.NoError(t, err, c)
				want, err := r.Layout()
				require.NoError(t, err, c)
				buf, in, err := routing.Upload(d, r, c.int32)
				require.NoError(t, err, c)
				dl, err := routing.NewDeviceLayout(d, c.s)
				require.NoError(t, err, c)
				// Twice with different poison: the second launch also checks
				// that the first left the workspace clean for it.
				for _, poison := range []byte{0xA5, 0x5A} {
					require.NoError(t, dl.Poison(poison))
					require.NoError(t, routing.LaunchLayout(d, s, in, dl.Out, c.cfg), c)
					require.NoError(t, s.Synchronize(), c)
					got, invalid, err := dl.Read()
					require.NoError(t, err)
					require.NoError(t, want.Diff(got), "%v poison %#x", c, poison)
					require.Zero(t, invalid, c)
					clean, err := dl.WorkspaceClean()
					require.NoError(t, err)
					require.True(t, clean, "%v: workspace left dirty", c)
				}
				require.NoError(t, dl.Close())
				require.NoError(t, d.Free(buf))
			}
		})
	}
}

// Corrupted device data: the kernel skips ids outside [-1, E), counts them,
// and never faults; the lenient reference agrees on everything.
func TestLayoutKernelCountsInvalidEntries(t *testing.T) {
	for _, kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, st := open(t, kind)
			for _, as32 := range []bool{false, true} {
				for _, cfg := range []routing.LayoutConfig{{}, {Threads: 32}} {
					s := routing.Shape{Tokens: 1500, K: 8, Experts: 256, Ranks: 8}
					r, err := routing.Generate(s, routing.GenOptions{Seed: 3, Masked: 40})
					require.NoError(t, err)
					idx := append([]int64(nil), r.Idx...)
					bad := []int64{256, -2, 1 << 40, -1 << 40, 1<<31 - 1, 4096}
					if as32 {
						bad = []int64{256, -2, 1<<31 - 1, -1 << 31, 4096, 300}
					}
					for i, v := range bad {
						idx[(i*997)%len(idx)] = v
					}
					want := routing.NewLayout(s)
					wantInvalid := routing.CountLayout(idx, s, want.TokensPerRank, want.TokensPerExpert, want.IsTokenInRank)
					require.Equal(t, len(bad), wantInvalid)

					raw := &routing.Routing{Shape: s, Idx: idx} // deliberately unvalidated
					buf, in, err := routing.Upload(d, raw, as32)
					require.NoError(t, err)
					dl, err := routing.NewDeviceLayout(d, s)
					require.NoError(t, err)
					require.NoError(t, dl.Poison(0xEE))
					require.NoError(t, routing.LaunchLayout(d, st, in, dl.Out, cfg))
					require.NoError(t, st.Synchronize())
					got, invalid, err := dl.Read()
					require.NoError(t, err)
					require.NoError(t, want.Diff(got))
					assert.Equal(t, wantInvalid, invalid)
					clean, err := dl.WorkspaceClean()
					require.NoError(t, err)
					require.True(t, clean)
					require.NoError(t, dl.Close())
					require.NoError(t, d.Free(buf))
				}
			}
		})
	}
}

// is_token_in_rank rows are stored 8 or 4 bytes at a time when the row
// length and the pointer allow; an odd pointer takes the byte path. Bytes
// around the output stay untouched, and the invalid count may be omitted.
func TestLayoutKernelUnalignedRows(t *testing.T) {
	for _, kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, st := open(t, kind)
			for _, s := range []routing.Shape{{Tokens: 777, K: 8, Experts: 256, Ranks: 8}, {Tokens: 301, K: 4, Experts: 48, Ranks: 12}} {
				r, err := routing.Generate(s, routing.GenOptions{Seed: 8})
				require.NoError(t, err)
				want, err := r.Layout()
				require.NoError(t, err)
				buf, in, err := routing.Upload(d, r, false)
				require.NoError(t, err)
				dl, err := routing.NewDeviceLayout(d, s)
				require.NoError(t, err)
				n := s.Tokens * s.Ranks
				rows, err := d.Alloc(n + 16)
				require.NoError(t, err)
				for _, off := range []int{1, 2, 4, 8} {
					poison := make([]byte, n+16)
					for i := range poison {
						poison[i] = 0xC3
					}
					require.NoError(t, d.CopyIn(rows.Ptr, poison))
					out := dl.Out
					out.IsTokenInRank = rows.Ptr + uintptr(off)
					out.Invalid = 0
					require.NoError(t, routing.LaunchLayout(d, st, in, out, routing.LayoutConfig{Threads: 64}))
					require.NoError(t, st.Synchronize())
					back := make([]byte, n+16)
					require.NoError(t, d.CopyOut(back, rows.Ptr))
					assert.Equal(t, want.IsTokenInRank, back[off:off+n], "%v offset %d", s, off)
					for i, v := range back {
						if i < off || i >= off+n {
							require.Equal(t, byte(0xC3), v, "%v offset %d: byte %d outside the output changed", s, off, i)
						}
					}
				}
				require.NoError(t, d.Free(rows))
				require.NoError(t, dl.Close())
				require.NoError(t, d.Free(buf))
			}
		})
	}
}

// A captured launch replays correctly and keeps the workspace clean: the
// kernel needs no host memset between replays.
func TestLayoutKernelInGraph(t *testing.T) {
	for _, kind := range backends(t) {
		t.Run(string(kind), func(t *testing.T) {
			d, st := open(t, kind)
			s := routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}
			r, err := routing.Generate(s, routing.GenOptions{Seed: 12, Masked: 10})
			require.NoError(t, err)
			want, err := r.Layout()
			require.NoError(t, err)
			buf, in, err := routing.Upload(d, r, false)
			require.NoError(t, err)
			defer d.Free(buf)
			dl, err := routing.NewDeviceLayout(d, s)
			require.NoError(t, err)
			defer dl.Close()
			g, err := d.Capture(st, func() error {
				for i := 0; i < 3; i++ { // back-to-back launches share the workspace
					if err := dl.Launch(st, in, routing.LayoutConfig{}); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(t, err)
			defer g.Close()
			for rep := 0; rep < 20; rep++ {
				require.NoError(t, dl.Poison(byte(rep+1)))
				require.NoError(t, g.Launch(st))
				require.NoError(t, st.Synchronize())
				got, _, err := dl.Read()
				require.NoError(t, err)
				require.NoError(t, want.Diff(got), "replay %d", rep)
			}
			clean, err := dl.WorkspaceClean()
			require.NoError(t, err)
			require.True(t, clean)
		})
	}
}

// Bad calls are refused before anything reaches the device: the poisoned
// outputs stay as they were.
func TestLaunchLayoutValidatesFirst(t *testing.T) {
	d, st := open(t, device.Host)
	s := routing.Shape{Tokens: 16, K: 2, Experts: 8, Ranks: 2}
	r, err := routing.Generate(s, routing.GenOptions{})
	require.NoError(t, err)
	buf, in, err := routing.Upload(d, r, false)
	require.NoError(t, err)
	defer d.Free(buf)
	dl, err := routing.NewDeviceLayout(d, s)
	require.NoError(t, err)
	defer dl.Close()
	require.NoError(t, dl.Poison(0x77))

	with := func(f func(in *routing.LayoutInput, out *routing.LayoutOutput, cfg *routing.LayoutConfig)) error {
		in2, out2, cfg := in, dl.Out, routing.LayoutConfig{}
		f(&in2, &out2, &cfg)
		return routing.LaunchLayout(d, st, in2, out2, cfg)
	}
	cases := map[string]func(*routing.LayoutInput, *routing.LayoutOutput, *routing.LayoutConfig){
		"do not divide evenly":                     func(in *routing.LayoutInput, _ *routing.LayoutOutput, _ *routing.LayoutConfig) { in.Experts = 9 },
		"top-k must be":                            func(in *routing.LayoutInput, _ *routing.LayoutOutput, _ *routing.LayoutConfig) { in.K = 0 },
		"negative token count":                     func(in *routing.LayoutInput, _ *routing.LayoutOutput, _ *routing.LayoutConfig) { in.Tokens = -1 },
		"topk_idx pointer is null":                 func(in *routing.LayoutInput, _ *routing.LayoutOutput, _ *routing.LayoutConfig) { in.TopK = 0 },
		"topk_idx pointer":                         func(in *routing.LayoutInput, _ *routing.LayoutOutput, _ *routing.LayoutConfig) { in.TopK += 4 },
		"tokens per rank pointer is null":          func(_ *routing.LayoutInput, o *routing.LayoutOutput, _ *routing.LayoutConfig) { o.TokensPerRank = 0 },
		"tokens per expert pointer":                func(_ *routing.LayoutInput, o *routing.LayoutOutput, _ *routing.LayoutConfig) { o.TokensPerExpert += 2 },
		"is_token_in_rank pointer is null":         func(_ *routing.LayoutInput, o *routing.LayoutOutput, _ *routing.LayoutConfig) { o.IsTokenInRank = 0 },
		"workspace pointer is null":                func(_ *routing.LayoutInput, o *routing.LayoutOutput, _ *routing.LayoutConfig) { o.Workspace = 0 },
		"invalid count pointer":                    func(_ *routing.LayoutInput, o *routing.LayoutOutput, _ *routing.LayoutConfig) { o.Invalid++ },
		"threads per block: want a multiple of 32": func(_ *routing.LayoutInput, _ *routing.LayoutOutput, c *routing.LayoutConfig) { c.Threads = 48 },
	}
	for msg, f := range cases {
		err := with(f)
		if assert.Error(t, err, msg) {
			assert.Contains(t, err.Error(), msg)
		}
	}
	assert.ErrorContains(t, routing.LaunchLayout(nil, st, in, dl.Out, routing.LayoutConfig{}), "nil device")
	raw := make([]byte, 4)
	require.NoError(t, d.CopyOut(raw, dl.Out.TokensPerRank))
	assert.Equal(t, uint32(0x77777777), binary.LittleEndian.Uint32(raw), "no launch happened")

	// Int32 input needs only 4-byte alignment.
	in32 := in
	in32.Int32, in32.TopK = true, in.TopK+4
	in32.Tokens = 15
	assert.NoError(t, routing.LaunchLayout(d, st, in32, dl.Out, routing.LayoutConfig{}))
}

func TestPlanLayout(t *testing.T) {
	s := routing.Shape{Tokens: 4096, K: 8, Experts: 256, Ranks: 8}
	p, err := routing.PlanLayout(s, 132, routing.LayoutConfig{})
	require.NoError(t, err)
	assert.Equal(t, routing.LaunchShape{Blocks: 16, Threads: 256, SharedBytes: 4 * 265}, p)
	p, _ = routing.PlanLayout(routing.Shape{Tokens: 0, K: 1, Experts: 1, Ranks: 1}, 132, routing.LayoutConfig{})
	assert.Equal(t, 1, p.Blocks, "T=0 still launches one block to write zero counts")
	p, _ = routing.PlanLayout(routing.Shape{Tokens: 1 << 20, K: 8, Experts: 256, Ranks: 8}, 0, routing.LayoutConfig{})
	assert.Equal(t, 132, p.Blocks, "capped at the SM count (132 when unknown)")
	p, _ = routing.PlanLayout(s, 132, routing.LayoutConfig{Threads: 64, MaxBlocks: 5})
	assert.Equal(t, "5x64", p.String())
	for _, th := range []int{-32, 16, 33, 2048} {
		_, err := routing.PlanLayout(s, 132, routing.LayoutConfig{Threads: th})
		assert.Error(t, err, th)
	}
	// The workspace holds every accumulator the largest shape needs.
	assert.GreaterOrEqual(t, routing.LayoutWorkspaceBytes, 4*(1+routing.MaxExperts+routing.MaxRanks+1))
}
