package channels

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
)

// RegisteredMemory is a span of device memory that peers can reach: a
// local allocation registered with RegisterMemory, or a peer's registration
// opened on this rank (RecvMemory, OpenMemory), whose Ptr is then this
// rank's address for the peer's memory (a CUDA IPC mapping, a peer-access
// address, or a host-backend address). The zero value is "no memory".
//
// Views of peers' memory stay mapped until the communicator closes.
type RegisteredMemory struct {
	r    *region
	off  int
	size int
}

// region is one registered allocation, local or opened from a peer.
type region struct {
	comm       *Communicator
	owner      int
	kind       device.Kind
	transports TransportSet
	hostID     [16]byte
	shared     device.Shared // the owner's export of the whole allocation
	base       uintptr       // this rank's address of the allocation (0: not mapped)
	size       int
	// key names the allocation in its owner's table for network
	// transports (netKeyLocked); a peer's memory on another node is not
	// mapped (base 0) and only a network transport reaches it.
	key      uint32
	locality [16]byte // the owner's (netState.locality)
	// applying counts network operations being applied into the region
	// (netRegion to netDone): DeregisterMemory waits for them.
	applying sync.WaitGroup
	// host is the CPU's view of pinned host memory registered with
	// RegisterHostMemory (nil otherwise): a source of this rank's puts that
	// a network transport sends straight from, without a staging copy.
	host []byte
}

// Valid reports whether m refers to memory.
func (m RegisteredMemory) Valid() bool { return m.r != nil }

// Rank is the rank that owns the memory.
func (m RegisteredMemory) Rank() int {
	if m.r == nil {
		return -1
	}
	return m.r.owner
}

// Ptr is this rank's address of the memory.
//
// It is 0 for a peer's memory on another node, which is not mapped here
// (network transports reach it; Mapped reports false).
func (m RegisteredMemory) Ptr() uintptr {
	if m.r == nil || m.r.base == 0 {
		return 0
	}
	return m.r.base + uintptr(m.off)
}

// Mapped reports whether this rank can address the memory (Ptr): its own,
// a peer's on the same node, or one on another virtual node over the port
// over CUDA IPC (NetworkConfig.Transport).
func (m RegisteredMemory) Mapped() bool { return m.r != nil && m.r.base != 0 }

// Size is its length in bytes.
func (m RegisteredMemory) Size() int { return m.size }

// IsLocal reports whether this rank owns the memory.
func (m RegisteredMemory) IsLocal() bool { return m.r != nil && m.r.owner == m.r.comm.rank }

// Transports are the transports that can reach the memory.
func (m RegisteredMemory) Transports() TransportSet {
	if m.r == nil {
		return 0
	}
	return m.r.transports
}

// Slice is [off, off+size) of m, registered the same way (it serialises to
// a handle that opens the same allocation at the offset).
func (m RegisteredMemory) Slice(off, size int) (RegisteredMemory, error) {
	if m.r == nil {
		return RegisteredMemory{}, fmt.Errorf("channels: slice of unregistered memory")
	}
	if off < 0 || size < 0 || off > m.size || size > m.size-off {
		return RegisteredMemory{}, fmt.Errorf("channels: slice [%d, +%d) of registered memory of %d bytes (rank %d)", off, size, m.size, m.r.owner)
	}
	return RegisteredMemory{r: m.r, off: m.off + off, size: size}, nil
}

func (m RegisteredMemory) String() string {
	if m.r == nil {
		return "no memory"
	}
	return fmt.Sprintf("%d bytes of rank %d at %#x", m.size, m.r.owner, m.Ptr())
}

// contains reports whether [off, off+n) is inside m.
func (m RegisteredMemory) contains(off, n int) bool {
	return m.r != nil && off >= 0 && n >= 0 && off <= m.size && n <= m.size-off
}

// RegisterMemory makes b, an allocation of this communicator's Device (its
// whole span, as Device.Alloc returned it), reachable by peers. Register an
// allocation once and Slice it for parts.
func (c *Communicator) RegisterMemory(b device.Buffer) (RegisteredMemory, error) {
	if c == nil {
		var r0 RegisteredMemory
		return r0, ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return RegisteredMemory{}, err
	}
	return c.registerLocked(b)
}

func (c *Communicator) registerLocked(b device.Buffer) (RegisteredMemory, error) {
	if b.Ptr == 0 || b.Size <= 0 {
		return RegisteredMemory{}, c.errorf("register memory: empty buffer")
	}
	h, err := c.dev.Export(b)
	if err != nil {
		return RegisteredMemory{}, c.errorf("register memory: %w", err)
	}
	r := &region{comm: c, owner: c.rank, kind: c.kind, transports: c.localTransports(), hostID: c.hostID,
		shared: h, base: b.Ptr, size: b.Size, locality: c.net.locality}
	c.netKeyLocked(r)
	return RegisteredMemory{r: r, size: b.Size}, nil
}

// RegisterHostMemory makes h, pinned host memory of this communicator's
// Device mapped into its kernels (AllocHostMapped; its whole span), a
// source of this rank's puts. Kernels write it through h.Dev; a TCP
// connection sends a write from it straight from h.Host, with no copy out
// of the GPU and no staging buffer (the write's bytes must be in place,
// and system-wide visible, when the put is issued: a kernel fences before
// its trigger, as the FIFO push does); a CUDA IPC connection's copy engine
// reads it over PCIe. It is never a destination: peers cannot map it, so
// it is not sent to them (MarshalBinary refuses) and has no network key.
func (c *Communicator) RegisterHostMemory(h device.HostMapped) (RegisteredMemory, error) {
	if c == nil {
		var r0 RegisteredMemory
		return r0, ErrNil
	}
	if h.Dev == 0 || len(h.Host) == 0 {
		return RegisteredMemory{}, c.errorf("register host memory: empty buffer")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return RegisteredMemory{}, err
	}
	r := &region{comm: c, owner: c.rank, kind: c.kind, hostID: c.hostID, base: h.Dev, size: len(h.Host),
		locality: c.net.locality, host: h.Host}
	return RegisteredMemory{r: r, size: len(h.Host)}, nil
}

// IsHost reports whether m is host memory registered with
// RegisterHostMemory.
func (m RegisteredMemory) IsHost() bool { return m.r != nil && m.r.host != nil }

// hostAddr is the CPU's address of [off, ...) of host memory m (IsHost).
func (m RegisteredMemory) hostAddr(off int) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(m.r.host))) + uintptr(m.off+off)
}

// DeregisterMemory withdraws m, memory this rank registered, from the
// network transports before its allocation is freed: a peer's write,
// update or atomic add that names it afterwards is refused (an error naming
// the key, which breaks the communicator) instead of landing in freed or
// reused memory. It waits, within Timeouts.Wait, for operations already
// being applied into it to finish in memory. The CUDA IPC and host
// transports write through mappings and are not stopped by it: peers must
// have drained their proxies (and met this rank) before it is freed, which
// is what callers do first; this is the guard for a peer that did not.
// Views and handles of m stay valid values; m itself remains usable by
// this rank's own channels. Deregistering twice is not an error.
func (c *Communicator) DeregisterMemory(m RegisteredMemory) error {
	if c == nil {
		return ErrNil
	}
	if m.r == nil || m.r.comm != c || !m.IsLocal() {
		return c.errorf("deregister memory: %v is not memory this rank registered", m)
	}
	r := m.r
	c.net.mu.Lock()
	if c.net.keys[r.key] == r {
		delete(c.net.keys, r.key)
	}
	c.net.mu.Unlock()
	// No new operation resolves r from here on (netRegion holds the read
	// lock while it counts one), so the count only falls.
	done := make(chan struct{})
	go func() { r.applying.Wait(); close(done) }()
	timer := time.NewTimer(c.timeouts.Wait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return c.errorf("deregister memory: a peer's operation into %v was still being applied after %s", m, c.timeouts.Wait)
	}
	c.mu.Lock()
	var settle []func() error
	for _, b := range c.conns {
		if b.settle != nil && !b.closed {
			settle = append(settle, b.settle)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, f := range settle {
		errs = append(errs, f())
	}
	if err := errors.Join(errs...); err != nil {
		return c.errorf("deregister memory: %w", err)
	}
	return nil
}

// localTransports are the transports that reach this rank's memory.
func (c *Communicator) localTransports() TransportSet {
	return TransportSet(0).With(c.transport()).With(c.netTransport())
}

// Serialised registered memory, little endian:
//
//	[0:8)   magic
//	[8]     device kind (1 CUDA, 2 host)   [9] transports   [10:12) zero
//	[12:16) owner rank
//	[16:24) allocation size   [24:32) offset   [32:40) size
//	[40:56) host identity
//	[56:60) export length, then the export (device.Shared)
//	then the network trailer: key (u32), the owner's VirtualNodes (u32),
//	the owner's locality (16 bytes)
const memMagic = "goepRM02"

const memTrailer = 24

const memHeader = 60

func kindCode(k device.Kind) byte {
	switch k {
	case device.CUDA:
		return 1
	case device.Host:
		return 2
	}
	return 0
}

func kindFromCode(b byte) device.Kind {
	switch b {
	case 1:
		return device.CUDA
	case 2:
		return device.Host
	}
	return ""
}

// MarshalBinary serialises m for a peer (OpenMemory).
func (m RegisteredMemory) MarshalBinary() ([]byte, error) {
	if m.r == nil {
		return nil, fmt.Errorf("channels: marshal of unregistered memory")
	}
	r := m.r
	if r.host != nil {
		return nil, fmt.Errorf("channels: %v is host memory, a source of rank %d's own puts: peers cannot map it", m, r.owner)
	}
	b := make([]byte, memHeader, memHeader+len(r.shared))
	copy(b, memMagic)
	b[8] = kindCode(r.kind)
	b[9] = byte(r.transports)
	le := binary.LittleEndian
	le.PutUint32(b[12:], uint32(r.owner))
	le.PutUint64(b[16:], uint64(r.size))
	le.PutUint64(b[24:], uint64(m.off))
	le.PutUint64(b[32:], uint64(m.size))
	copy(b[40:56], r.hostID[:])
	le.PutUint32(b[56:], uint32(len(r.shared)))
	b = append(b, r.shared...)
	b = le.AppendUint32(b, r.key)
	b = le.AppendUint32(b, uint32(r.comm.net.cfg.VirtualNodes))
	return append(b, r.locality[:]...), nil
}

// OpenMemory opens memory that a peer serialised with MarshalBinary: the
// allocation is mapped once (later openings of the same allocation share
// the mapping) and stays mapped until Close.
func (c *Communicator) OpenMemory(data []byte) (RegisteredMemory, error) {
	if c == nil {
		var r0 RegisteredMemory
		return r0, ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return RegisteredMemory{}, err
	}
	return c.openLocked(data)
}

func (c *Communicator) openLocked(data []byte) (RegisteredMemory, error) {
	le := binary.LittleEndian
	if len(data) < memHeader || !bytes.Equal(data[:8], []byte(memMagic)) {
		return RegisteredMemory{}, c.errorf("open memory: not serialised registered memory (%d bytes)", len(data))
	}
	owner := int(le.Uint32(data[12:]))
	kind := kindFromCode(data[8])
	allocSize, off, size := int(le.Uint64(data[16:])), int(le.Uint64(data[24:])), int(le.Uint64(data[32:]))
	var host [16]byte
	copy(host[:], data[40:56])
	n := int(le.Uint32(data[56:]))
	if n > len(data) || len(data) != memHeader+n+memTrailer || owner < 0 || owner >= c.size || off < 0 || size < 0 || off > allocSize || size > allocSize-off {
		return RegisteredMemory{}, c.errorf("open memory: corrupt handle (owner %d, %d bytes at %d of %d)", owner, size, off, allocSize)
	}
	if kind != c.kind {
		return RegisteredMemory{}, c.errorf("open memory of rank %d: it is %s memory and this rank runs the %s backend", owner, kind, c.kind)
	}
	trailer := data[memHeader+n:]
	netKey, vnodes := le.Uint32(trailer), int(le.Uint32(trailer[4:]))
	var loc [16]byte
	copy(loc[:], trailer[8:24])
	same, err := c.sameNode(owner, loc, vnodes)
	if err != nil {
		return RegisteredMemory{}, err
	}
	transports := TransportSet(data[9])
	if !same {
		nt := c.netTransport()
		if !transports.Has(nt) {
			return RegisteredMemory{}, c.errorf("open memory of rank %d: it is on another node and reachable over %v, not this rank's network transport %s", owner, transports, nt)
		}
		if !nt.MapsMemory() {
			// Another node: only the network transport reaches it, by key.
			r := &region{comm: c, owner: owner, kind: kind, transports: TransportSet(0).With(nt),
				hostID: host, size: allocSize, key: netKey, locality: loc}
			return RegisteredMemory{r: r, off: off, size: size}, nil
		}
		// The port over CUDA IPC between virtual nodes: mapped like a
		// rank of this node (its port channels write through the mapping),
		// which only ranks sharing this rank's memory can be.
		if loc != c.net.locality {
			return RegisteredMemory{}, c.errorf("open memory of rank %d: it is on another host (or process), which the port over CUDA IPC cannot reach: use tcp ($%s)", owner, NetTransportEnv)
		}
	}
	if kind == device.CUDA && host != c.hostID {
		return RegisteredMemory{}, c.errorf("open memory of rank %d: it is on another host; CUDA IPC maps memory within one host (other transports come with port channels)", owner)
	}
	shared := device.Shared(bytes.Clone(data[memHeader : memHeader+n]))
	key := string(shared)
	imp := c.imports[key]
	if imp == nil {
		buf, err := c.dev.Import(shared)
		if err != nil {
			return RegisteredMemory{}, c.errorf("open memory of rank %d: %w", owner, err)
		}
		imp = &importRef{buf: buf, region: &region{comm: c, owner: owner, kind: kind,
			transports: transports, hostID: host, shared: shared, base: buf.Ptr, size: allocSize, key: netKey, locality: loc}}
		c.imports[key] = imp
	}
	return RegisteredMemory{r: imp.region, off: off, size: size}, nil
}

// importRef is one peer allocation mapped on this rank.
type importRef struct {
	buf    device.Buffer
	region *region
}

// SendMemory sends m to peer under tag; the peer's k-th RecvMemory(rank,
// tag) gets this rank's k-th SendMemory(peer, tag). It does not wait for
// the peer.
func (c *Communicator) SendMemory(ctx context.Context, m RegisteredMemory, peer, tag int) error {
	if c == nil {
		return ErrNil
	}
	if err := c.usable(); err != nil {
		return err
	}
	if err := c.checkPeer(peer); err != nil {
		return err
	}
	data, err := m.MarshalBinary()
	if err != nil {
		return c.errorf("send memory to rank %d: %w", peer, err)
	}
	if err := checkTag(tag); err != nil {
		return c.errorf("send memory to rank %d: %w", peer, err)
	}
	if err := c.bs.Send(ctx, peer, bootstrapTag(kindMemory, tag), data); err != nil {
		return c.errorf("send memory to rank %d (tag %d): %w", peer, tag, err)
	}
	return nil
}

// RecvMemory receives the memory peer sent under tag and opens it.
func (c *Communicator) RecvMemory(ctx context.Context, peer, tag int) (RegisteredMemory, error) {
	if c == nil {
		var r0 RegisteredMemory
		return r0, ErrNil
	}
	if err := c.usable(); err != nil {
		return RegisteredMemory{}, err
	}
	if err := c.checkPeer(peer); err != nil {
		return RegisteredMemory{}, err
	}
	if err := checkTag(tag); err != nil {
		return RegisteredMemory{}, c.errorf("recv memory from rank %d: %w", peer, err)
	}
	data, err := c.bs.Recv(ctx, peer, bootstrapTag(kindMemory, tag))
	if err != nil {
		return RegisteredMemory{}, c.errorf("recv memory from rank %d (tag %d): %w", peer, tag, err)
	}
	m, err := c.OpenMemory(data)
	if err == nil && m.Rank() != peer {
		err = c.errorf("recv memory from rank %d (tag %d): it belongs to rank %d", peer, tag, m.Rank())
	}
	return m, err
}

// ExchangeMemory sends m to every rank of peers and opens theirs (result[i]
// is peers[i]'s), sending to all before receiving from any so that ranks
// exchanging with overlapping sets of peers cannot wait on each other.
func (c *Communicator) ExchangeMemory(ctx context.Context, m RegisteredMemory, peers []int, tag int) ([]RegisteredMemory, error) {
	if c == nil {
		var r0 []RegisteredMemory
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
	data, err := m.MarshalBinary()
	if err != nil {
		return nil, c.errorf("exchange memory: %w", err)
	}
	theirs, err := c.exchange(ctx, kindMemory, tag, peers, func(int) []byte { return data })
	if err != nil {
		return nil, err
	}
	out := make([]RegisteredMemory, len(peers))
	for i, p := range peers {
		if out[i], err = c.OpenMemory(theirs[i]); err != nil {
			return nil, err
		}
		if out[i].Rank() != p {
			return nil, c.errorf("exchange memory with rank %d (tag %d): it sent memory of rank %d", p, tag, out[i].Rank())
		}
	}
	return out, nil
}

func (c *Communicator) checkPeer(peer int) error {
	if peer < 0 || peer >= c.size {
		return c.errorf("peer %d is outside [0, %d)", peer, c.size)
	}
	return nil
}
