package intranode_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/intranode"
)

// recorder is a Device that records launches (and device-to-device copies)
// instead of running them; the fields hold the last launch.
type recorder struct {
	device.Device
	kernel      string
	grid, block device.Dim3
	smem        int
	args        *device.Args
	launches    []string
	copies      [][3]uintptr // dst, src, bytes
}

func (r *recorder) Info() device.Info { return device.Info{Kind: device.Host, SMs: 132} }

func (r *recorder) Launch(name string, grid, block device.Dim3, smem int, _ device.Stream, a *device.Args) error {
	r.kernel, r.grid, r.block, r.smem, r.args = name, grid, block, smem, a
	r.launches = append(r.launches, name)
	return nil
}

func (r *recorder) CopyAsync(dst, src uintptr, n int, _ device.Stream) error {
	r.copies = append(r.copies, [3]uintptr{dst, src, uintptr(n)})
	return nil
}

func (r *recorder) reset() { r.launches, r.copies = nil, nil }

// launchHook lets a test look at every launch, not only the last.
type launchHook struct {
	*recorder
	on func(name string, grid, block device.Dim3, a *device.Args)
}

func (h *launchHook) Launch(name string, grid, block device.Dim3, smem int, s device.Stream, a *device.Args) error {
	h.on(name, grid, block, a)
	return h.recorder.Launch(name, grid, block, smem, s, a)
}

type cParam struct{ typ, name string }

// kernelParams reads the parameter lists of the kernel definitions in
// kernels/intranode.cu and kernels/intranode_tma.cu.
func kernelParams(t *testing.T) map[string][]cParam {
	re := regexp.MustCompile(`(?ms)^extern "C" __global__ void (goep_intranode_\w+)\(([^)]*)\)\s*\{`)
	out := map[string][]cParam{}
	for _, f := range []string{"../kernels/intranode.cu", "../kernels/intranode_tma.cu"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			var ps []cParam
			for _, p := range strings.Split(m[2], ",") {
				f := strings.Fields(p)
				ps = append(ps, cParam{strings.Join(f[:len(f)-1], " "), f[len(f)-1]})
			}
			out[m[1]] = ps
		}
	}
	require.Len(t, out, 6)
	return out
}

// checkLaunch holds a recorded launch to the C parameter list: same count,
// each parameter packed as its C type, and each named parameter carrying
// the value the launcher should have passed.
func checkLaunch(t *testing.T, params []cParam, a *device.Args, want map[string]uint64) {
	t.Helper()
	require.Equal(t, len(params), a.Len(), "parameter count")
	seen := map[string]bool{}
	for i, p := range params {
		var got uint64
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("parameter %d (%s %s) packed as another kind: %v", i, p.typ, p.name, r)
				}
			}()
			switch {
			case strings.HasSuffix(p.typ, "*"):
				got = uint64(a.GetPtr(i))
			case p.typ == "u64":
				got = a.GetU64(i)
			case p.typ == "i64":
				got = uint64(a.GetI64(i))
			case p.typ == "int" || p.typ == "u32":
				got = uint64(a.GetU32(i))
			default:
				t.Fatalf("parameter %d: unexpected C type %q", i, p.typ)
			}
		}()
		w, ok := want[p.name]
		require.True(t, ok, "no expectation for parameter %s", p.name)
		require.Equal(t, w, got, "parameter %d (%s)", i, p.name)
		seen[p.name] = true
	}
	for name := range want {
		require.True(t, seen[name], "expected parameter %s is not in the C signature", name)
	}
}

// The launchers pack exactly the kernels' parameter lists, by name.
func TestLaunchersMatchKernelSignatures(t *testing.T) {
	params := kernelParams(t)
	l, err := intranode.NewLayout(intranode.Config{Ranks: 4, MaxTokens: 64, Hidden: 256, TopK: 3, LocalExperts: 3, FP8: true})
	require.NoError(t, err)
	ws := intranode.Workspace{Layout: l, Rank: 2, Base: 1 << 20, Size: l.Size, Peers: 0x7000, Watchdog: 0x7100, WaitID: 99}
	h := intranode.Handle{Tokens: 5, SendPos: 0x8004, RankPrefix: 0x8104, RecvBase: 0x8204, NumRecv: 0x8304}
	rec := &recorder{}
	off := func(r intranode.Region) uint64 { return uint64(r.Offset) }
	common := map[string]uint64{"peers": 0x7000, "off_ctrl": off(l.Ctrl), "wd": 0x7100, "wait_id": 99,
		"num_tokens": 5, "k": 3, "num_ranks": 4, "rank": 2, "send_pos": 0x8004, "rank_prefix": 0x8104,
		"recv_base": 0x8204, "num_recv": 0x8304}
	// The call fingerprint's shape word, spelled out (kernels/intranode.cuh):
	// kind+1 at bit 16, FP8 18, weights 19, top-k 20, experts 26, hidden 39.
	shape := func(kind uint64, fp8, weights bool) uint64 {
		w := (kind+1)<<16 | 3<<20 | 12<<26 | 256<<39
		if fp8 {
			w |= 1 << 18
		}
		if weights {
			w |= 1 << 19
		}
		return w
	}
	with := func(extra map[string]uint64, names ...string) map[string]uint64 {
		m := map[string]uint64{}
		for _, n := range names {
			m[n] = common[n]
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	require.NoError(t, ws.Notify(rec, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h, ExpertAlignment: 7,
		RecvCount: 0xa004, ExpertCounts: 0xa104, Invalid: 0xa204}, intranode.LaunchConfig{Threads: 256}))
	require.Equal(t, intranode.KernelNotify, rec.kernel)
	require.Equal(t, device.D1(1), rec.grid)
	require.Equal(t, device.D1(256), rec.block)
	require.Equal(t, 4*12, rec.smem)
	checkLaunch(t, params[intranode.KernelNotify], rec.args, with(map[string]uint64{
		"off_counts": off(l.Counts), "off_expert_counts": off(l.ExpertCounts), "topk_idx": 0x9008, "num_experts": 12,
		"expert_alignment": 7, "mapped_num_recv": 0xa004, "expert_counts": 0xa104, "invalid": 0xa204,
		"fp_shape": shape(0, false, false),
	}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "rank_prefix",
		"recv_base", "num_recv"))

	dispatchWant := func(a intranode.DispatchArgs, rowBytes, scales, slices, skip uint64) map[string]uint64 {
		st := [2]uint64{uint64(a.ScaleStrides[0]), uint64(a.ScaleStrides[1])}
		if a.FP8 && st == [2]uint64{} {
			st = [2]uint64{scales, 1} // row-major
		}
		return with(map[string]uint64{
			"scale_token_stride": st[0], "scale_hidden_stride": st[1],
			"off_recv_x": off(l.RecvX), "off_recv_scales": off(l.RecvScales), "off_recv_src": off(l.RecvSrcToken),
			"off_recv_topk": off(l.RecvTopK), "off_recv_weights": off(l.RecvWeights), "x": 0xb010,
			"scales": uint64(a.Scales), "topk_idx": 0xb108, "topk_weights": 0xb204, "local_experts": 3,
			"row_bytes": rowBytes, "num_scales": scales, "num_slices": slices, "skip_entry": skip,
			"fp_shape": shape(1, a.FP8, a.Weights != 0),
		}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "recv_base")
	}
	for _, kind := range []string{"bf16", "fp8", "fp8-column-major"} {
		fp8 := kind != "bf16"
		a := intranode.DispatchArgs{X: 0xb010, TopK: 0xb108, Weights: 0xb204, Handle: h, FP8: fp8}
		rowBytes, scales := uint64(512), uint64(0)
		if fp8 {
			a.Scales, rowBytes, scales = 0xb304, 256, 2
		}
		if kind == "fp8-column-major" {
			a.ScaleStrides = [2]int64{1, 8} // T=5 padded to 8 (TMA-aligned)
		}
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 20, Threads: 64}))
		require.Equal(t, intranode.KernelDispatch, rec.kernel)
		require.Equal(t, device.D1(3), rec.grid, "5 tokens, 2 warps a block: 3 blocks")
		require.Equal(t, device.D1(64), rec.block)
		checkLaunch(t, params[intranode.KernelDispatch], rec.args, dispatchWant(a, rowBytes, scales, 1, 0))

		// The wide build: same parameters.
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 20, Threads: 64, Copy: intranode.CopyWide}))
		require.Equal(t, intranode.KernelDispatchWide, rec.kernel)
		checkLaunch(t, params[intranode.KernelDispatchWide], rec.args, dispatchWant(a, rowBytes, scales, 1, 0))

		// TMA: plus the staging piece and stages, and dynamic shared memory.
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 20, Copy: intranode.CopyTMA}))
		require.Equal(t, intranode.KernelDispatchTMA, rec.kernel)
		require.Equal(t, device.D1(2), rec.grid, "5 tokens, 4 warps a block: 2 blocks")
		require.Equal(t, device.D1(96), rec.block, "3 tokens in the first block: 3 warps")
		piece := intranode.TMAPiece(96)
		require.Equal(t, 3*intranode.TMAStages*piece, rec.smem)
		require.LessOrEqual(t, rec.smem, 46<<10)
		w := dispatchWant(a, rowBytes, scales, 1, 0)
		w["piece_bytes"], w["stages"] = uint64(piece), intranode.TMAStages
		checkLaunch(t, params[intranode.KernelDispatchTMA], rec.args, w)

		// A block size meant for the plain path is capped for TMA.
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 1, Threads: 1024, Copy: intranode.CopyTMA}))
		require.Equal(t, device.D1(160), rec.block, "5 tokens in one block")
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 1, Threads: 1024, Copy: intranode.CopyWide}))
		require.Equal(t, intranode.KernelDispatchWide, rec.kernel)
		require.Equal(t, device.D1(160), rec.block)
	}

	// Few tokens, a wide row: rows are cut into slices so that every warp
	// of the grid gets work; notify+dispatch skips the entry wait.
	{
		l2, err := intranode.NewLayout(intranode.Config{Ranks: 4, MaxTokens: 64, Hidden: 7168, TopK: 3, LocalExperts: 3})
		require.NoError(t, err)
		ws2 := ws
		ws2.Layout, ws2.Size = l2, l2.Size
		a := intranode.DispatchArgs{X: 0xb010, TopK: 0xb108, Weights: 0xb204, Handle: h}
		rec.reset()
		require.NoError(t, ws2.NotifyDispatch(rec, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h}, a,
			intranode.LaunchConfig{NumSMs: 24}))
		require.Equal(t, []string{intranode.KernelNotify, intranode.KernelDispatch}, rec.launches)
		// 24 SMs x 32 warps over 5 tokens: 16 slices (the cap), 80 units.
		require.Equal(t, device.D1(3), rec.grid)
		require.Equal(t, device.D1(32*32), rec.block)
		require.Equal(t, uint64(16), uint64(rec.args.GetU32(20)), "num_slices")
		require.Equal(t, uint64(1), uint64(rec.args.GetU32(21)), "skip_entry")
		require.ErrorContains(t, ws2.NotifyDispatch(rec, nil, intranode.NotifyArgs{TopK: 0x9008, Handle: h},
			intranode.DispatchArgs{X: 0xb010, TopK: 0xb108, Handle: ws2.DefaultHandle(5)}, intranode.LaunchConfig{}),
			"same handle")
	}

	combineWant := func(offY, offW uint64, slices uint64) map[string]uint64 {
		return with(map[string]uint64{
			"off_y": offY, "off_w": offW, "bias0": 0xc210, "bias1": 0xc310, "out": 0xc410, "out_weights": 0xc504,
			"hidden": 256, "num_slices": slices, "fp_shape": shape(2, false, offW != intranode.NoOffset),
		}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "recv_base")
	}
	in := ws.CombineInput()
	recv := ws.Recv()
	require.Equal(t, ws.Base+uintptr(l.CombineX.Offset), in.X)
	require.Equal(t, ws.Base+uintptr(l.CombineWeights.Offset), in.Weights)

	// y and weights in the workspace (the combine input region, the receive
	// region): read in place, no staging.
	for _, c := range []struct{ y, w uintptr }{{in.X, in.Weights}, {recv.X, recv.Weights}, {recv.X, 0}} {
		rec.reset()
		a := intranode.CombineArgs{Y: c.y, Weights: c.w, Bias0: 0xc210, Bias1: 0xc310, Out: 0xc410, Handle: h}
		offW := intranode.NoOffset
		if c.w != 0 {
			a.OutWeights = 0xc504
			offW = uint64(c.w - ws.Base)
		}
		require.NoError(t, ws.Combine(rec, nil, a, intranode.LaunchConfig{}))
		require.Equal(t, []string{intranode.KernelCombine}, rec.launches)
		require.Empty(t, rec.copies)
		// Rows of 32 chunks of 16 bytes: too short to cut (a slice takes 2
		// chunks a lane); 5 units fill one block of 5 warps.
		require.Equal(t, device.D1(1), rec.grid)
		require.Equal(t, device.D1(160), rec.block)
		w := combineWant(uint64(c.y-ws.Base), offW, 1)
		if c.w == 0 {
			w["out_weights"] = 0
		}
		checkLaunch(t, params[intranode.KernelCombine], rec.args, w)
	}

	// y and weights outside: staged into the combine input region first,
	// by the copy kernel (count from the handle) or, given Rows, by copies.
	rec.reset()
	a := intranode.CombineArgs{Y: 0xc010, Weights: 0xc104, Bias0: 0xc210, Bias1: 0xc310, Out: 0xc410, OutWeights: 0xc504,
		Handle: h}
	require.NoError(t, ws.Combine(rec, nil, a, intranode.LaunchConfig{NumSMs: 1000}))
	require.Equal(t, []string{intranode.KernelCopyRows, intranode.KernelCopyRows, intranode.KernelCombine}, rec.launches)
	require.Equal(t, device.D1(1), rec.grid, "the grid never exceeds the units")
	checkLaunch(t, params[intranode.KernelCombine], rec.args,
		combineWant(uint64(in.X-ws.Base), uint64(in.Weights-ws.Base), 1))
	rec.reset()
	a.Rows = 7
	require.NoError(t, ws.Combine(rec, nil, a, intranode.LaunchConfig{}))
	require.Equal(t, []string{intranode.KernelCombine}, rec.launches)
	require.Equal(t, [][3]uintptr{{in.X, 0xc010, 7 * 512}, {in.Weights, 0xc104, 7 * 12}}, rec.copies)
	checkLaunch(t, params[intranode.KernelCombine], rec.args,
		combineWant(uint64(in.X-ws.Base), uint64(in.Weights-ws.Base), 1))

	// The copy kernel's parameters.
	rec.reset()
	a.Rows = 0
	a.Weights, a.OutWeights = 0, 0
	var copyArgs *device.Args
	dev := &launchHook{recorder: rec, on: func(name string, grid, block device.Dim3, a *device.Args) {
		if name == intranode.KernelCopyRows {
			copyArgs = a
			// 256 rows of 512 bytes: 8192 vectors, 4 a thread.
			require.Equal(t, device.D1(4), grid, "the staging copy: no more blocks than the worst case fills")
			require.Equal(t, device.D1(intranode.DefaultCopyThreads), block)
		}
	}}
	require.NoError(t, ws.Combine(dev, nil, a, intranode.LaunchConfig{}))
	require.Equal(t, []string{intranode.KernelCopyRows, intranode.KernelCombine}, rec.launches)
	require.NotNil(t, copyArgs)
	checkLaunch(t, params[intranode.KernelCopyRows], copyArgs, map[string]uint64{
		"src": 0xc010, "dst": uint64(in.X), "num_rows": 0x8304, "max_rows": 4 * 64, "row_bytes": 512})

	// Wide rows: combine cuts few tokens into slices too.
	{
		l2, err := intranode.NewLayout(intranode.Config{Ranks: 4, MaxTokens: 64, Hidden: 7168, TopK: 3, LocalExperts: 3})
		require.NoError(t, err)
		ws2 := ws
		ws2.Layout, ws2.Size = l2, l2.Size
		rec.reset()
		require.NoError(t, ws2.Combine(rec, nil, intranode.CombineArgs{Y: ws2.Recv().X, Out: 0xc410, Handle: h},
			intranode.LaunchConfig{}))
		// 24 SMs x 16 warps over 5 tokens: 77 -> 14 slices (896 chunks, 64 a slice), 70 units.
		require.Equal(t, uint64(14), uint64(rec.args.GetU32(15)), "num_slices")
		require.Equal(t, device.D1(5), rec.grid)
		require.Equal(t, device.D1(14*32), rec.block)
	}

	// A y inside the workspace without room for MaxRecv rows after it.
	require.ErrorContains(t, ws.Combine(rec, nil, intranode.CombineArgs{Y: ws.Base + uintptr(l.Size) - 4096, Out: 0xc410,
		Handle: h}, intranode.LaunchConfig{}), "no room")
}
