package channels

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/internal/device"
)

// Transport is how a connection moves bytes to its peer.
type Transport uint8

const (
	// TransportCudaIPC: GPUs of one host, peer memory mapped through CUDA
	// IPC (across processes) or peer access (goroutine ranks), over NVLink
	// or PCIe.
	TransportCudaIPC Transport = iota + 1
	// TransportHostMemory: goroutine ranks of the host backend sharing
	// process memory.
	TransportHostMemory
	// TransportIB: InfiniBand / RoCE verbs (designed for, refused until
	// built: rdma.go).
	TransportIB
	// TransportEthernet: TCP sockets between nodes, several per
	// connection, data staged through pinned host buffers (conn_tcp.go).
	TransportEthernet
)

func (t Transport) String() string {
	switch t {
	case TransportCudaIPC:
		return "cuda-ipc"
	case TransportHostMemory:
		return "host-memory"
	case TransportIB:
		return "ib"
	case TransportEthernet:
		return "tcp"
	}
	return fmt.Sprintf("transport(%d)", uint8(t))
}

// MapsMemory reports whether the transport maps peer memory into this
// rank's address space, which device-to-device semaphores and memory
// channels need.
func (t Transport) MapsMemory() bool { return t == TransportCudaIPC || t == TransportHostMemory }

// TransportSet is a set of transports.
type TransportSet uint8

// With is s plus t.
func (s TransportSet) With(t Transport) TransportSet { return s | 1<<(t-1) }

// Has reports whether t is in s.
func (s TransportSet) Has(t Transport) bool { return t > 0 && s&(1<<(t-1)) != 0 }

func (s TransportSet) String() string {
	var names []string
	for t := TransportCudaIPC; t <= TransportEthernet; t++ {
		if s.Has(t) {
			names = append(names, t.String())
		}
	}
	return "{" + strings.Join(names, ",") + "}"
}

// Connection moves bytes from this rank to one peer, in issue order, on
// behalf of the host (a CPU proxy serving port channels, host-to-device
// semaphores). Memory channels do not use it at run time: their kernels
// write peer memory directly.
type Connection interface {
	Transport() Transport
	LocalRank() int
	RemoteRank() int
	// Tag is the tag the connection was made with.
	Tag() int
	// Write copies size bytes from src[srcOff:] (local memory) to
	// dst[dstOff:] (the peer's memory, or local), asynchronously, after
	// every earlier Write and UpdateAndSync of this connection.
	Write(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error
	// UpdateAndSync stores value into the 64-bit word dst[dstOff:] once
	// every earlier Write has landed, as one aligned 8-byte store (device
	// waiters never see a torn value). It is how a host signals a semaphore.
	UpdateAndSync(dst RegisteredMemory, dstOff int, value uint64) error
	// AtomicAdd adds value (two's complement: subtraction works) to the
	// aligned 64-bit word dst[dstOff:] atomically, after every earlier Write
	// of the connection has landed, asynchronously. A CPU has no atomics on
	// a peer GPU's memory, so on CUDA IPC it is a one-thread kernel on the
	// connection's stream (it needs a free SM slot to run); on the host
	// backend a sync/atomic add. Kernels polling the word with acquire loads
	// see the sum and the data written before it.
	AtomicAdd(dst RegisteredMemory, dstOff int, value uint64) error
	// Flush waits until every Write, UpdateAndSync and AtomicAdd issued so
	// far has landed.
	Flush() error
	// Close releases the connection's resources (the communicator's Close
	// does too).
	Close() error
}

// connBase is what every transport's connection shares: identity, argument
// checks and the communicator's gate.
type connBase struct {
	c         *Communicator
	transport Transport
	// network: the peer is on another node, so only port channels and
	// host semaphores may use the connection, whatever its transport (the
	// port over CUDA IPC maps memory, but stands for a network).
	network   bool
	peer, tag int
	closed    bool
	// release frees the transport's resources; called with c.mu held.
	release func() error
	// settle, when set, waits until what the connection's receiving side
	// has applied so far is done in memory (TCP: its copy-in stream):
	// DeregisterMemory calls it before the memory may be freed.
	settle func() error
}

// overNetwork reports whether the peer is on another node (the proxy's
// pacing: NetworkConfig.EmulatedGBps).
func (b *connBase) overNetwork() bool { return b != nil && b.network }

func (b *connBase) Transport() Transport {
	if b == nil {
		var r0 Transport
		return r0
	}
	return b.transport
}
func (b *connBase) LocalRank() int {
	if b == nil {
		var r0 int
		return r0
	}
	return b.c.rank
}
func (b *connBase) RemoteRank() int {
	if b == nil {
		var r0 int
		return r0
	}
	return b.peer
}
func (b *connBase) Tag() int {
	if b == nil {
		var r0 int
		return r0
	}
	return b.tag
}

func (b *connBase) String() string {
	if b == nil {
		var r0 string
		return r0
	}
	return fmt.Sprintf("%s connection to rank %d (tag %d)", b.transport, b.peer, b.tag)
}

func (b *connBase) errorf(format string, a ...any) error {
	return b.c.errorf("%s: "+format, append([]any{b}, a...)...)
}

// usable is the gate of every call.
func (b *connBase) usable() error {
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	if err := b.c.usableLocked(); err != nil {
		return err
	}
	if b.closed {
		return b.errorf("%w", ErrClosed)
	}
	return nil
}

func (b *connBase) checkWrite(dst RegisteredMemory, dstOff int, src RegisteredMemory, srcOff, size int) error {
	if err := b.usable(); err != nil {
		return err
	}
	if !src.IsLocal() {
		return b.errorf("write source must be local memory, not %v", src)
	}
	if dst.Rank() != b.peer && !dst.IsLocal() {
		return b.errorf("write destination is %v, not memory of rank %d", dst, b.peer)
	}
	if !src.contains(srcOff, size) || !dst.contains(dstOff, size) {
		return b.errorf("write of %d bytes from offset %d of %v to offset %d of %v is out of range", size, srcOff, src, dstOff, dst)
	}
	return nil
}

func (b *connBase) checkUpdate(dst RegisteredMemory, off int) error {
	return b.checkWord("update", dst, off)
}

// checkWord checks that dst[off:] is an aligned 64-bit word of the peer's
// (or this rank's) memory.
func (b *connBase) checkWord(op string, dst RegisteredMemory, off int) error {
	if err := b.usable(); err != nil {
		return err
	}
	if dst.Rank() != b.peer && !dst.IsLocal() {
		return b.errorf("%s destination is %v, not memory of rank %d", op, dst, b.peer)
	}
	if !dst.contains(off, 8) || (dst.Ptr()+uintptr(off))%8 != 0 {
		return b.errorf("%s at offset %d of %v: needs an aligned 8-byte word inside it", op, off, dst)
	}
	return nil
}

func (b *connBase) Close() error {
	if b == nil {
		return ErrNil
	}
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	return b.closeLocked()
}

func (b *connBase) closeLocked() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.release != nil {
		return b.release()
	}
	return nil
}

// Endpoint message, little endian: magic, intra-node transport, device
// kind, network transport, a zero byte, rank, host identity, locality (16
// bytes), VirtualNodes (u32), TCP sockets (u32).
const endpointMagic = "goepEP02"

const endpointSize = 56

func (c *Communicator) endpoint(t Transport) []byte {
	b := make([]byte, 0, endpointSize)
	b = append(b, endpointMagic...)
	b = append(b, byte(t), kindCode(c.kind), byte(c.net.cfg.Transport), 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.rank))
	b = append(b, c.hostID[:]...)
	b = append(b, c.net.locality[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.net.cfg.VirtualNodes))
	return binary.LittleEndian.AppendUint32(b, uint32(c.net.cfg.Sockets))
}

// transport picks the transport this rank's device offers.
func (c *Communicator) transport() Transport {
	if c.kind == device.Host {
		return TransportHostMemory
	}
	return TransportCudaIPC
}

// checkEndpoint validates the peer's endpoint against ours and picks the
// pair's transport: t (this rank's intra-node one) for a peer on this
// node, the network transport for one on another (network: true).
func (c *Communicator) checkEndpoint(peer, tag int, msg []byte, t Transport) (_ Transport, network bool, err error) {
	le := binary.LittleEndian
	if len(msg) != endpointSize || !bytes.Equal(msg[:8], []byte(endpointMagic)) {
		return 0, false, c.errorf("connect to rank %d (tag %d): malformed endpoint (%d bytes)", peer, tag, len(msg))
	}
	if r := int(le.Uint32(msg[12:])); r != peer {
		return 0, false, c.errorf("connect to rank %d (tag %d): the endpoint came from rank %d", peer, tag, r)
	}
	var loc [16]byte
	copy(loc[:], msg[32:48])
	same, err := c.sameNode(peer, loc, int(le.Uint32(msg[48:])))
	if err != nil {
		return 0, false, err
	}
	if !same {
		if nt := Transport(msg[10]); nt != c.net.cfg.Transport {
			return 0, false, c.errorf("connect to rank %d (tag %d): Network.Transport is %s on rank %d and %s on rank %d", peer, tag, c.net.cfg.Transport, c.rank, nt, peer)
		}
		if n := int(le.Uint32(msg[52:])); n != c.net.cfg.Sockets {
			return 0, false, c.errorf("connect to rank %d (tag %d): Network.Sockets is %d on rank %d and %d on rank %d (set by Config or $%s; the default is 8 on hosts of 16 or more CPUs, 4 on 8 to 15, else 2)", peer, tag, c.net.cfg.Sockets, c.rank, n, peer, TCPSocketsEnv)
		}
		nt := c.netTransport()
		if !nt.MapsMemory() {
			return nt, true, nil
		}
		// The port over CUDA IPC between virtual nodes reaches ranks that
		// share this rank's memory only (one host; one process on the host
		// backend).
		if loc != c.net.locality || (t == TransportCudaIPC && !bytes.Equal(msg[16:32], c.hostID[:])) {
			return 0, false, c.errorf("connect to rank %d (tag %d): rank %d is on another host (or process), which the port over CUDA IPC cannot reach: use tcp ($%s)", peer, tag, peer, NetTransportEnv)
		}
		network = true
	}
	if pt := Transport(msg[8]); pt != t {
		return 0, false, c.errorf("connect to rank %d (tag %d): this rank offers %s, rank %d offers %s", peer, tag, t, peer, pt)
	}
	if t == TransportCudaIPC && !bytes.Equal(msg[16:32], c.hostID[:]) {
		return 0, false, c.errorf("connect to rank %d (tag %d): rank %d is on another host; CUDA IPC connects GPUs of one host (other transports come with port channels)", peer, tag, peer)
	}
	return t, network, nil
}

// Connect connects this rank to peer (which may be this rank: a loopback
// connection). The peer calls Connect(ctx, thisRank, tag) too; their k-th
// connections with one tag pair up. To connect to several peers use
// ConnectAll, which cannot deadlock however ranks order their peers.
func (c *Communicator) Connect(ctx context.Context, peer, tag int) (Connection, error) {
	if c == nil {
		var r0 Connection
		return r0, ErrNil
	}
	conns, err := c.ConnectAll(ctx, []int{peer}, tag)
	if err != nil {
		return nil, err
	}
	return conns[0], nil
}

// ConnectAll connects to every rank in peers with one tag (result[i] is to
// peers[i]). It sends every endpoint before waiting for any.
func (c *Communicator) ConnectAll(ctx context.Context, peers []int, tag int) ([]Connection, error) {
	if c == nil {
		var r0 []Connection
		return r0, ErrNil
	}
	if err := c.usable(); err != nil {
		return nil, err
	}
	for _, p := range peers {
		if err := c.checkPeer(p); err != nil {
			return nil, err
		}
	}
	t := c.transport()
	mine := c.endpoint(t)
	theirs, err := c.exchange(ctx, kindConnect, tag, peers, func(int) []byte { return mine })
	if err != nil {
		return nil, err
	}
	ts := make([]Transport, len(peers))
	network := make([]bool, len(peers))
	var netPeers []int // positions in peers
	for i, p := range peers {
		if ts[i], network[i], err = c.checkEndpoint(p, tag, theirs[i], t); err != nil {
			return nil, err
		}
		if ts[i] == TransportEthernet {
			netPeers = append(netPeers, i)
		}
	}
	links := make([]*tcpLinks, len(peers))
	if len(netPeers) > 0 {
		if err := c.tcpSetup(ctx, tag, peers, netPeers, links); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Connection, len(peers))
	err = c.usableLocked()
	for i, p := range peers {
		if err != nil {
			break
		}
		out[i], err = c.newConnectionLocked(ts[i], network[i], p, tag, links[i])
		links[i] = nil // the connection owns them now, or closed them
	}
	if err != nil {
		for _, done := range out {
			if done != nil {
				_ = done.(interface{ closeLocked() error }).closeLocked()
			}
		}
		closeLinks(links...)
		return nil, err
	}
	return out, nil
}

func (c *Communicator) newConnectionLocked(t Transport, network bool, peer, tag int, links *tcpLinks) (Connection, error) {
	base := &connBase{c: c, transport: t, network: network, peer: peer, tag: tag}
	var conn Connection
	switch t {
	case TransportCudaIPC:
		conn = newCudaIPCConnection(base, c.dev)
	case TransportHostMemory:
		conn = &hostConnection{connBase: base}
	case TransportEthernet:
		k, err := newTCPConnection(base, links)
		if err != nil {
			return nil, err
		}
		conn = k
	default:
		return nil, c.errorf("connect to rank %d (tag %d): transport %s is not implemented", peer, tag, t)
	}
	c.conns = append(c.conns, base)
	return conn, nil
}
