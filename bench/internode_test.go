package bench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internode"
)

// The same over the port over CUDA IPC between the virtual nodes
// ($GOEP_NET_TRANSPORT=ipc; host memory on the host backend): the checks
// pass, the report names the transport and no TCP staging, and the port
// put it compares against is that transport's.
func TestInternodeOnHostOverPort(t *testing.T) {
	t.Setenv(channels.NetTransportEnv, "ipc")
	t.Setenv(internode.PutBytesEnv, "")
	js := filepath.Join(t.TempDir(), "inter.json")
	args := append([]string{"internode", "--ranks", "4", "--nodes", "2", "--tokens", "40", "--json", js}, quickIntranode...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"network between the nodes: the port over CUDA IPC", "the network leg is host memory copies by the proxy",
		"byte-exact", "combine (BF16 partials) bit-exact", "internode: all checks passed"} {
		assert.Contains(t, stdout, want)
	}
	for _, not := range []string{"stage through", "sockets a connection", "TCP on loopback"} {
		assert.NotContains(t, stdout, not)
	}
	rep := readJSON[interReport](t, js)
	require.Empty(t, rep.Errors)
	require.Equal(t, channels.TransportCudaIPC.String(), rep.Network)
	require.Empty(t, rep.TCP)
	require.Zero(t, rep.NetworkStaging)
	require.Zero(t, rep.PutBytesUsed)
	require.Equal(t, internode.PortPutGroups, rep.PutGroups)
	assert.Contains(t, stdout, fmt.Sprintf("puts: %d per node, each a group of consecutive blocks' rows (the defaults over the port over CUDA IPC", internode.PortPutGroups))
	require.Equal(t, "auto", rep.Forward)
	assert.Contains(t, stdout, "dispatch forwarding: auto")
	require.NotEmpty(t, rep.Rows)
	for _, r := range rep.Rows {
		require.Positive(t, r.Traffic.Network, "%+v", r)
		require.Equal(t, r.Traffic.Network, r.Put.Bytes, "%+v", r)
		require.Positive(t, r.Put.GBps, "%+v", r)
		require.Positive(t, r.Put.OnceGBps, "%+v", r)
	}
}

// `ep-bench internode` on the host backend: 4 goroutine ranks in 2 virtual
// nodes, checks (against internode's reference) and timings with bytes per
// link, and its bad flags.
func TestInternodeOnHost(t *testing.T) {
	t.Setenv("GOEP_TCP_RECEIVE_AHEAD", "") // the report names the default
	t.Setenv(channels.NetTransportEnv, "") // TCP between the virtual nodes
	js := filepath.Join(t.TempDir(), "inter.json")
	args := append([]string{"internode", "--ranks", "4", "--nodes", "2", "--tokens", "0,40", "--fp8", "--masked", "5", "--json", js},
		quickIntranode...)
	code, stdout, stderr := run(t, args...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	for _, want := range []string{"internode: 4 ranks (goroutines, 2 virtual nodes), host backend", "T=40 bf16", "byte-exact",
		"combine (BF16 partials) bit-exact", "T=40 fp8", "TIMINGS", "network GB/s", "NVLink GB/s", "internode: all checks passed",
		"network between the nodes: TCP, ", " sockets a connection, ", "receive read-ahead 4 buffers a socket (GPUs)"} {
		assert.Contains(t, stdout, want)
	}
	rep := readJSON[interReport](t, js)
	require.Empty(t, rep.Errors)
	require.Equal(t, "internode", rep.Mode)
	// One TCP connection to the other node, staged through as GPUs do.
	nc, err := channels.NetworkConfig{}.Resolve(4)
	require.NoError(t, err)
	staging, err := nc.StagingBytes()
	require.NoError(t, err)
	require.Equal(t, staging, rep.NetworkStaging)
	require.Positive(t, rep.Memory.Device)
	assert.Contains(t, stdout, fmt.Sprintf("stage through %.1f MiB of pinned host memory", float64(staging)/(1<<20)))
	require.Contains(t, rep.TCP, "sockets a connection")
	require.Equal(t, "tcp", rep.Network)
	require.Equal(t, internode.DefaultPutBytes, rep.PutBytesUsed)
	assert.Contains(t, stdout, "puts in pieces of 1024 KiB (the default over TCP")
	require.Equal(t, "nodes", rep.Forward)
	assert.Contains(t, stdout, "dispatch forwarding: nodes")
	require.Len(t, rep.Checks, 2*2)
	// Per token count: bf16 cached, combine, full, older-handle; fp8 cached.
	require.Len(t, rep.Rows, 2*5)
	for _, r := range rep.Rows {
		require.Positive(t, r.US, "%+v", r)
		require.GreaterOrEqual(t, r.MaxUS, r.US)
		tr := r.Traffic
		if r.Tokens == 0 {
			require.Zero(t, tr, "%+v", r)
			continue
		}
		// 40 tokens of top-4 over 2 nodes: rank 0 sends rows to the other
		// node and receives rows forwarded by its node peer; DeepEP's
		// figures include its own traffic, so they are at least as large.
		require.Positive(t, tr.Network, "%+v", r)
		require.Positive(t, tr.NVLink, "%+v", r)
		require.GreaterOrEqual(t, tr.DeepEPRDMA, tr.Network, "%+v", r)
		require.GreaterOrEqual(t, tr.DeepEPNVL, tr.NVLink, "%+v", r)
		row := int64(512) // BF16 rows of hidden 256; combine partials are BF16 too
		if r.Dtype == "fp8" {
			row = 256 + 8
		}
		require.Zero(t, tr.Network%row, "%+v: whole rows", r)
		require.Zero(t, tr.NVLink%row, "%+v: whole rows", r)
		require.InDelta(t, float64(tr.Network)/r.US/1e3, r.NetGBps, 1e-9)
		require.InDelta(t, float64(tr.NVLink)/r.US/1e3, r.NVLGBps, 1e-9)
		// The transport's put of the same network bytes, and the ratio.
		require.Equal(t, tr.Network, r.Put.Bytes, "%+v: the put moves rank 0's network bytes", r)
		require.Positive(t, r.Put.GBps, "%+v", r)
		require.InDelta(t, 100*r.NetGBps/r.Put.GBps, r.NetOfPut, 1e-9)
		// Every rank at once: streamed puts and single puts of the count,
		// each rate from its own time per put.
		require.Positive(t, r.Put.AllGBps, "%+v", r)
		require.Positive(t, r.Put.OnceGBps, "%+v", r)
		require.InDelta(t, float64(r.Put.Bytes)/r.Put.OnceUS/1e3, r.Put.OnceGBps, 1e-9)
		require.InDelta(t, float64(r.Put.Bytes)/r.Put.AllUS/1e3, r.Put.AllGBps, 1e-9)
		require.InDelta(t, 100*r.NetGBps/r.Put.OnceGBps, r.NetOfPutOnce, 1e-9)
	}
	require.Contains(t, stdout, "port put GB/s")
	require.Contains(t, stdout, "net/put once")
	require.Empty(t, rep.Sweep)
	require.Empty(t, rep.SendMemory)

	// The rows for other nodes in host memory, with the TCP transport
	// staging device memory as on GPUs: checked, and the port puts come
	// from host memory too (their own channels on the put proxy).
	t.Run("send=host", func(t *testing.T) {
		t.Setenv(internode.SendMemoryEnv, "host")
		t.Setenv("GOEP_TCP_STAGE", "always")
		js := filepath.Join(t.TempDir(), "host.json")
		code, stdout, stderr := run(t, append([]string{"internode", "--ranks", "4", "--nodes", "2", "--tokens", "40", "--json", js},
			quickIntranode...)...)
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		require.Contains(t, stdout, "internode: all checks passed")
		require.Contains(t, stdout, "$GOEP_INTERNODE_SEND_MEMORY=host memory")
		rep := readJSON[interReport](t, js)
		require.Equal(t, "host", rep.SendMemory)
		require.NotEmpty(t, rep.Rows)
		for _, r := range rep.Rows {
			require.Positive(t, r.Put.GBps, "%+v", r)
			require.Positive(t, r.Put.OnceGBps, "%+v", r)
		}
	})
	t.Run("send=bad", func(t *testing.T) {
		t.Setenv(internode.SendMemoryEnv, "gpu")
		code, _, stderr := run(t, append([]string{"internode", "--ranks", "4", "--nodes", "2", "--tokens", "8"}, quickIntranode...)...)
		require.Equal(t, 1, code)
		require.Contains(t, stderr, "want device or host")
	})

	// --sweep: every split of an 8-block grid runs its own Buffer, checked
	// and timed; the best is named. --split and its bad forms.
	js2 := filepath.Join(t.TempDir(), "sweep.json")
	code, stdout, stderr = run(t, append([]string{"internode", "--ranks", "4", "--nodes", "2", "--tokens", "24", "--sms", "8", "--sweep",
		"--split", "shared", "--json", js2}, quickIntranode...)...)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	srep := readJSON[interReport](t, js2)
	require.Empty(t, srep.Errors)
	require.Equal(t, "shared", srep.Split)
	require.Len(t, srep.Sweep, len(sweepSplits(8)))
	for _, sw := range srep.Sweep {
		require.Empty(t, sw.Err)
		require.Positive(t, sw.DispatchUS, "%+v", sw)
		require.Positive(t, sw.CombineUS, "%+v", sw)
	}
	best, ok := bestSplit(srep.Sweep)
	require.True(t, ok)
	require.Equal(t, best.Split, srep.Best)
	require.Contains(t, stdout, "SPLIT SWEEP")
	require.Contains(t, stdout, "best split: "+srep.Best)
	for _, bad := range [][]string{{"--split", "1,0,3"}, {"--split", "2,2"}, {"--split", "2,2,2", "--sms", "8"}} {
		code, _, stderr = run(t, append([]string{"internode", "--backend", "host", "--ranks", "4", "--nodes", "2", "--tokens", "4"}, bad...)...)
		require.Equal(t, 1, code, "%v", bad)
		require.Contains(t, stderr, "--split", "%v", bad)
	}

	code, _, stderr = run(t, "internode", "--backend", "host", "--ranks", "4", "--nodes", "3", "--tokens", "4", "--hidden", "128", "--topk", "2", "--experts", "8")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "3 virtual nodes do not divide 4 ranks")
	code, _, stderr = run(t, "launch", "-n", "4", "--nodes", "3", "--", "internode")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "3 virtual nodes do not divide 4 ranks")
}

// On GPUs: 2 virtual nodes of 2 and of 4 ranks spread over the GPUs present
// (several to a GPU when there are fewer), through the Buffer's
// device-pointer path; checks against the reference, then network and
// NVLink GB/s.
func TestInternodeOnGPU(t *testing.T) {
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA GPU: %v", err)
	}
	for _, ranks := range []int{4, 8} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			code, stdout, stderr := run(t, "internode", "--backend", "cuda", "--ranks", fmt.Sprint(ranks), "--nodes", "2",
				"--tokens", "0,128,1024", "--fp8", "--warmup", "5", "--iters", "20")
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, want := range []string{"byte-exact", "combine (BF16 partials) bit-exact", "network GB/s", "port put GB/s", "NVLink GB/s", "internode: all checks passed"} {
				assert.Contains(t, stdout, want)
			}
			t.Logf("\n%s", stdout)
			// The split sweep (each split a checked Buffer of its own).
			code, stdout, stderr = run(t, "internode", "--backend", "cuda", "--ranks", fmt.Sprint(ranks), "--nodes", "2",
				"--tokens", "1024", "--warmup", "5", "--iters", "20", "--sms", "12", "--sweep")
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, want := range []string{"SPLIT SWEEP", "best split: ", "internode: all checks passed"} {
				assert.Contains(t, stdout, want)
			}
			t.Logf("\n%s", stdout)
		})
	}
}

// The proxy trace's timeline bins each stage's bytes by time from the
// issue: puts by when the proxy took them, sends and copy-ins and each
// receiving socket's reads by when they ended.
func TestTraceTimeline(t *testing.T) {
	const us = int64(1000)
	ev := func(stage channels.TraceStage, op channels.TraceOp, role channels.TraceRole, sock int16, start, end, mb int64) channels.TraceEvent {
		return channels.TraceEvent{Start: start * us, End: end * us, Bytes: mb * 1_000_000, Stage: stage, Op: op, Role: role, Socket: sock}
	}
	pt := &channels.ProxyTrace{Events: []channels.TraceEvent{
		ev(channels.StageTrigger, channels.OpPut, channels.RoleProxy, -1, 5, 6, 4),
		ev(channels.StageSend, channels.OpWrite, channels.RoleSender, 0, 10, 150, 2),
		ev(channels.StageCopyIn, channels.OpWrite, channels.RoleReceiver, 1, 250, 260, 3),
		ev(channels.StageRecv, channels.OpWrite, channels.RoleReceiver, 1, 100, 380, 3),
		ev(channels.StageRecv, channels.OpWrite, channels.RoleReceiver, 0, 20, 40, 1),
		ev(channels.StageRecv, channels.OpFlush, channels.RoleReceiver, 2, 20, 40, 0), // no payload: no row
	}}
	got := traceTimeline(pt, 0, 400*us, 4)
	for _, want := range []string{
		"timeline, MB per 100 us bin from the issue:",
		"puts popped    4.0   0.0   0.0   0.0",
		"sent           0.0   2.0   0.0   0.0",
		"copied in      0.0   0.0   3.0   0.0",
		"read sock 0    1.0   0.0   0.0   0.0",
		"read sock 1    0.0   0.0   0.0   3.0",
	} {
		assert.Contains(t, got, want)
	}
	assert.NotContains(t, got, "read sock 2")
}
