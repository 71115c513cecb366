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

// recorder is a Device that records launches instead of running them.
type recorder struct {
	device.Device
	kernel      string
	grid, block device.Dim3
	smem        int
	args        *device.Args
}

func (r *recorder) Info() device.Info { return device.Info{Kind: device.Host, SMs: 132} }

func (r *recorder) Launch(name string, grid, block device.Dim3, smem int, _ device.Stream, a *device.Args) error {
	r.kernel, r.grid, r.block, r.smem, r.args = name, grid, block, smem, a
	return nil
}

type cParam struct{ typ, name string }

// kernelParams reads the parameter lists of the kernel definitions in
// kernels/intranode.cu.
func kernelParams(t *testing.T) map[string][]cParam {
	src, err := os.ReadFile("../kernels/intranode.cu")
	require.NoError(t, err)
	re := regexp.MustCompile(`(?ms)^extern "C" __global__ void (goep_intranode_\w+)\(([^)]*)\)\s*\{`)
	out := map[string][]cParam{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		var ps []cParam
		for _, p := range strings.Split(m[2], ",") {
			f := strings.Fields(p)
			ps = append(ps, cParam{strings.Join(f[:len(f)-1], " "), f[len(f)-1]})
		}
		out[m[1]] = ps
	}
	require.Len(t, out, 3)
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
	}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "rank_prefix",
		"recv_base", "num_recv"))

	for _, fp8 := range []bool{false, true} {
		a := intranode.DispatchArgs{X: 0xb010, TopK: 0xb108, Weights: 0xb204, Handle: h, FP8: fp8}
		rowBytes, scales := uint64(512), uint64(0)
		if fp8 {
			a.Scales, rowBytes, scales = 0xb304, 256, 2
		}
		require.NoError(t, ws.Dispatch(rec, nil, a, intranode.LaunchConfig{NumSMs: 20, Threads: 64}))
		require.Equal(t, intranode.KernelDispatch, rec.kernel)
		require.Equal(t, device.D1(3), rec.grid, "5 tokens, 2 warps a block: 3 blocks")
		require.Equal(t, device.D1(64), rec.block)
		checkLaunch(t, params[intranode.KernelDispatch], rec.args, with(map[string]uint64{
			"off_recv_x": off(l.RecvX), "off_recv_scales": off(l.RecvScales), "off_recv_src": off(l.RecvSrcToken),
			"off_recv_topk": off(l.RecvTopK), "off_recv_weights": off(l.RecvWeights), "x": 0xb010,
			"scales": uint64(a.Scales), "topk_idx": 0xb108, "topk_weights": 0xb204, "local_experts": 3,
			"row_bytes": rowBytes, "num_scales": scales,
		}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "recv_base"))
	}

	require.NoError(t, ws.Combine(rec, nil, intranode.CombineArgs{Y: 0xc010, Weights: 0xc104, Bias0: 0xc210,
		Bias1: 0xc310, Out: 0xc410, OutWeights: 0xc504, Handle: h}, intranode.LaunchConfig{}))
	require.Equal(t, intranode.KernelCombine, rec.kernel)
	require.Equal(t, device.D1(intranode.DefaultSMs), rec.grid)
	require.Equal(t, device.D1(intranode.DefaultCombineThreads), rec.block)
	checkLaunch(t, params[intranode.KernelCombine], rec.args, with(map[string]uint64{
		"off_slots": off(l.CombineX), "off_wslots": off(l.CombineWeights), "slot_rows": 64, "y": 0xc010,
		"weights": 0xc104, "bias0": 0xc210, "bias1": 0xc310, "out": 0xc410, "out_weights": 0xc504, "hidden": 256,
	}, "peers", "off_ctrl", "wd", "wait_id", "num_tokens", "k", "num_ranks", "rank", "send_pos", "rank_prefix"))

	// The grid never exceeds the device's SMs (combine needs its blocks resident).
	require.NoError(t, ws.Combine(rec, nil, intranode.CombineArgs{Y: 0xc010, Out: 0xc410, Handle: h},
		intranode.LaunchConfig{NumSMs: 1000}))
	require.Equal(t, device.D1(132), rec.grid)
}
