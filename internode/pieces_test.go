package internode_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internode"
)

// testPutBytes is the NotifyConfig.PutBytes of checkDispatchRounds,
// checkCombineRounds and checkGraphReplays (0: one put per node and
// block). Set only by tests that run no others in parallel
// (withPutBytes).
var testPutBytes int

// testPutGroups, when set (withPutGroups), is their NotifyConfig.PutGroups;
// unset they take the Buffer's default for the network transport of the
// test, as forward does (putGroup).
var testPutGroups *int

// putGroup is the round helpers' NotifyConfig.PutGroups.
func putGroups() int {
	if testPutGroups != nil {
		return *testPutGroups
	}
	return internode.DefaultPutGroupsOver(envTransport())
}

// envTransport is the network transport the tests' worlds use
// ($GOEP_NET_TRANSPORT; TCP where unset or unknown), which the Buffer's
// defaults follow.
func envTransport() channels.Transport {
	tr, err := channels.ParseTransport(os.Getenv(channels.NetTransportEnv))
	if err != nil {
		return channels.TransportEthernet
	}
	return tr
}

// testReduceUnits, when set (withReduceUnits), is the
// NotifyConfig.ReduceUnits of checkCombineRounds, checkGraphReplays,
// checkDeviceRounds and checkRepeatedRounds; unset they take
// $GOEP_INTERNODE_REDUCE_UNITS, else the Buffer's default for the test's
// transport and emulated rate (reduceUnits).
var testReduceUnits *internode.ReduceUnits

func reduceUnits() internode.ReduceUnits {
	if testReduceUnits != nil {
		return *testReduceUnits
	}
	rate, err := channels.EmulatedGBpsFromEnv()
	if err != nil {
		rate = 0
	}
	u, err := internode.ParseReduceUnits(os.Getenv(internode.ReduceUnitsEnv), internode.DefaultReduceUnitsOver(envTransport(), rate))
	if err != nil {
		return internode.ReduceAfter
	}
	return u
}

func withReduceUnits(t *testing.T, u internode.ReduceUnits) {
	t.Helper()
	prev := testReduceUnits
	testReduceUnits = &u
	t.Cleanup(func() { testReduceUnits = prev })
}

func withPutGroups(t *testing.T, n int) {
	t.Helper()
	prev := testPutGroups
	testPutGroups = &n
	t.Cleanup(func() { testPutGroups = prev })
}

// testProxyPending is their NotifyConfig.ProxyMaxPending, likewise.
var testProxyPending int

// testReduceSMs is the NotifyConfig.ReduceSMs of checkCombineRounds and
// checkDeviceRounds (0: the final reduce on a grid of its own, the
// default), set likewise (withReduceSMs).
var testReduceSMs int

// testSendMemory is the NotifyConfig.SendMemory of checkDispatchRounds,
// checkCombineRounds and checkDeviceRounds (zero: device memory), set likewise
// (withSendMemory).
var testSendMemory internode.SendMemory

func withSendMemory(t *testing.T, m internode.SendMemory) {
	t.Helper()
	prev := testSendMemory
	testSendMemory = m
	t.Cleanup(func() { testSendMemory = prev })
}

func withReduceSMs(t *testing.T, n int) {
	t.Helper()
	prev := testReduceSMs
	testReduceSMs = n
	t.Cleanup(func() { testReduceSMs = prev })
}

// testThreads and testSplit are the NotifyConfig.Threads and Split of
// checkDispatchRounds and checkCombineRounds (zero: the defaults), set
// likewise (withGrid).
var (
	testThreads int
	testSplit   internode.Split
)

// testHidden, when positive, is the hidden size of checkDispatchRounds
// and checkCombineRounds (withHidden).
var testHidden int

func withHidden(t *testing.T, h int) {
	t.Helper()
	prev := testHidden
	testHidden = h
	t.Cleanup(func() { testHidden = prev })
}

// testSplits, when set (withSplits), gives rank r of checkDispatchRounds
// and checkCombineRounds the split testSplits[r % len]: ranks that launch
// different grids.
var testSplits []internode.Split

// splitOf is rank r's NotifyConfig.Split in the round helpers.
func splitOf(r int) internode.Split {
	if len(testSplits) > 0 {
		return testSplits[r%len(testSplits)]
	}
	return testSplit
}

func withSplits(t *testing.T, sp ...internode.Split) {
	t.Helper()
	prev := testSplits
	testSplits = sp
	t.Cleanup(func() { testSplits = prev })
}

// testForward, when set (withForward), is the NotifyConfig.Forward of the
// round helpers; unset they take the Buffer's default for the network
// transport of the test ($GOEP_NET_TRANSPORT: DefaultForwardOver).
var testForward *internode.Forward

// forward is the round helpers' NotifyConfig.Forward.
func forward() internode.Forward {
	if testForward != nil {
		return *testForward
	}
	return internode.DefaultForwardOver(envTransport())
}

func withForward(t *testing.T, f internode.Forward) {
	t.Helper()
	prev := testForward
	testForward = &f
	t.Cleanup(func() { testForward = prev })
}

func withGrid(t *testing.T, threads int, sp internode.Split) {
	t.Helper()
	prevT, prevS := testThreads, testSplit
	testThreads, testSplit = threads, sp
	t.Cleanup(func() { testThreads, testSplit = prevT, prevS })
}

func withPutBytes(t *testing.T, n int) {
	t.Helper()
	prev := testPutBytes
	testPutBytes = n
	t.Cleanup(func() { testPutBytes = prev })
}

func withProxyPending(t *testing.T, n int) {
	t.Helper()
	prev := testProxyPending
	testProxyPending = n
	t.Cleanup(func() { testProxyPending = prev })
}

// ParseProxyPending's forms and refusals.
func TestParseProxyPending(t *testing.T) {
	for in, want := range map[string]int{"": 0, "0": 0, " 1 ": 1, "4096": 4096, "1048576": internode.MaxProxyPending} {
		got, err := internode.ParseProxyPending(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"-1", "1048577", "1k", "x", "2.5"} {
		_, err := internode.ParseProxyPending(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), bad)
	}
}

// The proxy's MaxPending at its two extremes under pieces of one row:
// dispatch and combine still equal the reference. The cross-node
// connections here are TCP, which the proxy no longer flushes for flow
// control at all (channels' TestProxyNoFlowControlFlushOnTCP checks that),
// so this checks that the knob reaches the proxy and changes no result.
func TestEmulatedProxyPending(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, n := range []int{1, internode.MaxProxyPending} {
		t.Run(fmt.Sprintf("pending=%d", n), func(t *testing.T) {
			withPutBytes(t, 1)
			withProxyPending(t, n)
			checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 2900+int64(n%97))
			checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 3000+int64(n%97))
		})
	}
}

// ParseReduceSMs's forms and refusals.
func TestParseReduceSMs(t *testing.T) {
	for in, want := range map[string]int{"": 0, "0": 0, "off": -1, " -1 ": -1, "132": 132, "4096": internode.MaxReduceSMs} {
		got, err := internode.ParseReduceSMs(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"-2", "4097", "1k", "x", "on"} {
		_, err := internode.ParseReduceSMs(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), bad)
	}
}

// The combine's final reduce inside the combine kernel (ReduceSMs -1, the
// SM budget strictly) and on one block of its own: combine rounds equal
// the reference bit for bit either way (the default, a grid of its own as
// wide as the combine's, is what every other combine test runs).
func TestEmulatedReduceSMs(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, n := range []int{-1, 1} {
		t.Run(fmt.Sprintf("reduce-sms=%d", n), func(t *testing.T) {
			withReduceSMs(t, n)
			checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 3100+int64(n))
		})
	}
}

// ParsePutBytes's forms and refusals, and NewNotify's bound.
func TestParseSendMemory(t *testing.T) {
	for in, want := range map[string]internode.SendMemory{"": internode.SendDevice, " device": internode.SendDevice,
		"HOST ": internode.SendHost} {
		got, err := internode.ParseSendMemory(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		if in != "" {
			require.Equal(t, strings.ToLower(strings.TrimSpace(in)), got.String())
		}
	}
	for _, bad := range []string{"gpu", "1", "hostx", "auto"} {
		_, err := internode.ParseSendMemory(bad)
		require.ErrorContains(t, err, "want device or host", bad)
	}
}

// MemoryFor: the regions NewNotify allocates, by shape and config; sizes
// grow with the tokens, the send memory moves between device and host
// memory, one node has no send memory, MaxTokens 0 no dispatch regions
// and no kernel tables, each kept layout adds the notify output; bad
// shapes and sizes are refused.
func TestMemoryFor(t *testing.T) {
	s := internode.Shape{Topology: internode.Topology{Nodes: 2, RanksPerNode: 2}, Hidden: 256, TopK: 4, Experts: 8}
	small, err := internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 10})
	require.NoError(t, err)
	big, err := internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 20})
	require.NoError(t, err)
	for _, m := range []internode.Memory{small, big} {
		require.Positive(t, m.RDMA)
		require.Positive(t, m.NVLink)
		require.Positive(t, m.Send)
		require.Positive(t, m.Kernels)
		require.False(t, m.SendHost)
		require.Equal(t, m.RDMA+m.NVLink+m.Send+m.Kernels, m.Device())
		require.Zero(t, m.HostMapped())
	}
	require.Greater(t, big.RDMA, small.RDMA)
	require.Greater(t, big.Send, small.Send)
	// Twice the tokens, twice the rows: 2 nodes x 20 more rows of BF16
	// relay rows (2H + 12K + 8 + 4P = 576) and fp32 partials (4H + 4K = 1040).
	require.Equal(t, 2*10*(576+1040), big.Send-small.Send)
	// Kept layouts: the notify kernel's output per layout, 2 + W + N + E +
	// W + N + N*P + LE + W = 32 int32 here (128 bytes, 16-aligned); 0
	// means 1.
	one1, err := internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 10, Layouts: 1})
	require.NoError(t, err)
	require.Equal(t, small, one1)
	kept, err := internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 10, Layouts: 5})
	require.NoError(t, err)
	require.Equal(t, 4*128, kept.Kernels-small.Kernels)
	for _, bad := range []int{-1, internode.MaxLayouts + 1} {
		_, err = internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 10, Layouts: bad})
		require.ErrorContains(t, err, fmt.Sprintf("layouts %d", bad))
	}
	host, err := internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 10, SendMemory: internode.SendHost})
	require.NoError(t, err)
	require.True(t, host.SendHost)
	require.Equal(t, small.Send, host.HostMapped())
	require.Equal(t, small.Device()-small.Send, host.Device())
	none, err := internode.MemoryFor(s, internode.NotifyConfig{})
	require.NoError(t, err)
	require.Zero(t, none.Send)
	require.Zero(t, none.Kernels)
	require.Less(t, none.RDMA, small.RDMA)
	one := s
	one.Topology = internode.Topology{Nodes: 1, RanksPerNode: 4}
	m1, err := internode.MemoryFor(one, internode.NotifyConfig{MaxTokens: 10})
	require.NoError(t, err)
	require.Zero(t, m1.Send)
	_, err = internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: -1})
	require.Error(t, err)
	_, err = internode.MemoryFor(internode.Shape{}, internode.NotifyConfig{})
	require.Error(t, err)
	_, err = internode.MemoryFor(s, internode.NotifyConfig{MaxTokens: 1 << 40})
	require.Error(t, err)
}

func TestParsePutBytes(t *testing.T) {
	for in, want := range map[string]int{"": internode.DefaultPutBytes, "0": 0, " 4096 ": 4096, "256k": 256 << 10, "1M": 1 << 20, "1024m": internode.MaxPutBytes} {
		got, err := internode.ParsePutBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"-1", "1g", "k", "1.5m", "1025m", "1073741825", "x"} {
		_, err := internode.ParsePutBytes(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), bad)
	}
}

// Puts in pieces (the kernels' NotifyConfig.PutBytes): with 1 byte every
// sender block puts each token's rows (or each partial row) on its own,
// up to 16 pieces a block, the rest in the last pieces; the rows pushed
// piece by piece, interleaved with the packing and reducing of the next,
// must land exactly as one put per block did: dispatch (2 x 2, 4 rounds of
// formats) and combine (2 x 4, bit for bit) against the reference, and the
// graph-shaped sequence with cached and route-only dispatches (2 x 2, one
// sender block: every piece of the run, and 1000 bytes: pieces of several
// rows).
func TestEmulatedPutPieces(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	t.Run("dispatch", func(t *testing.T) {
		withPutBytes(t, 1)
		checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 2300)
	})
	t.Run("combine", func(t *testing.T) {
		withPutBytes(t, 1)
		checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 2500)
	})
	for _, n := range []int{1, 1000} {
		t.Run(fmt.Sprintf("graph/put=%d", n), func(t *testing.T) {
			withPutBytes(t, n)
			checkGraphReplays(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 2700+int64(n), 4,
				internode.Split{Senders: 1, Forwarders: 1, Receivers: 1})
		})
	}
}

// The dispatch packs a sender block's chunk a tile of block-size tokens at
// a time (rows and slots ranked by warp ballots, running counts carried
// from tile to tile). One sender block of 32 threads makes every rank's
// run (up to 39 tokens) two tiles, 64 threads one tile of two warps;
// pieces of 1000 and 4000 bytes (about ten rows a piece) cut them again:
// rows, slots and piece bounds must still match the reference's order.
func TestEmulatedPackTiles(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	for _, threads := range []int{32, 64} {
		for _, n := range []int{0, 1000, 4000} {
			t.Run(fmt.Sprintf("threads=%d/put=%d", threads, n), func(t *testing.T) {
				withGrid(t, threads, internode.Split{Senders: 1, Forwarders: 1, Receivers: 1})
				withPutBytes(t, n)
				seed := int64(3100 + threads + n)
				checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, seed)
				checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, seed+1)
			})
		}
	}
}

// Wide rows: hidden 2176 (17 x 128) takes the row copies' four-loads
// loop and its remainder (272 16-byte words a BF16 row) and the
// forwarders' two-groups reduce with and without its second group, on 2 x
// 2 and 2 x 4 ranks: dispatch byte for byte, combine bit for bit.
func TestEmulatedWideRows(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	withHidden(t, 2176)
	checkDispatchRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 2}, 3500)
	checkCombineRounds(t, emuBackend, internode.Topology{Nodes: 2, RanksPerNode: 4}, 3600)
}

// The same on the GPUs present.
func TestPackTilesGPU(t *testing.T) {
	skipNoGPU(t)
	withGrid(t, 32, internode.Split{Senders: 1, Forwarders: 1, Receivers: 1})
	for _, n := range []int{0, 1000, 4000} {
		for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
			t.Run(fmt.Sprintf("%v/put=%d", topo, n), func(t *testing.T) {
				withPutBytes(t, n)
				checkDispatchRounds(t, cudaBackend, topo, 3300+int64(n))
				checkCombineRounds(t, cudaBackend, topo, 3400+int64(n))
			})
		}
	}
}

// The same on the GPUs present.
func TestWideRowsGPU(t *testing.T) {
	skipNoGPU(t)
	withHidden(t, 2176)
	for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
		t.Run(topo.String(), func(t *testing.T) {
			checkDispatchRounds(t, cudaBackend, topo, 3700)
			checkCombineRounds(t, cudaBackend, topo, 3800)
		})
	}
}

// The same on the GPUs present: 2 x 2 and 2 x 4 ranks, pieces of 1 byte
// (every row its own put) and 64 KiB.
func TestPutPiecesGPU(t *testing.T) {
	skipNoGPU(t)
	for _, n := range []int{1, 64 << 10} {
		for _, topo := range []internode.Topology{{Nodes: 2, RanksPerNode: 2}, {Nodes: 2, RanksPerNode: 4}} {
			t.Run(fmt.Sprintf("%v/put=%d", topo, n), func(t *testing.T) {
				withPutBytes(t, n)
				checkDispatchRounds(t, cudaBackend, topo, 2400+int64(n))
				checkCombineRounds(t, cudaBackend, topo, 2600+int64(n))
				checkGraphReplays(t, cudaBackend, topo, 2800+int64(n), 20, internode.Split{Shared: true})
			})
		}
	}
}

// The Buffer's put size when $GOEP_INTERNODE_PUT_BYTES is unset: 1 MiB
// pieces over TCP (and the verbs transport to come), one put per node and
// block over the port over CUDA IPC.
func TestDefaultPutBytesOver(t *testing.T) {
	require.Equal(t, internode.DefaultPutBytes, internode.DefaultPutBytesOver(channels.TransportEthernet, 0))
	require.Equal(t, internode.DefaultPutBytes, internode.DefaultPutBytesOver(channels.TransportIB, 0))
	require.Zero(t, internode.DefaultPutBytesOver(channels.TransportCudaIPC, 0))
	// A line rate emulated over the port: pieces, as over a network.
	require.Equal(t, internode.DefaultPutBytes, internode.DefaultPutBytesOver(channels.TransportCudaIPC, 50))
	require.Equal(t, internode.DefaultPutBytes, internode.DefaultPutBytesOver(channels.TransportEthernet, 10))
}

func TestDefaultForwardOver(t *testing.T) {
	require.Equal(t, internode.ForwardNodes, internode.DefaultForwardOver(channels.TransportEthernet))
	require.Equal(t, internode.ForwardNodes, internode.DefaultForwardOver(channels.TransportIB))
	require.Equal(t, internode.ForwardAuto, internode.DefaultForwardOver(channels.TransportCudaIPC))
}

func TestParsePutGroups(t *testing.T) {
	for in, want := range map[string]int{"": 7, "0": 0, " 1 ": 1, "4": 4, "1024": internode.MaxPutGroups} {
		got, err := internode.ParsePutGroups(in, 7)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"-1", "1025", "two", "4k"} {
		_, err := internode.ParsePutGroups(bad, 1)
		require.ErrorContains(t, err, "want a put count in 0..1024", bad)
	}
}

// runPutGroupCases: five sender blocks in 3 puts a node (groups of 2, 2,
// 1), 2 (3, 2) and 1 (all five), forwarding by units (a group is one
// unit) and by node counters, on 2 x 2, 2 x 4 and 3 x 2 ranks, the
// combine's seven reducer blocks grouped likewise (3, 3, 1; 4, 3; 7); one
// case with ranks of different sender counts (groups differ from rank to
// rank); the graph-shaped sequence.
func runPutGroupCases(t *testing.T, b backend, seed int64) {
	split := internode.Split{Senders: 5, Forwarders: 2, Receivers: 1}
	for _, c := range []struct {
		puts int
		fwd  internode.Forward
		topo internode.Topology
	}{
		{3, internode.ForwardBlocks, internode.Topology{Nodes: 2, RanksPerNode: 2}},
		{2, internode.ForwardBlocks, internode.Topology{Nodes: 2, RanksPerNode: 4}},
		{1, internode.ForwardBlocks, internode.Topology{Nodes: 2, RanksPerNode: 2}},
		{3, internode.ForwardNodes, internode.Topology{Nodes: 2, RanksPerNode: 2}},
		{3, internode.ForwardBlocks, internode.Topology{Nodes: 3, RanksPerNode: 2}},
	} {
		t.Run(fmt.Sprintf("%v/puts=%d/%v", c.topo, c.puts, c.fwd), func(t *testing.T) {
			withGrid(t, 0, split)
			withPutGroups(t, c.puts)
			withForward(t, c.fwd)
			checkDispatchRounds(t, b, c.topo, seed+int64(c.puts))
			if c.fwd == internode.ForwardBlocks {
				checkCombineRounds(t, b, c.topo, seed+100+int64(c.puts))
			}
		})
	}
	t.Run("mixed-grids", func(t *testing.T) {
		withSplits(t, split, internode.Split{Senders: 3, Forwarders: 1, Receivers: 1})
		withPutGroups(t, 2)
		withForward(t, internode.ForwardBlocks)
		checkDispatchRounds(t, b, internode.Topology{Nodes: 2, RanksPerNode: 2}, seed+200)
	})
	// The graph-shaped sequence (cached and route-only dispatches, combines;
	// the group counters are cleared by the launch's own memset node).
	t.Run("graph", func(t *testing.T) {
		withPutGroups(t, 2)
		withForward(t, internode.ForwardBlocks)
		replays := 4
		if b == cudaBackend {
			replays = 20
		}
		checkGraphReplays(t, b, internode.Topology{Nodes: 2, RanksPerNode: 2}, seed+300, replays, split)
	})
}

// Put groups (NotifyConfig.PutGroups) in the CPU emulation: dispatch byte
// for byte and combine bit for bit against the reference.
func TestEmulatedPutGroups(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	runPutGroupCases(t, emuBackend, 5100)
}

// The same on the GPUs present.
func TestPutGroupsGPU(t *testing.T) {
	skipNoGPU(t)
	runPutGroupCases(t, cudaBackend, 5300)
}

func TestDefaultPutGroupsOver(t *testing.T) {
	require.Zero(t, internode.DefaultPutGroupsOver(channels.TransportEthernet))
	require.Zero(t, internode.DefaultPutGroupsOver(channels.TransportIB))
	require.Equal(t, internode.PortPutGroups, internode.DefaultPutGroupsOver(channels.TransportCudaIPC))
}
