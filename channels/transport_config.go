package channels

import (
	"crypto/sha256"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/goep-dev/goep/internal/device"
)

// NetworkConfig configures the network transport, which connects ranks on
// different nodes (Topology): port channels (put, signal, flush, atomic
// add) and host-to-device semaphores then run over it instead of CUDA IPC
// or host memory. The zero value is ready to use: TCP, nodes are hosts
// (host-backend ranks: processes), settings from the environment.
type NetworkConfig struct {
	// Transport is the network transport between nodes. Zero means
	// $GOEP_NET_TRANSPORT ("tcp", "ipc" or "ib"), else TransportEthernet
	// (TCP). TransportIB (verbs) is refused until it is built.
	//
	// TransportCudaIPC ("ipc") is the port over the host's own transport
	// between virtual nodes of one host (VirtualNodes required): a
	// connection to a rank of another virtual node is then a CUDA IPC
	// connection (a proxy-driven copy engine; host memory on the host
	// backend), so GPU runs move real GPU data through the same port
	// channels (put, signal, flush, atomic add) as on a network, without
	// TCP's host copies. Such a connection still counts as a network one:
	// memory channels and memory semaphores over it are refused, as over
	// TCP (cross-node traffic goes through port channels only).
	Transport Transport
	// VirtualNodes splits the ranks of the job into this many nodes of
	// consecutive ranks (k must divide the number of ranks; each node's
	// ranks must share a host), whose traffic to each other goes over the
	// network transport, never CUDA IPC: one host then runs the multi-node
	// protocol end to end. Zero means $GOEP_VIRTUAL_NODES, else none (a
	// node is a host).
	VirtualNodes int
	// Sockets is the number of TCP sockets per connection
	// ($GOEP_TCP_SOCKETS; at most 16): operations are striped over them in
	// chunks and applied in order by the receiver. The default is 8 on a
	// host with 16 or more CPUs, 4 with 8 to 15, else 2 (defaultSockets:
	// each socket has a reader and a writer of its own, and on 2 CPUs four
	// of them halve a put's throughput). Every rank must have the same
	// value: set it explicitly when hosts on both sides of 8 or 16 CPUs
	// share a job.
	Sockets int
	// ChunkBytes is the largest piece a write is cut into, and the size of
	// each pinned staging buffer (default 1 MiB, $GOEP_TCP_CHUNK_BYTES;
	// 4 KiB to 64 MiB). Where traffic is staged (GPUs) a connection pins
	// 3 + ReceiveAhead of them a socket (3 + 2 with ReceiveAheadOff): 56
	// MiB a connection with the defaults and 8 sockets (StagingBytes).
	ChunkBytes int
	// ReceiveAhead, where traffic is staged (GPUs), is how many pinned
	// receive buffers of ChunkBytes each socket has and how far its reader
	// may read ahead of the order operations are applied in (2 to 16): a
	// socket whose message is not next stages it and goes on reading while
	// an earlier one is still on another socket, and whichever reader
	// completes the next message in sequence applies every consecutive one
	// already staged. Zero means $GOEP_TCP_RECEIVE_AHEAD, else 4
	// (defaultTCPAhead). ReceiveAheadOff (-1, or "off" or 0 in the
	// environment) is the original receiver: each socket's reader stages
	// one message (2 buffers) and waits for its turn to apply it itself.
	// Receive side only: ranks may differ.
	ReceiveAhead int
	// ListenHost is the address this rank listens on for its peers' TCP
	// sockets and advertises to them ($GOEP_NET_LISTEN_HOST). Empty means
	// every interface, advertising loopback to ranks of this host and this
	// host's interface addresses to the others.
	ListenHost string
	// EmulatedGBps, when set, caps this rank's puts over the network
	// transport at this many GB/s (10^9 bytes a second), all its network
	// connections together, as one NIC per GPU would: the proxy issues each
	// put in pieces no faster than the rate (pace.go). It is for emulating
	// a NIC's line rate on the port over CUDA IPC between virtual nodes,
	// whose copy engines are several times faster than a NIC; figures taken
	// with it are emulations, not network figures. Zero means
	// $GOEP_NET_EMULATE_GBPS, else no cap; 0.1 to 10000. Send side only:
	// ranks may differ.
	EmulatedGBps float64
}

// Environment variables of NetworkConfig.
const (
	NetTransportEnv = "GOEP_NET_TRANSPORT"
	VirtualNodesEnv = "GOEP_VIRTUAL_NODES"
	TCPSocketsEnv   = "GOEP_TCP_SOCKETS"
	TCPChunkEnv     = "GOEP_TCP_CHUNK_BYTES"
	TCPAheadEnv     = "GOEP_TCP_RECEIVE_AHEAD"
	NetListenEnv    = "GOEP_NET_LISTEN_HOST"
	NetEmulateEnv   = "GOEP_NET_EMULATE_GBPS"
	// tcpStageEnv=always makes the host backend stage its TCP traffic
	// through host-mapped buffers as GPUs do, so CI runs the staging
	// pipeline too.
	tcpStageEnv = "GOEP_TCP_STAGE"
)

// ReceiveAheadOff in NetworkConfig.ReceiveAhead turns the read-ahead
// receiver off.
const ReceiveAheadOff = -1

const (
	maxTCPSockets   = 16
	defaultTCPChunk = 1 << 20
	minTCPChunk     = 4 << 10
	maxTCPChunk     = 64 << 20
	maxTCPAhead     = 16
	defaultTCPAhead = 4
)

// defaultTCPAhead: measured in session 14 (docs/PERFORMANCE.md) with 8
// sockets and 1 MiB chunks, internode at 4096 tokens, cached dispatch /
// combine: on 4 H200s of a 64-CPU host (EP4) off 11.21 / 9.27 and 8.52 /
// 7.27 ms, 4 buffers 7.83 / 6.69 and 8.03 / 6.82, 8 buffers 8.00 / 6.63 and
// 8.61 / 7.43 (another host: off 7.51 / 7.02 and 7.42 / 6.66, 4 buffers
// 8.02 / 6.16 and 7.13 / 5.79); with 4 ranks on 2 H200s off 9.83 / 9.46
// and 10.79 / 10.06, 4 buffers 9.72 / 8.02 and 8.90 / 8.28; at EP2 (one
// rank a GPU) the same within the spread. 4 buffers cost 4 MiB of pinned
// memory a socket against 2 with the original receiver.

// defaultSockets is the TCP socket count per connection when neither the
// Config nor $GOEP_TCP_SOCKETS sets one, for a host of cpus CPUs. Measured
// (docs/PERFORMANCE.md): in session 13, on a 32-CPU host with 2 H200s,
// internode dispatch / combine at 4096 tokens took 7.7 / 7.3 ms with 4
// sockets, 5.0-5.2 / 4.8 ms with 8, 5.0 / 4.3 with 12 and 5.4 / 4.4-4.7 with
// 16 (one rank a GPU), and 9.9-10.0 / 8.9-9.1 ms with 4 against 8.9-9.3 /
// 7.8-8.6 with 8 when 4 ranks shared the 2 GPUs (12 and 16 no better); in
// session 9 (older kernels and transport) on 4 GPUs of a 64-CPU host, 4
// sockets took 12.8-13.2 ms, 2 sockets 17.6-18.8 ms and 8 were erratic
// (13.5 and 20.6 ms); on a 2-CPU machine (CI) a loopback put ran 3.2-4.3
// GB/s with 2 sockets and 1.9 GB/s with 4.
func defaultSockets(cpus int) int {
	switch {
	case cpus >= 16:
		return 8
	case cpus >= 8:
		return 4
	}
	return 2
}

// EmulatedGBpsFromEnv is the line rate $GOEP_NET_EMULATE_GBPS asks for
// (NetworkConfig.EmulatedGBps; 0 when unset), or why it is refused.
func EmulatedGBpsFromEnv() (float64, error) {
	s := strings.TrimSpace(os.Getenv(NetEmulateEnv))
	if s == "" {
		return 0, nil
	}
	x, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a number", NetEmulateEnv, s)
	}
	if err := checkEmulatedGBps(x); err != nil {
		return 0, fmt.Errorf("%s: %w", NetEmulateEnv, err)
	}
	return x, nil
}

// ParseTransport accepts the network transports' names: "tcp" (or
// "ethernet"), "ipc" (or "cuda-ipc", "port": the port over CUDA IPC
// between virtual nodes of one host) and "ib" (or "verbs").
func ParseTransport(s string) (Transport, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "tcp", "ethernet":
		return TransportEthernet, nil
	case "ipc", "cuda-ipc", "port":
		return TransportCudaIPC, nil
	case "ib", "verbs", "rdma":
		return TransportIB, nil
	}
	return 0, fmt.Errorf("network transport %q: want tcp, ipc or ib", s)
}

// Resolve is the network configuration a communicator of ranks ranks
// would use for n: n's settings, then the environment, then the defaults
// (what NewCommunicator applies), or the error it would refuse n with.
func (n NetworkConfig) Resolve(ranks int) (NetworkConfig, error) { return n.resolve(ranks) }

// resolve applies Config > environment > default and validates against a
// job of size ranks.
func (n NetworkConfig) resolve(size int) (NetworkConfig, error) {
	fail := func(format string, a ...any) (NetworkConfig, error) {
		return n, fmt.Errorf("channels: network config: "+format, a...)
	}
	envInt := func(name string, v *int) error {
		s := strings.TrimSpace(os.Getenv(name))
		if *v != 0 || s == "" {
			return nil
		}
		x, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("%s=%q is not an integer", name, s)
		}
		*v = x
		return nil
	}
	if n.Transport == 0 {
		if s := os.Getenv(NetTransportEnv); strings.TrimSpace(s) != "" {
			t, err := ParseTransport(s)
			if err != nil {
				return fail("%s: %v", NetTransportEnv, err)
			}
			n.Transport = t
		} else {
			n.Transport = TransportEthernet
		}
	}
	for _, e := range []struct {
		name string
		v    *int
	}{{VirtualNodesEnv, &n.VirtualNodes}, {TCPSocketsEnv, &n.Sockets}, {TCPChunkEnv, &n.ChunkBytes}} {
		if err := envInt(e.name, e.v); err != nil {
			return fail("%v", err)
		}
	}
	if n.ReceiveAhead == 0 {
		switch s := strings.ToLower(strings.TrimSpace(os.Getenv(TCPAheadEnv))); s {
		case "":
			n.ReceiveAhead = defaultTCPAhead
		case "off", "0", "-1":
			n.ReceiveAhead = ReceiveAheadOff
		default:
			x, err := strconv.Atoi(s)
			if err != nil {
				return fail("%s=%q: want off or 2 to %d", TCPAheadEnv, s, maxTCPAhead)
			}
			n.ReceiveAhead = x
		}
	}
	if n.ListenHost == "" {
		n.ListenHost = strings.TrimSpace(os.Getenv(NetListenEnv))
	}
	if n.EmulatedGBps == 0 {
		x, err := EmulatedGBpsFromEnv()
		if err != nil {
			return fail("%v", err)
		}
		n.EmulatedGBps = x
	}
	if n.Sockets == 0 {
		n.Sockets = defaultSockets(runtime.NumCPU())
	}
	if n.ChunkBytes == 0 {
		n.ChunkBytes = defaultTCPChunk
	}
	switch {
	case n.Transport == TransportIB:
		return fail("%w", errVerbsNotBuilt)
	case n.Transport != TransportEthernet && n.Transport != TransportCudaIPC:
		return fail("Transport %s is not a network transport (want tcp, ipc or ib)", n.Transport)
	case n.VirtualNodes < 0:
		return fail("VirtualNodes %d is negative", n.VirtualNodes)
	case n.Transport == TransportCudaIPC && n.VirtualNodes == 0:
		return fail("Transport ipc (the port over CUDA IPC) connects virtual nodes of one host: set VirtualNodes (Config or $%s), or use tcp between hosts", VirtualNodesEnv)
	case n.VirtualNodes > 0 && size%n.VirtualNodes != 0:
		return fail("VirtualNodes %d does not divide the %d ranks (set by Config or $%s)", n.VirtualNodes, size, VirtualNodesEnv)
	case n.Sockets < 1 || n.Sockets > maxTCPSockets:
		return fail("Sockets %d: want 1 to %d", n.Sockets, maxTCPSockets)
	case n.ChunkBytes < minTCPChunk || n.ChunkBytes > maxTCPChunk:
		return fail("ChunkBytes %d: want %d to %d", n.ChunkBytes, minTCPChunk, maxTCPChunk)
	case n.ReceiveAhead != ReceiveAheadOff && (n.ReceiveAhead < 2 || n.ReceiveAhead > maxTCPAhead):
		return fail("ReceiveAhead %d: want ReceiveAheadOff (-1) or 2 to %d (set by Config or $%s)", n.ReceiveAhead, maxTCPAhead, TCPAheadEnv)
	}
	if err := checkEmulatedGBps(n.EmulatedGBps); err != nil {
		return fail("%v (set by Config or $%s)", err, NetEmulateEnv)
	}
	return n, nil
}

// StagingBytes is the pinned host memory one TCP connection of a resolved
// config (Resolve) stages its traffic through where traffic is staged
// (GPUs; the host backend stages none): per socket tcpTxBufs send buffers
// and ReceiveAhead receive buffers (2 with ReceiveAheadOff) of ChunkBytes
// each. A rank has one such connection per peer on another node that it
// opens a channel to. The port over CUDA IPC stages nothing (0).
func (n NetworkConfig) StagingBytes() (int, error) {
	if n.Transport == TransportCudaIPC {
		return 0, nil
	}
	if n.Sockets < 1 || n.ChunkBytes < 1 {
		return 0, fmt.Errorf("channels: staging of %d sockets x %d-byte chunks: resolve the config first", n.Sockets, n.ChunkBytes)
	}
	slots := tcpStagingSlots(n.Sockets, tcpRxBufs(n.ReceiveAhead))
	if n.ChunkBytes > math.MaxInt/slots {
		return 0, fmt.Errorf("channels: staging buffers: %d of %d bytes overflow", slots, n.ChunkBytes)
	}
	return slots * n.ChunkBytes, nil
}

// tcpRxBufs is the receive buffers a socket stages into: ReceiveAhead, or 2
// (one read while the other is applied) with ReceiveAheadOff.
func tcpRxBufs(ahead int) int {
	if ahead > 0 {
		return ahead
	}
	return 2
}

// tcpStagingSlots is the staging buffers of a connection of sockets
// sockets with rxBufs receive buffers each.
func tcpStagingSlots(sockets, rxBufs int) int { return (tcpTxBufs + rxBufs) * sockets }

// netState is the communicator's network-transport state.
type netState struct {
	cfg NetworkConfig
	// locality tells apart ranks that can share memory without a network:
	// the host for GPUs (CUDA IPC), the process for the host backend.
	locality [16]byte
	// stage: move data through host-mapped staging buffers (GPUs, or the
	// host backend under GOEP_TCP_STAGE=always).
	stage bool

	// keys names this rank's registered allocations for network writes
	// (the key travels in the serialised memory); guarded by mu, taken
	// after c.mu by registration and alone by receivers.
	mu      sync.RWMutex
	keys    map[uint32]*region
	nextKey uint32

	topoMu sync.Mutex // held through Topology's exchange
	topo   *Topology

	// pace caps the rank's puts over network connections (EmulatedGBps;
	// nil: no cap). Every proxy of the rank shares it.
	pace *pacer
}

// initNet resolves the network configuration; NewCommunicator calls it.
func (c *Communicator) initNet(cfg NetworkConfig) error {
	n, err := cfg.resolve(c.size)
	if err != nil {
		return err
	}
	c.net.cfg = n
	if c.net.pace, err = newPacer(n.EmulatedGBps); err != nil {
		return err
	}
	c.net.locality = c.hostID
	if c.kind == device.Host {
		// Host-backend memory is shared between goroutines of one process
		// only: each process is its own node.
		sum := sha256.Sum256(append(append([]byte("host-backend\x00"), c.hostID[:]...), strconv.Itoa(os.Getpid())...))
		copy(c.net.locality[:], sum[:])
	}
	c.net.stage = c.kind != device.Host || os.Getenv(tcpStageEnv) == "always"
	c.net.keys = map[uint32]*region{}
	return nil
}

// netKeyLocked gives a local region its network key. The caller holds c.mu.
func (c *Communicator) netKeyLocked(r *region) {
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	c.net.nextKey++
	r.key = c.net.nextKey
	c.net.keys[r.key] = r
}

// netRegion resolves [off, off+n) of this rank's allocation key to an
// address, for a receiver applying a peer's operation.
func (c *Communicator) netRegion(key uint32, off uint64, n uint64) (uintptr, *region, error) {
	c.net.mu.RLock()
	r := c.net.keys[key]
	if r != nil {
		// Counted under the read lock: DeregisterMemory, which removes the
		// key under the write lock, then waits for every count taken.
		r.applying.Add(1)
	}
	c.net.mu.RUnlock()
	if r == nil {
		return 0, nil, fmt.Errorf("no registered memory with key %d on rank %d (never registered, or deregistered before it was freed)", key, c.rank)
	}
	if off > uint64(r.size) || n > uint64(r.size)-off {
		r.applying.Done()
		return 0, nil, fmt.Errorf("%d bytes at offset %d of registered memory %d (%d bytes) are out of range", n, off, key, r.size)
	}
	return r.base + uintptr(off), r, nil
}

// virtualNode is rank's virtual node when the ranks are split into k.
func virtualNode(rank, size, k int) int {
	if k <= 0 {
		return 0
	}
	return rank / (size / k)
}

// netTransport is the transport of this rank's connections to ranks of
// other nodes: the configured network transport, or for the port over CUDA
// IPC this rank's own intra-host one (CUDA IPC; host memory on the host
// backend).
func (c *Communicator) netTransport() Transport {
	if c.net.cfg.Transport == TransportCudaIPC {
		return c.transport()
	}
	return c.net.cfg.Transport
}

// sameNode reports whether peer, whose locality and virtual-node count are
// loc and k, is on this rank's node; k must agree.
func (c *Communicator) sameNode(peer int, loc [16]byte, k int) (bool, error) {
	if mine := c.net.cfg.VirtualNodes; k != mine {
		return false, c.errorf("topology: VirtualNodes is %d on rank %d and %d on rank %d (set by Config or $%s; every rank must agree)",
			mine, c.rank, k, peer, VirtualNodesEnv)
	}
	if loc != c.net.locality {
		return false, nil
	}
	return virtualNode(peer, c.size, k) == virtualNode(c.rank, c.size, k), nil
}
