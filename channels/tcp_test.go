package channels_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/channels/channeltest"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// The TCP network transport: goroutine ranks split into virtual nodes (every
// cross-node pair then talks over loopback TCP, never host memory or CUDA
// IPC), processes of the host backend (each its own node), the existing
// port-channel checks over it, a peer that resets, the verbs refusal and the
// topology.

// tcpNet is the network config of the tests: every rank its own node,
// three sockets and small chunks so writes stripe over sockets.
func tcpNet(ranks int) channels.NetworkConfig {
	return channels.NetworkConfig{VirtualNodes: ranks, Sockets: 3, ChunkBytes: 16 << 10}
}

// runRanksNet is runRanks with a network config.
func runRanksNet(t *testing.T, w world, nc channels.NetworkConfig, maxBytes int, fn func(ctx context.Context, r *channeltest.Rank) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	errs := channeltest.RunRanks(ctx, w.kind, w.ranks, bootstrap.Config{Timeout: time.Minute},
		channels.Config{Timeouts: channels.Timeouts{Wait: testWait}, Network: nc}, channeltest.LayoutFor(maxBytes), fn)
	for r, err := range errs {
		assert.NoError(t, err, "%s rank %d", w, r)
	}
}

// tcpWorlds: 2 and 4 host-backend ranks, and on GPUs 2 ranks and one per
// GPU (ranks share a GPU when there is one).
func tcpWorlds(t *testing.T) []world {
	out := []world{{device.Host, 2}, {device.Host, 4}}
	n, err := device.CUDADeviceCount()
	if err != nil || n == 0 {
		return out
	}
	out = append(out, world{device.CUDA, 2})
	if n > 2 {
		out = append(out, world{device.CUDA, min(n, 8)})
	}
	return out
}

// The port-channel checks (ordered byte-exact puts with signals and
// flushes; concurrent atomic adds summing exactly) with every pair of ranks
// on different virtual nodes: port channels over TCP. The staged variant
// runs the host backend through the pinned-buffer pipeline GPUs use.
func TestTCPPortChannels(t *testing.T) {
	for _, stage := range []bool{false, true} {
		for _, w := range tcpWorlds(t) {
			if stage && w.gpu() {
				continue // GPUs always stage
			}
			name := w.String()
			if stage {
				name += "-staged"
			}
			t.Run(name, func(t *testing.T) {
				if stage {
					t.Setenv("GOEP_TCP_STAGE", "always")
				}
				rounds, adds, grid, maxBytes := 200, 3000, 1, 64<<10
				if testing.Short() {
					rounds, adds = 50, 500
				}
				if w.gpu() {
					rounds, adds, grid, maxBytes = 20_000, 20_000, 4, 1<<20
				}
				runRanksNet(t, w, tcpNet(w.ranks), maxBytes, func(ctx context.Context, r *channeltest.Rank) error {
					topo, err := r.Comm.Topology(ctx)
					if err != nil {
						return err
					}
					if topo.Nodes != w.ranks {
						return fmt.Errorf("%d nodes, want %d", topo.Nodes, w.ranks)
					}
					if err := r.EnsurePort(ctx); err != nil {
						return err
					}
					for _, conn := range r.PortMesh.Connections {
						if conn.Transport() != channels.TransportEthernet {
							return fmt.Errorf("port channel to rank %d over %s, want tcp", conn.RemoteRank(), conn.Transport())
						}
					}
					if err := r.CheckPortStream(ctx, seed, rounds, maxBytes); err != nil {
						return err
					}
					return r.CheckPortAtomics(ctx, seed, adds, grid)
				})
			})
		}
	}
}

// tcpLayout is the memory of the random-operations check, per rank:
//
//	data   [0, tcpData)                 random writes land here
//	log    [tcpData, +tcpLogSlots*16)   append-only records
//	words  then 3 words: update U, counter C1 (+1 per record), counter C2
//
// The source buffer holds the data pattern and every record.
const (
	tcpData     = 256 << 10
	tcpLogSlots = 1 << 15
	tcpLog      = tcpData
	tcpWords    = tcpLog + tcpLogSlots*16
	tcpBufBytes = tcpWords + 64
)

// tcpOp is one operation of the random sequence.
type tcpOp struct {
	kind           int // 0 write, 1 record (write + update U + add C1), 2 add C2, 3 flush
	srcOff, dstOff int
	size           int
	value          uint64
}

// tcpPlan draws the sequence sender -> receiver uses; both sides draw it.
func tcpPlan(seed uint64, sender, ops int) []tcpOp {
	rng := rand.New(rand.NewPCG(seed, uint64(sender)))
	out := make([]tcpOp, 0, ops)
	records := 0
	for len(out) < ops {
		x := rng.IntN(100)
		switch {
		case x < 50:
			n := rng.IntN(2048) + 1
			if rng.IntN(50) == 0 {
				n = rng.IntN(tcpData/2) + 1 // several chunks, over several sockets
			}
			out = append(out, tcpOp{kind: 0, size: n, srcOff: rng.IntN(tcpData - n + 1), dstOff: rng.IntN(tcpData - n + 1)})
		case x < 75 && records < tcpLogSlots:
			out = append(out, tcpOp{kind: 1, dstOff: records})
			records++
		case x < 97:
			out = append(out, tcpOp{kind: 2, value: rng.Uint64()})
		default:
			out = append(out, tcpOp{kind: 3})
		}
	}
	return out
}

// tcpPattern is sender's source data; tcpRecord the 16 bytes of its record j.
func tcpPattern(seed uint64, sender int) []byte {
	rng := rand.New(rand.NewPCG(seed^0x5eed, uint64(sender)))
	b := make([]byte, tcpData)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b
}

func tcpRecord(sender, j int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(j)<<8|uint64(sender))
	return binary.LittleEndian.AppendUint64(b, ^(uint64(j)*0x9e3779b97f4a7c15 + uint64(sender)))
}

// checkTCPRandomOps: every rank sends ops random operations to the next
// rank over one connection while the previous rank sends to it, then
// checks its memory byte-exact against a model of the sequence, and, on
// the host backend, watches while they arrive that no update of U nor add
// to C1 is seen before the records written ahead of it. Every other write
// comes from a copy of the pattern in host memory (RegisterHostMemory),
// which goes on the wire without staging, interleaved on the same sockets
// with staged writes from device memory. Collective; every peer must be on
// another node.
func checkTCPRandomOps(ctx context.Context, c *channels.Communicator, seed uint64, ops int) (err error) {
	me, n := c.Rank(), c.Size()
	to, from := (me+1)%n, (me+n-1)%n
	dev := c.Device()
	host := dev.Info().Kind == device.Host
	buf, err := dev.Alloc(tcpBufBytes)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Free(buf)) }()
	srcBuf, err := dev.Alloc(tcpData + tcpLogSlots*16)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Free(srcBuf)) }()
	if err := dev.CopyIn(buf.Ptr, make([]byte, tcpBufBytes)); err != nil {
		return err
	}
	src := append(tcpPattern(seed, me), make([]byte, tcpLogSlots*16)...)
	for j := 0; j < tcpLogSlots; j++ {
		copy(src[tcpData+16*j:], tcpRecord(me, j))
	}
	if err := dev.CopyIn(srcBuf.Ptr, src); err != nil {
		return err
	}
	mem, err := c.RegisterMemory(buf)
	if err != nil {
		return err
	}
	srcMem, err := c.RegisterMemory(srcBuf)
	if err != nil {
		return err
	}
	hostSrc, err := dev.AllocHostMapped(tcpData)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.FreeHostMapped(hostSrc)) }()
	copy(hostSrc.Host, src[:tcpData])
	hostMem, err := c.RegisterHostMemory(hostSrc)
	if err != nil {
		return err
	}
	if !hostMem.IsHost() || srcMem.IsHost() {
		return fmt.Errorf("rank %d: IsHost is %v for host memory and %v for device memory", me, hostMem.IsHost(), srcMem.IsHost())
	}
	if _, err := hostMem.MarshalBinary(); err == nil || !strings.Contains(err.Error(), "peers cannot map it") {
		return fmt.Errorf("rank %d: serialising host memory for a peer: %v, want a refusal", me, err)
	}
	defer func() { err = errors.Join(err, c.DeregisterMemory(hostMem)) }()
	const tag = 77
	remote, err := c.ExchangeMemory(ctx, mem, []int{to, from}, tag)
	if err != nil {
		return err
	}
	if remote[0].Mapped() {
		return fmt.Errorf("rank %d: rank %d's memory is mapped, want it reachable only over the network", me, to)
	}
	conns, err := c.ConnectAll(ctx, []int{to, from}, tag)
	if err != nil {
		return err
	}
	out := conns[0]
	if out.Transport() != channels.TransportEthernet {
		return fmt.Errorf("rank %d: connection to rank %d is %s, want tcp", me, to, out.Transport())
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}

	// The receiver's expectations, from the previous rank's sequence.
	theirs := tcpPlan(seed, from, ops)
	records := 0
	for _, op := range theirs {
		if op.kind == 1 {
			records++
		}
	}
	watch := make(chan error, 1)
	if host {
		go func() { watch <- watchTCPOrder(ctx, buf.Ptr, from, records) }()
	} else {
		watch <- nil
	}

	// Send.
	dst := remote[0]
	for i, op := range tcpPlan(seed, me, ops) {
		var err error
		switch op.kind {
		case 0:
			from := srcMem
			if i%2 == 1 {
				from = hostMem
			}
			err = out.Write(dst, op.dstOff, from, op.srcOff, op.size)
		case 1:
			if err = out.Write(dst, tcpLog+16*op.dstOff, srcMem, tcpData+16*op.dstOff, 16); err == nil {
				if err = out.UpdateAndSync(dst, tcpWords, uint64(op.dstOff+1)); err == nil {
					err = out.AtomicAdd(dst, tcpWords+8, 1)
				}
			}
		case 2:
			err = out.AtomicAdd(dst, tcpWords+16, op.value)
		case 3:
			err = out.Flush()
		}
		if err != nil {
			return fmt.Errorf("rank %d: op %d (%+v): %w", me, i, op, err)
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	if err := <-watch; err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}

	// Check what the previous rank sent, against the model.
	model := make([]byte, tcpBufBytes)
	pat := tcpPattern(seed, from)
	var c2 uint64
	u := 0
	for _, op := range theirs {
		switch op.kind {
		case 0:
			copy(model[op.dstOff:op.dstOff+op.size], pat[op.srcOff:op.srcOff+op.size])
		case 1:
			copy(model[tcpLog+16*op.dstOff:], tcpRecord(from, op.dstOff))
			u = op.dstOff + 1
		case 2:
			c2 += op.value
		}
	}
	binary.LittleEndian.PutUint64(model[tcpWords:], uint64(u))
	binary.LittleEndian.PutUint64(model[tcpWords+8:], uint64(records))
	binary.LittleEndian.PutUint64(model[tcpWords+16:], c2)
	got := make([]byte, tcpBufBytes)
	if err := dev.CopyOut(got, buf.Ptr); err != nil {
		return err
	}
	for i := range model {
		if got[i] != model[i] {
			return fmt.Errorf("rank %d: byte %d from rank %d is %#02x, want %#02x (%d operations)", me, i, from, got[i], model[i], ops)
		}
	}
	return c.Barrier(ctx)
}

// watchTCPOrder polls U and C1 while the records arrive: whatever value
// it reads, every record below it must already be complete.
func watchTCPOrder(ctx context.Context, base uintptr, sender, records int) error {
	checked := 0
	complete := func(upto int) error {
		for ; checked < upto; checked++ {
			want := tcpRecord(sender, checked)
			got := devapi.Bytes(base+uintptr(tcpLog+16*checked), 16)
			if string(got) != string(want) {
				return fmt.Errorf("record %d from rank %d is %x after the counter said %d: a signal overtook its data", checked, sender, got, upto)
			}
		}
		return nil
	}
	for {
		u := int(devapi.U64(base + tcpWords).Load())
		c1 := int(devapi.U64(base + tcpWords + 8).Load())
		if err := complete(max(u, c1)); err != nil {
			return err
		}
		if c1 >= records {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("watching records from rank %d: %d of %d arrived: %w", sender, c1, records, ctx.Err())
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func tcpOpsCount() int {
	if testing.Short() {
		return 10_000
	}
	return 100_000
}

// 100,000 random writes (1 B to 128 KiB, overlapping), updates, atomic adds
// and flushes per rank, between goroutine ranks on virtual nodes: byte-exact
// and in order.
func TestTCPRandomOps(t *testing.T) {
	for _, w := range tcpWorlds(t) {
		t.Run(w.String(), func(t *testing.T) {
			ops := tcpOpsCount()
			if w.ranks > 2 && !w.gpu() {
				ops /= 2
			}
			runRaw(t, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
				c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: testWait}, Network: tcpNet(w.ranks)})
				if err != nil {
					return err
				}
				err = checkTCPRandomOps(ctx, c, seed, ops)
				return errors.Join(err, c.Close())
			})
		})
	}
}

// The same between two processes of the host backend on loopback (each
// process is its own node): this test is rank 0, a child process running
// TestTCPProcessHelper is rank 1.
func TestTCPBetweenProcesses(t *testing.T) {
	if os.Getenv("GOEP_TCP_HELPER") != "" {
		t.Skip("helper")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	uid := bootstrap.NewUniqueID()
	ops := tcpOpsCount()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTCPProcessHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GOEP_TCP_HELPER="+strings.Join([]string{addr, uid, strconv.Itoa(ops)}, ","))
	var outBuf strings.Builder
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	require.NoError(t, cmd.Start())
	err = tcpProcessRank(ctx, 0, addr, uid, ops)
	werr := cmd.Wait()
	require.NoError(t, err, "rank 0; rank 1 said:\n%s", outBuf.String())
	require.NoError(t, werr, "rank 1:\n%s", outBuf.String())
}

func TestTCPProcessHelper(t *testing.T) {
	v := os.Getenv("GOEP_TCP_HELPER")
	if v == "" {
		t.Skip("run by TestTCPBetweenProcesses")
	}
	parts := strings.Split(v, ",")
	require.Len(t, parts, 3)
	ops, err := strconv.Atoi(parts[2])
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	require.NoError(t, tcpProcessRank(ctx, 1, parts[0], parts[1], ops))
}

func tcpProcessRank(ctx context.Context, rank int, addr, uid string, ops int) (err error) {
	bs, err := bootstrap.Connect(ctx, bootstrap.Config{Rank: rank, Size: 2, RootAddr: addr, UniqueID: uid, Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, bs.Close()) }()
	dev := device.OpenHost(rank)
	defer func() { err = errors.Join(err, dev.Close()) }()
	c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: testWait},
		Network: channels.NetworkConfig{Sockets: 2, ChunkBytes: 64 << 10}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	topo, err := c.Topology(ctx)
	if err != nil {
		return err
	}
	if topo.Nodes != 2 {
		return fmt.Errorf("rank %d: %d nodes, want 2 (one per process)", rank, topo.Nodes)
	}
	return checkTCPRandomOps(ctx, c, seed, ops)
}

// A peer that resets its sockets (as a dying process's kernel does) is an
// error naming it on the other side, at once: the sender's next flush
// fails, and the receiving side breaks the communicator (so device waits on
// the dead peer's signals end) — never a hang.
func TestTCPPeerReset(t *testing.T) {
	runRaw(t, world{device.Host, 2}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: time.Minute}, Network: tcpNet(2)})
		if err != nil {
			return err
		}
		defer c.Close()
		me := c.Rank()
		buf, err := dev.Alloc(1 << 16)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		mem, err := c.RegisterMemory(buf)
		if err != nil {
			return err
		}
		peer := 1 - me
		remote, err := c.ExchangeMemory(ctx, mem, []int{peer}, 5)
		if err != nil {
			return err
		}
		conn, err := c.Connect(ctx, peer, 5)
		if err != nil {
			return err
		}
		if err := conn.Write(remote[0], 0, mem, 0, 4096); err != nil {
			return err
		}
		if err := conn.Flush(); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if me == 1 {
			return channels.ResetTCPForTest(conn)
		}
		start := time.Now()
		var ferr error
		for time.Since(start) < 20*time.Second {
			if ferr = conn.Write(remote[0], 0, mem, 0, 4096); ferr == nil {
				ferr = conn.Flush()
			}
			if ferr != nil {
				break
			}
		}
		if ferr == nil || !strings.Contains(ferr.Error(), "rank 1") {
			return fmt.Errorf("after the peer's reset: %v, want an error naming rank 1", ferr)
		}
		// The receiving side saw it too and broke the communicator.
		for time.Since(start) < 20*time.Second && c.Check() == nil {
			time.Sleep(time.Millisecond)
		}
		if cerr := c.Check(); cerr == nil || !strings.Contains(cerr.Error(), "rank 1") {
			return fmt.Errorf("communicator after the peer's reset: %v, want broken naming rank 1", cerr)
		}
		return nil
	})
}

// IB verbs is refused, clearly, from Config and from the environment.
func TestTCPVerbsRefused(t *testing.T) {
	bss, err := bootstrap.NewInProcess(1, bootstrap.Config{})
	require.NoError(t, err)
	defer bss[0].Close()
	dev := device.OpenHost(0)
	defer dev.Close()
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{Network: channels.NetworkConfig{Transport: channels.TransportIB}})
	require.ErrorIs(t, err, channels.ErrTransportNotBuilt)
	require.ErrorContains(t, err, "verbs")
	require.ErrorContains(t, err, "not built")
	t.Setenv(channels.NetTransportEnv, "ib")
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{})
	require.ErrorIs(t, err, channels.ErrTransportNotBuilt)
	t.Setenv(channels.NetTransportEnv, "carrier-pigeon")
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{})
	require.ErrorContains(t, err, "carrier-pigeon")
	t.Setenv(channels.NetTransportEnv, "tcp")
	c, err := channels.NewCommunicator(bss[0], dev, channels.Config{})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// Virtual nodes: k must divide the ranks; ranks must agree (the error names
// the field and the ranks); the topology is k nodes of consecutive ranks,
// connections inside a node stay on host memory and cross-node ones go
// over TCP.
func TestTopologyVirtualNodes(t *testing.T) {
	bss, err := bootstrap.NewInProcess(4, bootstrap.Config{})
	require.NoError(t, err)
	dev := device.OpenHost(0)
	defer dev.Close()
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{Network: channels.NetworkConfig{VirtualNodes: 3}})
	require.ErrorContains(t, err, "VirtualNodes 3 does not divide the 4 ranks")
	t.Setenv(channels.VirtualNodesEnv, "-1")
	_, err = channels.NewCommunicator(bss[0], dev, channels.Config{})
	require.ErrorContains(t, err, "negative")
	t.Setenv(channels.VirtualNodesEnv, "")
	for _, b := range bss {
		b.Close()
	}

	runRaw(t, world{device.Host, 4}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Network: channels.NetworkConfig{VirtualNodes: 2}})
		if err != nil {
			return err
		}
		defer c.Close()
		topo, err := c.Topology(ctx)
		if err != nil {
			return err
		}
		if fmt.Sprint(topo.NodeOf) != "[0 0 1 1]" || topo.Nodes != 2 || topo.RanksPerNode() != 2 || !topo.SameNode(2, 3) || topo.SameNode(1, 2) {
			return fmt.Errorf("topology %+v, want nodes [0 0 1 1]", topo)
		}
		var peers []int
		for p := range c.Size() {
			if p != c.Rank() {
				peers = append(peers, p)
			}
		}
		conns, err := c.ConnectAll(ctx, peers, 3)
		if err != nil {
			return err
		}
		for _, conn := range conns {
			want := channels.TransportHostMemory
			if !topo.SameNode(c.Rank(), conn.RemoteRank()) {
				want = channels.TransportEthernet
			}
			if conn.Transport() != want {
				return fmt.Errorf("rank %d to %d over %s, want %s", c.Rank(), conn.RemoteRank(), conn.Transport(), want)
			}
		}
		return c.Barrier(ctx)
	})

	// Ranks that disagree are named, with the field.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := channeltest.RunLocal(ctx, device.Host, 4, bootstrap.Config{Timeout: time.Minute}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		k := 2
		if bs.Rank() == 3 {
			k = 4
		}
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Network: channels.NetworkConfig{VirtualNodes: k}})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Topology(ctx)
		return err
	})
	for r, err := range errs {
		require.ErrorContains(t, err, "Network.VirtualNodes differs between ranks: 2 on ranks [0 1 2], 4 on ranks [3]", "rank %d", r)
	}
}

// A write into memory its owner deregistered (what a Notify does before it
// frees) is refused: the owner's communicator breaks with an error naming
// the memory's key, and the deregistered bytes, poisoned with a random
// pattern, are untouched. A write before the deregistration lands (the
// check can tell the two apart).
func TestTCPWriteAfterDeregister(t *testing.T) {
	runRaw(t, world{device.Host, 2}, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: time.Minute}, Network: tcpNet(2)})
		if err != nil {
			return err
		}
		defer c.Close()
		me, peer := c.Rank(), 1-c.Rank()
		const n = 40 << 10 // three chunks
		buf, err := dev.Alloc(n)
		if err != nil {
			return err
		}
		defer dev.Free(buf)
		fill := func(seed uint64, b []byte) {
			rng := rand.New(rand.NewPCG(seed, 7))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
		}
		src := make([]byte, n)
		fill(uint64(91+me), src)
		if err := dev.CopyIn(buf.Ptr, src); err != nil {
			return err
		}
		mem, err := c.RegisterMemory(buf)
		if err != nil {
			return err
		}
		remote, err := c.ExchangeMemory(ctx, mem, []int{peer}, 5)
		if err != nil {
			return err
		}
		conn, err := c.Connect(ctx, peer, 5)
		if err != nil {
			return err
		}
		peerSrc := make([]byte, n)
		fill(uint64(91+peer), peerSrc)
		if me == 0 { // before: lands
			if err := conn.Write(remote[0], 0, mem, 0, n/2); err != nil {
				return err
			}
			if err := conn.Flush(); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if me == 1 {
			got := make([]byte, n)
			if err := dev.CopyOut(got, buf.Ptr); err != nil {
				return err
			}
			if !bytes.Equal(got[:n/2], peerSrc[:n/2]) || !bytes.Equal(got[n/2:], src[n/2:]) {
				return fmt.Errorf("rank 1: the write before the deregistration did not land as sent")
			}
			if err := c.DeregisterMemory(mem); err != nil {
				return err
			}
			if err := c.DeregisterMemory(mem); err != nil {
				return fmt.Errorf("second deregistration: %w", err)
			}
			// Poison what rank 0 writes next.
			poison := make([]byte, n)
			fill(1234, poison)
			if err := dev.CopyIn(buf.Ptr, poison); err != nil {
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			start := time.Now()
			for time.Since(start) < 20*time.Second && c.Check() == nil {
				time.Sleep(time.Millisecond)
			}
			cerr := c.Check()
			if cerr == nil || !strings.Contains(cerr.Error(), "no registered memory with key") {
				return fmt.Errorf("rank 1 after a write into deregistered memory: %v, want broken naming the key", cerr)
			}
			if err := dev.CopyOut(got, buf.Ptr); err != nil {
				return err
			}
			if !bytes.Equal(got, poison) {
				return fmt.Errorf("rank 1: a write into deregistered memory landed")
			}
			return bs.Barrier(ctx) // rank 0's source stays allocated until here
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		// After: refused at the receiver (no flush: it would not be
		// acknowledged).
		if err := conn.Write(remote[0], 0, mem, 0, n); err != nil {
			return err
		}
		// Not deregistered by another rank: refused here.
		var foreign channels.RegisteredMemory
		if err := c.DeregisterMemory(foreign); err == nil {
			return fmt.Errorf("deregistering no memory: nil error")
		}
		return bs.Barrier(ctx)
	})
}
