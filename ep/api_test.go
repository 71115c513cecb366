package ep_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/ep"
	"github.com/goep-dev/goep/intranode"
	"github.com/goep-dev/goep/routing"
)

// variant names a backend's subtest for what it checks: on the host
// backend streams run work as it is issued and Capture re-runs the closure,
// so a host subtest of an ordering or graph test checks only the calls'
// results and bookkeeping, and its name says so (host-what).
func variant(kind ep.Kind, what string) string {
	if kind == ep.Host {
		return "host-" + what
	}
	return string(kind)
}

// kinds are the backends a test runs on: the host backend, and CUDA when a
// GPU is present (ranks spread over the GPUs there, several to a GPU when
// there are fewer GPUs than ranks).
func kinds(t *testing.T) []ep.Kind {
	k := []ep.Kind{ep.Host}
	if gpuCount(t) > 0 {
		k = append(k, ep.CUDA)
	}
	return k
}

// Buffers are built and closed on 2, 4 and 8 ranks; everything they
// allocated (device, host-mapped, imports) is freed (the rig's Cleanup
// checks its counting Device), and Memory reports what was held.
func TestLifecycle(t *testing.T) {
	for _, kind := range kinds(t) {
		for _, ranks := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/%d", kind, ranks), func(t *testing.T) {
				cfg := ep.Config{MaxTokens: 64, Hidden: 256, TopK: 8, Experts: 64, FP8: true}
				hint, err := ep.SizeHints(cfg, ranks)
				require.NoError(t, err)
				r := newRig(t, kind, ranks, cfg)
				for i, b := range r.bufs {
					m := b.Memory()
					require.GreaterOrEqual(t, m.Device, int64(hint.Device), "rank %d", i)
					require.Less(t, m.Device, int64(hint.Device)+1<<20, "rank %d: the communicator adds little", i)
					require.Equal(t, int64(hint.HostMapped+devapi.TimeoutRecordSize), m.HostMapped, "rank %d: counters and the watchdog's record", i)
					require.Equal(t, hint, b.SizeHint())
					require.Equal(t, ranks*64, b.MaxRecv())
					a, mapped, imports := r.counts[i].live()
					require.Equal(t, m.Allocations, a, "rank %d: Memory counts every allocation", i)
					require.Equal(t, m.HostAllocations, mapped)
					require.Equal(t, 2*(ranks-1), imports, "rank %d: every peer's workspace and semaphore tokens are mapped", i)
				}
				require.NoError(t, r.close())
				for i, b := range r.bufs {
					a, m, imp := r.counts[i].live()
					require.Zero(t, a+m+imp, "rank %d leaked", i)
					require.NoError(t, b.Close(context.Background()), "closing twice is a no-op")
					_, err := b.Dispatch(context.Background(), ep.DispatchArgs{})
					require.ErrorIs(t, err, ep.ErrClosed)
					require.ErrorIs(t, b.Check(), ep.ErrClosed)
				}
			})
		}
	}
}

// Two Buffers per rank (two micro-batches), built, driven and closed by
// two goroutines per rank at the same time over one bootstrap.
func TestTwoBuffersAtOnce(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(string(kind), func(t *testing.T) {
			const ranks = 2
			boots, err := bootstrap.NewInProcess(ranks, bootstrap.Config{})
			require.NoError(t, err)
			devs := make([]ep.Device, ranks)
			for i := range devs {
				devs[i], err = ep.OpenDevice(kind, ordinalOf(t, kind, i))
				require.NoError(t, err)
			}
			defer func() {
				for i := range devs {
					require.NoError(t, devs[i].Close())
					require.NoError(t, boots[i].Close())
				}
			}()
			specs := []spec{
				{name: "a", ranks: ranks, tokens: []int{9, 4}, hidden: 128, topk: 2, experts: 8, weights: true, iters: 5},
				{name: "b", ranks: ranks, tokens: []int{3, 12}, hidden: 256, topk: 3, experts: 4, iters: 5},
			}
			// Both Buffers are built before either runs and closed after both
			// finished: on a GPU that ranks share, a free or an allocation
			// while another Buffer's kernels wait on their peers can hold
			// the peers' launches behind them (ARCHITECTURE.md, "Ranks
			// sharing a GPU").
			rigs := make([]*rig, len(specs))
			for m, s := range specs {
				cfg := s.config()
				cfg.Tag = m + 1
				r := &rig{kind: kind, cfg: cfg, devs: devs, boots: boots, bufs: make([]*ep.Buffer, ranks), streams: make([]ep.Stream, ranks)}
				require.NoError(t, r.run(func(i int, _ *ep.Buffer) error {
					var err error
					r.bufs[i], err = ep.NewBuffer(context.Background(), boots[i], devs[i], cfg)
					if err == nil {
						r.streams[i], err = devs[i].NewStream()
					}
					return err
				}))
				rigs[m] = r
			}
			// Where ranks share a GPU the two Buffers take turns (both stay
			// alive throughout): each round of a spec allocates and frees
			// its test tensors, which must not happen while the other
			// Buffer's kernels wait on their peers.
			shared := kind == ep.CUDA && gpuCount(t) < ranks
			var wg sync.WaitGroup
			for m, s := range specs {
				wg.Add(1)
				do := func() {
					defer wg.Done()
					t.Run(s.name, func(t *testing.T) { runSpec(t, rigs[m], s) })
				}
				if shared {
					do()
				} else {
					go do()
				}
			}
			wg.Wait()
			for _, r := range rigs {
				require.NoError(t, r.close())
			}
		})
	}
}

// Every bad argument is refused before any launch, with an error that
// says what is wrong and wraps ErrInvalidArgument; the Buffer stays usable
// (a collective dispatch and combine work afterwards).
func TestBadArguments(t *testing.T) {
	const T, H, K, E = 6, 256, 4, 16
	cfg := ep.Config{MaxTokens: 8, Hidden: H, TopK: K, Experts: E, FP8: true, Handles: 2}
	r := newRig(t, ep.Host, 2, cfg)
	other := newRig(t, ep.Host, 1, ep.Config{MaxTokens: 8, Hidden: H, TopK: K, Experts: E})
	b, d := r.bufs[0], r.devs[0]
	ctx := context.Background()
	x := ep.NewTensor(alloc(t, d, 2*8*H), ep.BF16, T, H)
	x8 := ep.NewTensor(alloc(t, d, 8*H), ep.FP8E4M3, T, H)
	sc := ep.NewTensor(alloc(t, d, 4*8*H/128), ep.F32, T, H/128)
	idsHost := make([]int64, T*K)
	for i := range idsHost {
		idsHost[i] = int64(i % E)
	}
	ids := ep.NewTensor(toDev(t, d, idsHost), ep.I64, T, K)
	w := ep.NewTensor(alloc(t, d, 4*T*K), ep.F32, T, K)

	// A handle of this buffer, from a collective dispatch; one of another.
	good := func(i int) ep.DispatchArgs {
		return ep.DispatchArgs{X: ep.NewTensor(alloc(t, r.devs[i], 2*T*H), ep.BF16, T, H),
			TopK: ep.NewTensor(toDev(t, r.devs[i], idsHost), ep.I64, T, K)}
	}
	handles := make([]*ep.Handle, 2)
	recv := make([]ep.Tensor, 2)
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		res, err := b.Dispatch(ctx, good(i))
		handles[i], recv[i] = res.Handle, res.RecvX
		return err
	}))
	h := handles[0]
	ores, err := other.bufs[0].Dispatch(ctx, ep.DispatchArgs{X: ep.NewTensor(alloc(t, other.devs[0], 2*T*H), ep.BF16, T, H),
		TopK: ep.NewTensor(toDev(t, other.devs[0], idsHost), ep.I64, T, K)})
	require.NoError(t, err)
	foreign := ores.Handle

	misaligned := x
	misaligned.Ptr += 2
	cases := []struct {
		name string
		a    ep.DispatchArgs
		want string
	}{
		{"no x", ep.DispatchArgs{TopK: ids}, "no x"},
		{"x f32", ep.DispatchArgs{X: ep.NewTensor(x.Ptr, ep.F32, T, H), TopK: ids}, "dtype fp32 not supported"},
		{"x hidden", ep.DispatchArgs{X: ep.NewTensor(x.Ptr, ep.BF16, T, 128), TopK: ids}, "shape [6 128], want [*, 256]"},
		{"x 3-d", ep.DispatchArgs{X: ep.NewTensor(x.Ptr, ep.BF16, 1, T, H), TopK: ids}, "3 dimensions"},
		{"too many tokens", ep.DispatchArgs{X: ep.NewTensor(x.Ptr, ep.BF16, 9, H), TopK: ep.NewTensor(ids.Ptr, ep.I64, 9, K)}, "at most 8 (Config.MaxTokens)"},
		{"misaligned x", ep.DispatchArgs{X: misaligned, TopK: ids}, "not 16-byte aligned"},
		{"null x", ep.DispatchArgs{X: ep.NewTensor(0, ep.BF16, T, H), TopK: ids}, "null pointer"},
		{"fp8 without scales", ep.DispatchArgs{X: x8, TopK: ids}, "FP8 x needs scales"},
		{"scales shape", ep.DispatchArgs{X: x8, Scales: ep.NewTensor(sc.Ptr, ep.F32, T, 3), TopK: ids}, "scales: shape [6 3], want [6, 2]"},
		{"scales dtype", ep.DispatchArgs{X: x8, Scales: ep.NewTensor(sc.Ptr, ep.BF16, T, 2), TopK: ids}, "scales: dtype bf16"},
		{"scales with bf16", ep.DispatchArgs{X: x, Scales: sc, TopK: ids}, "scales given for BF16 x"},
		{"no ids", ep.DispatchArgs{X: x}, "no top-k ids"},
		{"f32 ids", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr, ep.F32, T, K)}, "top-k ids: dtype fp32 not supported (want int64 or int32)"},
		{"misaligned i64 ids", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr+4, ep.I64, T, K)}, "top-k ids: pointer"},
		{"misaligned i32 ids", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr+2, ep.I32, T, K)}, "not 4-byte aligned"},
		{"i32 ids columns", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr, ep.I32, T, K+1)}, "top-k ids: shape [6 5], want [6, 4]"},
		{"ids columns", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr, ep.I64, T, K+1)}, "top-k ids: shape [6 5], want [6, 4]"},
		{"ids rows", ep.DispatchArgs{X: x, TopK: ep.NewTensor(ids.Ptr, ep.I64, T-1, K)}, "top-k ids: shape [5 4], want [6, 4]"},
		{"weights shape", ep.DispatchArgs{X: x, TopK: ids, Weights: ep.NewTensor(w.Ptr, ep.F32, T, 2)}, "top-k weights: shape"},
		{"weights dtype", ep.DispatchArgs{X: x, TopK: ids, Weights: ep.NewTensor(w.Ptr, ep.BF16, T, K)}, "top-k weights: dtype bf16"},
		{"alignment", ep.DispatchArgs{X: x, TopK: ids, ExpertAlignment: -1}, "expert alignment -1"},
		{"foreign handle", ep.DispatchArgs{X: x, Handle: foreign}, "belongs to another buffer"},
		{"handle tokens", ep.DispatchArgs{X: ep.NewTensor(x.Ptr, ep.BF16, T-1, H), Handle: h}, "the handle was built for 6"},
		{"launch threads", ep.DispatchArgs{X: x, TopK: ids, Launch: &ep.LaunchConfig{Threads: 48}}, "48 threads per block"},
		{"launch sms", ep.DispatchArgs{X: x, TopK: ids, Launch: &ep.LaunchConfig{SMs: -2}}, "-2 SMs"},
		{"out dtype", ep.DispatchArgs{X: x, Handle: h, Out: &ep.DispatchOutputs{X: ep.NewTensor(x.Ptr, ep.F32, 16, H)}}, "out x: dtype fp32"},
		{"out rows", ep.DispatchArgs{X: x, Handle: h, WorstCase: true, Out: &ep.DispatchOutputs{SrcToken: ep.NewTensor(x.Ptr, ep.I32, 3)}}, "needs at least 16"},
		{"out weights without weights", ep.DispatchArgs{X: x, Handle: h, Out: &ep.DispatchOutputs{Weights: w}}, "out weights given, but this dispatch has none"},
	}
	for _, c := range cases {
		_, err := b.Dispatch(ctx, c.a)
		require.Error(t, err, c.name)
		assert.ErrorIs(t, err, ep.ErrInvalidArgument, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		assert.Contains(t, err.Error(), "rank 0: dispatch", c.name)
		require.NoError(t, b.Check(), "%s: the buffer stays usable", c.name)
	}
	require.ErrorIs(t, func() error { _, err := b.Dispatch(ctx, ep.DispatchArgs{X: x, Handle: foreign}); return err }(), ep.ErrForeignHandle)

	y := ep.NewTensor(alloc(t, d, 2*16*H), ep.BF16, h.NumRecv(), H)
	ccases := []struct {
		name string
		a    ep.CombineArgs
		want string
	}{
		{"no handle", ep.CombineArgs{X: y}, "no handle"},
		{"foreign handle", ep.CombineArgs{X: y, Handle: foreign}, "belongs to another buffer"},
		{"no x", ep.CombineArgs{Handle: h}, "no x"},
		{"x rows", ep.CombineArgs{X: ep.NewTensor(y.Ptr, ep.BF16, h.NumRecv()-1, H), Handle: h}, fmt.Sprintf("needs at least %d", h.NumRecv())},
		{"x fp8", ep.CombineArgs{X: ep.NewTensor(y.Ptr, ep.FP8E4M3, h.NumRecv(), H), Handle: h}, "dtype fp8_e4m3 not supported (want bf16)"},
		{"weights shape", ep.CombineArgs{X: y, Handle: h, Weights: ep.NewTensor(w.Ptr, ep.F32, h.NumRecv(), 1)}, "weights: shape"},
		{"bias shape", ep.CombineArgs{X: y, Handle: h, Bias: [2]ep.Tensor{{}, ep.NewTensor(x.Ptr, ep.BF16, T+1, H)}}, "bias 1: shape [7 256], want [6, 256]"},
		{"out shape", ep.CombineArgs{X: y, Handle: h, Out: ep.NewTensor(x.Ptr, ep.BF16, T, 128)}, "out: shape"},
		{"out weights alone", ep.CombineArgs{X: y, Handle: h, OutWeights: w}, "no weights to combine"},
		{"launch threads", ep.CombineArgs{X: y, Handle: h, Launch: &ep.LaunchConfig{Threads: 1024}}, "want a multiple of 32 in 32..512"},
	}
	for _, c := range ccases {
		_, err := b.Combine(ctx, c.a)
		require.Error(t, err, c.name)
		assert.ErrorIs(t, err, ep.ErrInvalidArgument, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		require.NoError(t, b.Check(), c.name)
	}

	lcases := []struct {
		name string
		a    ep.LayoutArgs
		want string
	}{
		{"no ids", ep.LayoutArgs{}, "no top-k ids"},
		{"f32 ids", ep.LayoutArgs{TopK: ep.NewTensor(ids.Ptr, ep.F32, T, K)}, "dtype fp32 not supported (want int64 or int32)"},
		{"ids columns", ep.LayoutArgs{TopK: ep.NewTensor(ids.Ptr, ep.I64, T, 3)}, "want [*, 4]"},
		{"too many tokens", ep.LayoutArgs{TopK: ep.NewTensor(ids.Ptr, ep.I32, 9, K)}, "at most 8"},
	}
	for _, c := range lcases {
		_, err := b.Layout(context.Background(), c.a)
		require.Error(t, err, c.name)
		assert.ErrorIs(t, err, ep.ErrInvalidArgument, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
	}

	// Handle lifetimes: Handles is 2. The handles above live however many
	// dispatches follow; a dispatch that finds no free slot is refused on
	// the spot (every rank alike, before anything is launched) and the
	// Buffer stays usable; a released handle is refused.
	second := make([]*ep.Handle, 2)
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		res, err := b.Dispatch(ctx, good(i))
		second[i] = res.Handle
		return err
	}))
	live, slots, bytes := b.Handles()
	require.Equal(t, 2, live)
	require.Equal(t, 2, slots)
	require.Equal(t, int64(2*b.SizeHint().HandleSlot), bytes)
	require.Equal(t, b.SizeHint().HandleSlot, h.Bytes())
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		_, err := b.Dispatch(ctx, good(i))
		if !errors.Is(err, ep.ErrNoHandleSlot) || !errors.Is(err, ep.ErrInvalidArgument) {
			return fmt.Errorf("a dispatch with every slot live: want ErrNoHandleSlot, got %v", err)
		}
		return b.Check()
	}))
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		_, err := b.Combine(ctx, ep.CombineArgs{X: recv[i], Handle: handles[i]})
		return err
	}), "handles live until released, whatever dispatches follow")
	require.NoError(t, handles[0].Pin(), "Pin: a no-op on a live handle")
	handles[0].Release()
	handles[0].Release() // twice: nothing
	require.False(t, h.Live())
	require.Zero(t, h.Bytes())
	_, err = b.Combine(ctx, ep.CombineArgs{X: y, Handle: h})
	require.ErrorIs(t, err, ep.ErrExpiredHandle)
	assert.Contains(t, err.Error(), "released")
	require.ErrorIs(t, h.Pin(), ep.ErrExpiredHandle)
	require.NoError(t, b.Check())
	handles[1].Release()
	for _, x := range second {
		x.Release()
	}

	// Out tensors too small for the received count, found after the host
	// wait: the result is valid and usable all the same.
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		a := good(i)
		if i == 0 {
			a.Out = &ep.DispatchOutputs{SrcToken: ep.NewTensor(alloc(t, r.devs[i], 4), ep.I32, 1)}
		}
		res, err := b.Dispatch(ctx, a)
		if i == 0 {
			if !errors.Is(err, ep.ErrInvalidArgument) || !strings.Contains(err.Error(), "out source tokens") {
				return fmt.Errorf("want a late Out refusal, got %v", err)
			}
			if res.Handle == nil || res.NumRecv < 2 {
				return fmt.Errorf("the result should be valid: %+v", res)
			}
		} else if err != nil {
			return err
		}
		_, err = b.Combine(ctx, ep.CombineArgs{X: res.RecvX, Handle: res.Handle})
		res.Handle.Release()
		return err
	}))

	// Still usable: a collective round on both ranks.
	require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
		res, err := b.Dispatch(ctx, good(i))
		if err != nil {
			return err
		}
		defer res.Handle.Release()
		_, err = b.Combine(ctx, ep.CombineArgs{X: res.RecvX, Handle: res.Handle})
		return err
	}))
}

// Configurations that cannot work are refused by SizeHints and NewBuffer,
// on every rank, before anything is allocated; ranks that disagree are
// named.
func TestBadConfigs(t *testing.T) {
	base := ep.Config{MaxTokens: 8, Hidden: 256, TopK: 4, Experts: 16}
	for _, c := range []struct {
		name string
		mod  func(*ep.Config)
		want string
	}{
		{"experts over ranks", func(c *ep.Config) { c.Experts = 18 }, "18 experts do not divide evenly over 4 ranks"},
		{"hidden", func(c *ep.Config) { c.Hidden = 100 }, "hidden 100: want a positive multiple of 8"},
		{"fp8 hidden", func(c *ep.Config) { c.Hidden, c.FP8 = 200, true }, "FP8 needs hidden % 128 == 0, got 200"},
		{"topk", func(c *ep.Config) { c.TopK = 33 }, "top-k 33"},
		{"experts", func(c *ep.Config) { c.Experts = 8192 }, "8192 experts"},
		{"tokens", func(c *ep.Config) { c.MaxTokens = 0 }, "max tokens 0"},
		{"workspace", func(c *ep.Config) { c.WorkspaceBytes = 4096 }, "need a workspace of"},
		{"tag", func(c *ep.Config) { c.Tag = 1 << 24 }, "tag 16777216"},
		{"launch", func(c *ep.Config) { c.Combine.Threads = 544 }, "544 threads"},
		{"layout", func(c *ep.Config) { c.Layout.Threads = 20 }, "20 threads per block"},
	} {
		cfg := base
		c.mod(&cfg)
		_, err := ep.SizeHints(cfg, 4)
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		boots, err := bootstrap.NewInProcess(1, bootstrap.Config{})
		require.NoError(t, err)
		d, err := ep.OpenDevice(ep.Host, 0)
		require.NoError(t, err)
		if c.name != "experts over ranks" { // 18 experts do fit one rank
			_, err = ep.NewBuffer(context.Background(), boots[0], d, cfg)
			require.ErrorIs(t, err, ep.ErrInvalidArgument, c.name)
			assert.Contains(t, err.Error(), c.want, c.name)
		}
		require.NoError(t, d.Close())
		require.NoError(t, boots[0].Close())
	}

	// A rank whose config differs is named by the others.
	boots, err := bootstrap.NewInProcess(2, bootstrap.Config{Timeout: 10 * time.Second})
	require.NoError(t, err)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := ep.OpenDevice(ep.Host, i)
			require.NoError(t, err)
			defer d.Close()
			cfg := base
			if i == 1 {
				cfg.Hidden = 512
			}
			b, err := ep.NewBuffer(context.Background(), boots[i], d, cfg)
			errs[i] = err
			if err == nil {
				_ = b.Close(context.Background())
			}
		}()
	}
	wg.Wait()
	require.ErrorContains(t, errs[0], "rank 1's Buffer config (tokens=8 hidden=512")
	require.ErrorContains(t, errs[1], "rank 0's Buffer config (tokens=8 hidden=256")
	for _, b := range boots {
		require.NoError(t, b.Close())
	}
}

// Ids outside [-1, E) are counted by the kernels and reported after the
// call, with a valid result (they are treated as -1), for I64 and I32 ids.
func TestInvalidIDs(t *testing.T) {
	for _, kind := range kinds(t) {
		for _, i32 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/i32=%v", kind, i32), func(t *testing.T) {
				s := spec{ranks: 2, tokens: []int{4, 3}, hidden: 128, topk: 3, experts: 8, weights: true, i32: i32}
				r := newRig(t, kind, 2, s.config())
				huge := int64(1 << 40)
				if i32 {
					huge = math.MaxInt32
				}
				raw := [][]int64{{0, 9, 5, -2, -1, 7, 8, 100, -7, 3, 4, 1}, {6, -1, 2, huge, 0, 5, -1, -1, -1}}
				clean := [][]int64{{0, -1, 5, -1, -1, 7, -1, -1, -1, 3, 4, 1}, {6, -1, 2, -1, 0, 5, -1, -1, -1}}
				bad := []int{5, 1}
				ins := make([]intranode.RankInput, 2)
				io := make([]*rankIO, 2)
				for i := range io {
					d, n := r.devs[i], s.tokens[i]
					io[i] = &rankIO{ids: alloc(t, d, 8*n*3), x: alloc(t, d, 2*n*128), weights: alloc(t, d, 4*n*3)}
					io[i].in = s.newInputs(t, r, i, 5, clean[i])
					io[i].load(t, d, s)
					if i32 {
						require.NoError(t, d.CopyIn(io[i].ids, bytesOf(narrow(raw[i]))))
					} else {
						require.NoError(t, d.CopyIn(io[i].ids, bytesOf(raw[i])))
					}
					ins[i] = io[i].in
				}
				want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
				require.NoError(t, err)
				for _, worst := range []bool{false, true} {
					s.worst = worst
					res := make([]ep.DispatchResult, 2)
					errs := make([]error, 2)
					require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
						a := io[i].args(s, i)
						a.Stream = r.streams[i]
						res[i], errs[i] = b.Dispatch(context.Background(), a)
						if errs[i] != nil && !worst {
							var ie *ep.InvalidIDsError
							if !errors.As(errs[i], &ie) {
								return errs[i]
							}
						}
						return r.streams[i].Synchronize()
					}))
					for i := range res {
						if worst {
							require.NoError(t, errs[i])
							errs[i] = r.bufs[i].InvalidIDs()
						}
						var ie *ep.InvalidIDsError
						require.True(t, errors.As(errs[i], &ie), "rank %d: %v", i, errs[i])
						assert.Equal(t, bad[i], ie.Count)
						assert.Equal(t, "dispatch", ie.Op)
						assert.Contains(t, errs[i].Error(), fmt.Sprintf("%d top-k ids outside [-1, 8)", bad[i]))
						require.NoError(t, r.bufs[i].Check(), "invalid ids do not break the buffer")
						checkDispatch(t, s, r, i, res[i], want[i], nil, true, fmt.Sprintf("worst=%v", worst))
					}
				}
				// The layout kernel counts them too.
				b, d := r.bufs[0], r.devs[0]
				lr, err := b.Layout(context.Background(), ep.LayoutArgs{TopK: io[0].args(s, 0).TopK, Stream: r.streams[0]})
				require.NoError(t, err)
				require.NoError(t, lr.Done.Synchronize())
				require.NoError(t, r.streams[0].Synchronize())
				require.ErrorContains(t, b.InvalidIDs(), "rank 0: layout: 5 top-k ids outside [-1, 8)")
				require.Equal(t, []int32{2, 3}, fromDev[int32](t, d, lr.TokensPerRank.Ptr, 2))
			})
		}
	}
}

// Layout through the Buffer matches the reference, int64 and int32.
func TestLayout(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(string(kind), func(t *testing.T) {
			cfg := ep.Config{MaxTokens: 300, Hidden: 128, TopK: 8, Experts: 64}
			r := newRig(t, kind, 2, cfg)
			rt, err := routing.Generate(routing.Shape{Tokens: 300, K: 8, Experts: 64, Ranks: 2}, routing.GenOptions{Masked: 20})
			require.NoError(t, err)
			want, err := rt.Layout()
			require.NoError(t, err)
			b, d := r.bufs[0], r.devs[0]
			for _, as32 := range []bool{false, true} {
				dt := ep.I64
				if as32 {
					dt = ep.I32
				}
				ids := toDev(t, d, rt.Encode(as32))
				res, err := b.Layout(context.Background(), ep.LayoutArgs{TopK: ep.NewTensor(ids, dt, 300, 8), Stream: r.streams[0]})
				require.NoError(t, err)
				require.NoError(t, r.streams[0].Synchronize())
				got := routing.NewLayout(want.Shape)
				copy(got.TokensPerRank, fromDev[int32](t, d, res.TokensPerRank.Ptr, 2))
				copy(got.TokensPerExpert, fromDev[int32](t, d, res.TokensPerExpert.Ptr, 64))
				copy(got.IsTokenInRank, fromDev[uint8](t, d, res.IsTokenInRank.Ptr, 600))
				require.NoError(t, want.Diff(got))
				require.Equal(t, []int{300, 2}, res.IsTokenInRank.Shape)
				require.NoError(t, b.InvalidIDs())
			}
			require.NoError(t, ep.ValidateTopK(rt.Idx, cfg, 2))
			require.ErrorContains(t, ep.ValidateTopK([]int32{0, 64, 1, 2, 3, 4, 5, 6}, cfg, 2), "topk_idx[0][1] = 64")
		})
	}
}

// A rank that never arrives: its peer's wait gives up after the timeout
// with an error naming the stage and the missing rank; from then on the
// peer's Buffer refuses every call with that error, until Close.
func TestMissingRankTimesOut(t *testing.T) {
	for _, kind := range kinds(t) {
		for _, op := range []string{"dispatch", "cached-dispatch", "combine", "barrier"} {
			t.Run(string(kind)+"/"+op, func(t *testing.T) {
				cfg := ep.Config{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 4, Timeout: 300 * time.Millisecond}
				r := newRig(t, kind, 2, cfg)
				ctx := context.Background()
				args := func(i int) ep.DispatchArgs {
					return ep.DispatchArgs{X: ep.NewTensor(alloc(t, r.devs[i], 2*4*128), ep.BF16, 4, 128),
						TopK: ep.NewTensor(toDev(t, r.devs[i], []int64{0, 3, 1, 2, -1, 3, 2, 1}), ep.I64, 4, 2), Stream: r.streams[i]}
				}
				res := make([]ep.DispatchResult, 2)
				if op != "dispatch" {
					require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
						var err error
						res[i], err = b.Dispatch(ctx, args(i))
						return err
					}))
				}
				b := r.bufs[0]
				start := time.Now()
				var err error
				stage := ""
				switch op {
				case "dispatch":
					_, err = b.Dispatch(ctx, args(0))
					stage = "intranode notify barrier"
				case "cached-dispatch":
					a := args(0)
					a.Handle = res[0].Handle
					_, err = b.Dispatch(ctx, a)
					stage = "intranode dispatch entry"
				case "combine":
					_, err = b.Combine(ctx, ep.CombineArgs{X: res[0].RecvX, Handle: res[0].Handle, Stream: r.streams[0]})
					stage = "intranode combine entry"
				case "barrier":
					_, err = b.Barrier(context.Background(), r.streams[0], nil)
					stage = "device barrier"
				}
				if err == nil { // GPUs: the kernel runs on; it shows when it gives up
					require.NoError(t, r.streams[0].Synchronize())
					err = b.Check()
				}
				require.Error(t, err)
				require.ErrorIs(t, err, ep.ErrTimeout)
				var te *channels.TimeoutError
				require.True(t, errors.As(err, &te), "%v", err)
				assert.Equal(t, 0, te.Rank)
				assert.Equal(t, 1, te.Peer)
				assert.Contains(t, err.Error(), stage+" timed out waiting on rank 1")
				assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
				assert.Less(t, time.Since(start), 20*time.Second)
				t.Log(err)
				// Refusal until Close, with the same error.
				_, err2 := b.Dispatch(ctx, args(0))
				require.ErrorIs(t, err2, ep.ErrTimeout)
				require.Equal(t, err.Error(), err2.Error())
				_, err2 = b.Layout(context.Background(), ep.LayoutArgs{TopK: args(0).TopK})
				require.ErrorIs(t, err2, ep.ErrTimeout)
				_, err2 = b.Barrier(context.Background(), nil, nil)
				require.ErrorIs(t, err2, ep.ErrTimeout)
				_, err2 = b.NewEvent()
				require.ErrorIs(t, err2, ep.ErrTimeout)
				require.NoError(t, r.bufs[1].Check(), "the rank that never arrived did not wait on anyone")
			})
		}
	}
}

// The device barrier, and After/Done ordering on several streams.
func TestBarrierAndEvents(t *testing.T) {
	for _, kind := range kinds(t) {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t, kind, 4, ep.Config{MaxTokens: 4, Hidden: 128, TopK: 2, Experts: 8})
			require.NoError(t, r.run(func(i int, b *ep.Buffer) error {
				for range 20 {
					ev, err := b.Barrier(context.Background(), r.streams[i], nil)
					if err != nil {
						return err
					}
					if err := ev.Synchronize(); err != nil {
						return err
					}
				}
				// Dispatch on the Buffer's stream after the engine's event;
				// the engine's stream waits for Done.
				mine, err := b.NewEvent()
				if err != nil {
					return err
				}
				if err := mine.Record(r.streams[i]); err != nil {
					return err
				}
				d := r.devs[i]
				res, err := b.Dispatch(context.Background(), ep.DispatchArgs{
					X:     ep.NewTensor(alloc(t, d, 2*4*128), ep.BF16, 4, 128),
					TopK:  ep.NewTensor(toDev(t, d, []int64{0, 7, 1, 2, 5, 6, 3, 4}), ep.I64, 4, 2),
					After: mine, Done: mine,
				})
				if err != nil {
					return err
				}
				if res.Done != mine {
					return errors.New("Done is not the event passed in")
				}
				if err := res.Done.Wait(r.streams[i]); err != nil {
					return err
				}
				_, err = b.Combine(context.Background(), ep.CombineArgs{X: res.RecvX, Handle: res.Handle, Stream: r.streams[i]})
				if err != nil {
					return err
				}
				return r.streams[i].Synchronize()
			}))
		})
	}
}

// A worst-case dispatch and a combine captured into a graph per rank
// (what an engine does for decode steps) and replayed with new rows each
// time: no host work between replays, results exact every time. A
// dispatch that would wait on the host is refused during capture. With I32
// ids the widening kernel is captured too.
func TestGraphReplay(t *testing.T) {
	for _, kind := range kinds(t) {
		for _, i32 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/i32=%v", variant(kind, "rerun-no-graph"), i32), func(t *testing.T) {
				s := spec{name: "graph", ranks: 2, tokens: []int{30, 20}, hidden: 256, topk: 4, experts: 8, weights: true,
					worst: true, yIsRecv: true, i32: i32}
				if kind == ep.CUDA {
					s.tokens, s.hidden = []int{3000, 2000}, 7168
				}
				r := newRig(t, kind, s.ranks, s.config())
				ctx := context.Background()
				io := make([]*rankIO, s.ranks)
				ins := make([]intranode.RankInput, s.ranks)
				for i := range io {
					d, n := r.devs[i], s.tokens[i]
					io[i] = &rankIO{ids: alloc(t, d, 8*n*s.topk), x: alloc(t, d, 2*n*s.hidden), weights: alloc(t, d, 4*n*s.topk)}
					rt, err := routing.Generate(routing.Shape{Tokens: n, K: s.topk, Experts: s.experts, Ranks: s.ranks}, routing.GenOptions{Seed: uint64(i)})
					require.NoError(t, err)
					io[i].in = s.newInputs(t, r, i, 0, rt.Idx)
					io[i].load(t, d, s)
					ins[i] = io[i].in
				}
				res := make([]ep.DispatchResult, s.ranks)
				comb := make([]ep.CombineResult, s.ranks)
				graphs := r.capture(t, func(i int, b *ep.Buffer, st ep.Stream) error {
					if kind == ep.CUDA {
						a := io[i].args(s, i)
						a.WorstCase, a.Stream = false, st
						if _, err := b.Dispatch(ctx, a); !errors.Is(err, ep.ErrInvalidArgument) {
							return fmt.Errorf("a host-waiting dispatch during capture: want a refusal, got %v", err)
						}
					}
					a := io[i].args(s, i)
					a.Stream = st
					var err error
					if res[i], err = b.Dispatch(ctx, a); err != nil {
						return err
					}
					comb[i], err = b.Combine(ctx, ep.CombineArgs{X: res[i].RecvX, Handle: res[i].Handle, Weights: res[i].RecvWeights, Stream: st})
					return err
				})
				for rep := 0; rep < 4; rep++ {
					for i := range io {
						io[i].in = s.newInputs(t, r, i, uint64(rep+1), io[i].in.TopK)
						io[i].load(t, r.devs[i], s)
						ins[i] = io[i].in
					}
					require.NoError(t, r.replay(graphs))
					want, err := intranode.ReferenceDispatch(s.shape(), ins, 0)
					require.NoError(t, err)
					cins := make([]intranode.CombineInput, s.ranks)
					for i := range res {
						checkDispatch(t, s, r, i, res[i], want[i], nil, true, fmt.Sprintf("replay %d", rep))
						cins[i] = intranode.CombineInput{Y: want[i].RecvX, Weights: want[i].RecvWeights}
					}
					wantC, err := intranode.ReferenceCombine(s.shape(), s.tokens, want, cins)
					require.NoError(t, err)
					for i := range comb {
						sameSlice(t, wantC[i].X, fromDev[uint16](t, r.devs[i], comb[i].X.Ptr, s.tokens[i]*s.hidden), "replay %d: rank %d combine", rep, i)
						sameFloats(t, wantC[i].Weights, fromDev[float32](t, r.devs[i], comb[i].Weights.Ptr, s.tokens[i]*s.topk), "replay %d: rank %d combined weights", rep, i)
					}
				}
			})
		}
	}
}
