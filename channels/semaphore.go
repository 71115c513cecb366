package channels

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// Semaphore is what kernels wait on: a MemorySemaphore or a HostSemaphore.
type Semaphore interface {
	// DeviceHandle is the goep_semaphore kernels receive (UploadSemaphores).
	DeviceHandle() devapi.Semaphore
	Peer() int
	ID() uint32
}

// MemorySemaphore is a device-to-device semaphore: kernels on either rank
// signal the other (a release add on the peer's inbound token, over the
// mapped memory) and wait on their own (see kernels/sem_device.cuh).
type MemorySemaphore struct{ semaphore }

// HostSemaphore is a host-to-device semaphore: this rank's host signals the
// peer's device through the connection (Signal), and this rank's device
// waits for the peer host's signals (its handle cannot signal: remote is 0).
type HostSemaphore struct {
	semaphore
	mu       sync.Mutex
	outbound uint64 // signals sent; the peer's token is set to it
}

// semaphore is the state both kinds share.
type semaphore struct {
	c        *Communicator
	conn     Connection
	id       uint32
	inbound  slot             // this rank's token (registered: the peer writes it)
	expected slot             // this rank's consumed count
	remote   RegisteredMemory // the peer's token for this pair
	// hostRemote is the peer's token when it lives in shared host memory
	// (host semaphores over CUDA IPC; host_tokens.go); remote is then
	// unset.
	hostRemote *hostToken
}

// The methods of the shared state, written out for both kinds so that a
// nil *MemorySemaphore or *HostSemaphore answers instead of panicking
// while reaching the embedded state.

func (s *MemorySemaphore) base() *semaphore {
	if s == nil {
		return nil
	}
	return &s.semaphore
}

func (s *HostSemaphore) base() *semaphore {
	if s == nil {
		return nil
	}
	return &s.semaphore
}

// Peer is the rank at the other end.
func (s *MemorySemaphore) Peer() int { return s.base().Peer() }

// ID is the semaphore's id.
func (s *MemorySemaphore) ID() uint32 { return s.base().ID() }

// Connection is the connection the semaphore was built on.
func (s *MemorySemaphore) Connection() Connection { return s.base().Connection() }

// Inbound is the token the peer has written.
func (s *MemorySemaphore) Inbound() (uint64, error) { return s.base().Inbound() }

// Expected is this rank's consumed count.
func (s *MemorySemaphore) Expected() (uint64, error) { return s.base().Expected() }

// Peer is the rank at the other end.
func (s *HostSemaphore) Peer() int { return s.base().Peer() }

// ID is the semaphore's id.
func (s *HostSemaphore) ID() uint32 { return s.base().ID() }

// Connection is the connection the semaphore was built on.
func (s *HostSemaphore) Connection() Connection { return s.base().Connection() }

// Inbound is the token the peer has written.
func (s *HostSemaphore) Inbound() (uint64, error) { return s.base().Inbound() }

// Expected is this rank's consumed count.
func (s *HostSemaphore) Expected() (uint64, error) { return s.base().Expected() }

type semKind byte

const (
	semMemory semKind = 1
	semHost   semKind = 2
)

func (k semKind) String() string {
	if k == semHost {
		return "host-to-device semaphore"
	}
	return "memory semaphore"
}

// NewMemorySemaphore builds a device-to-device semaphore over conn, whose
// transport must map peer memory. The peer builds its side over its
// connection to this rank; the k-th semaphores of a connection pair up.
func (c *Communicator) NewMemorySemaphore(ctx context.Context, conn Connection) (*MemorySemaphore, error) {
	if c == nil {
		var r0 *MemorySemaphore
		return r0, ErrNil
	}
	s, err := c.NewMemorySemaphores(ctx, []Connection{conn})
	if err != nil {
		return nil, err
	}
	return s[0], nil
}

// NewMemorySemaphores builds one semaphore per connection, exchanging with
// all peers at once (no ordering of peers can deadlock).
func (c *Communicator) NewMemorySemaphores(ctx context.Context, conns []Connection) ([]*MemorySemaphore, error) {
	if c == nil {
		var r0 []*MemorySemaphore
		return r0, ErrNil
	}
	base, err := c.newSemaphores(ctx, conns, semMemory)
	if err != nil {
		return nil, err
	}
	out := make([]*MemorySemaphore, len(base))
	for i := range base {
		out[i] = &MemorySemaphore{base[i]}
	}
	return out, nil
}

// NewHostSemaphore builds a host-to-device semaphore over conn.
func (c *Communicator) NewHostSemaphore(ctx context.Context, conn Connection) (*HostSemaphore, error) {
	if c == nil {
		var r0 *HostSemaphore
		return r0, ErrNil
	}
	s, err := c.NewHostSemaphores(ctx, []Connection{conn})
	if err != nil {
		return nil, err
	}
	return s[0], nil
}

// NewHostSemaphores builds one host-to-device semaphore per connection.
func (c *Communicator) NewHostSemaphores(ctx context.Context, conns []Connection) ([]*HostSemaphore, error) {
	if c == nil {
		var r0 []*HostSemaphore
		return r0, ErrNil
	}
	base, err := c.newSemaphores(ctx, conns, semHost)
	if err != nil {
		return nil, err
	}
	out := make([]*HostSemaphore, len(base))
	for i := range base {
		out[i] = &HostSemaphore{semaphore: base[i]}
	}
	return out, nil
}

// Setup message, little endian: magic, kind, a flag byte, 2 zero bytes,
// rank, then the serialised registered memory of the sender's inbound
// token; with the flag shmToken, the token's offset (u32) and the name of
// its shared-memory segment instead.
const semMagic = "goepSM01"

const shmToken = 1

func hostSemMessage(c *Communicator, segment string, off int) []byte {
	b := make([]byte, 0, 20+len(segment))
	b = append(b, semMagic...)
	b = append(b, byte(semHost), shmToken, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(off))
	return append(b, segment...)
}

func isHostSemMessage(msg []byte) bool {
	return len(msg) >= 20 && bytes.Equal(msg[:8], []byte(semMagic)) && msg[9] == shmToken
}

// openHostSemMessage maps the peer's token in shared memory.
func (c *Communicator) openHostSemMessage(kind semKind, conn Connection, peer, tag int, msg []byte) (*hostToken, error) {
	if theirs := semKind(msg[8]); theirs != kind {
		return nil, c.errorf("%s with rank %d (tag %d): rank %d built a %s at the same position", kind, peer, tag, peer, theirs)
	}
	b, err := c.ownConnection(conn)
	if err != nil {
		return nil, err
	}
	reg, ok := c.hostTokens(b)
	if !ok {
		return nil, c.errorf("%s with rank %d (tag %d): the peer keeps its token in shared memory, which this rank cannot map", kind, peer, tag)
	}
	off := int(binary.LittleEndian.Uint32(msg[16:]))
	if off%hostTokenSlot != 0 || off+8 > shmSegmentSize {
		return nil, c.errorf("%s with rank %d (tag %d): token offset %d", kind, peer, tag, off)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	seg, err := c.openPeerSegment(reg, string(msg[20:]))
	if err != nil {
		return nil, c.errorf("%s with rank %d (tag %d): %w", kind, peer, tag, err)
	}
	return &hostToken{word: seg.word(off), dev: seg.dev + uintptr(off)}, nil
}

func (c *Communicator) newSemaphores(ctx context.Context, conns []Connection, kind semKind) ([]semaphore, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	out := make([]semaphore, len(conns))
	byTag := map[int][]int{} // tag -> indexes into conns, in order
	var tags []int
	for i, conn := range conns {
		b, err := c.ownConnection(conn)
		if err != nil {
			return nil, err
		}
		if kind == semMemory && !b.transport.MapsMemory() {
			return nil, c.errorf("%s over %v: the transport does not map peer memory", kind, b)
		}
		if kind == semMemory && b.network {
			return nil, c.errorf("%s over %v: rank %d is on another node, which only port channels and host semaphores reach", kind, b, b.peer)
		}
		if _, ok := byTag[b.tag]; !ok {
			tags = append(tags, b.tag)
		}
		byTag[b.tag] = append(byTag[b.tag], i)
		out[i] = semaphore{c: c, conn: conn}
	}
	msgs := make([][]byte, len(conns))
	c.mu.Lock()
	for i := range out {
		var err error
		b, _ := c.ownConnection(conns[i])
		if reg, ok := c.hostTokens(b); ok && kind == semHost {
			var seg *shmSegment
			var off int
			if seg, off, err = c.allocHostToken(reg); err == nil {
				out[i].inbound = slot{ptr: seg.dev + uintptr(off)}
				msgs[i] = hostSemMessage(c, seg.name, off)
			}
		} else if out[i].inbound, err = c.tokens.alloc(); err == nil {
			msgs[i], err = semMessage(c, kind, out[i].inbound.mem)
		}
		if err == nil {
			out[i].expected, err = c.locals.alloc()
		}
		if err != nil {
			c.mu.Unlock()
			return nil, c.errorf("%s: %w", kind, err)
		}
	}
	c.mu.Unlock()

	for _, tag := range tags {
		idx := byTag[tag]
		peers := make([]int, len(idx))
		for j, i := range idx {
			peers[j] = conns[i].RemoteRank()
		}
		theirs, err := c.exchange(ctx, kindSemaphore, tag, peers, func(j int) []byte { return msgs[idx[j]] })
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			if isHostSemMessage(theirs[j]) {
				if out[i].hostRemote, err = c.openHostSemMessage(kind, conns[i], peers[j], tag, theirs[j]); err != nil {
					return nil, err
				}
				continue
			}
			if out[i].remote, err = c.openSemMessage(kind, peers[j], tag, theirs[j]); err != nil {
				return nil, err
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range out {
		id := c.newIDLocked("")
		c.names[id] = fmt.Sprintf("%s %d with rank %d (tag %d)", kind, id, conns[i].RemoteRank(), conns[i].Tag())
		out[i].id = id
	}
	return out, nil
}

func semMessage(c *Communicator, kind semKind, token RegisteredMemory) ([]byte, error) {
	mem, err := token.MarshalBinary()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 16+len(mem))
	b = append(b, semMagic...)
	b = append(b, byte(kind), 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.rank))
	return append(b, mem...), nil
}

func (c *Communicator) openSemMessage(kind semKind, peer, tag int, msg []byte) (RegisteredMemory, error) {
	if len(msg) < 16 || !bytes.Equal(msg[:8], []byte(semMagic)) {
		return RegisteredMemory{}, c.errorf("%s with rank %d (tag %d): malformed setup message", kind, peer, tag)
	}
	if theirs := semKind(msg[8]); theirs != kind {
		return RegisteredMemory{}, c.errorf("%s with rank %d (tag %d): rank %d built a %s at the same position", kind, peer, tag, peer, theirs)
	}
	m, err := c.OpenMemory(msg[16:])
	if err != nil {
		return RegisteredMemory{}, err
	}
	if m.Rank() != peer || m.Size() != tokenSlotSize {
		return RegisteredMemory{}, c.errorf("%s with rank %d (tag %d): the peer sent %v as its token", kind, peer, tag, m)
	}
	return m, nil
}

// ownConnection checks that conn was made by this communicator.
func (c *Communicator) ownConnection(conn Connection) (*connBase, error) {
	var b *connBase
	switch k := conn.(type) {
	case *cudaIPCConnection:
		b = k.connBase
	case *hostConnection:
		b = k.connBase
	case *tcpConnection:
		b = k.connBase
	}
	if b == nil || b.c != c {
		return nil, c.errorf("connection %v was not made by this communicator", conn)
	}
	return b, nil
}

// Peer is the rank at the other end.
func (s *semaphore) Peer() int {
	if s == nil {
		var r0 int
		return r0
	}
	return s.conn.RemoteRank()
}

// ID is the semaphore's communicator-wide id (timeout records carry it).
func (s *semaphore) ID() uint32 {
	if s == nil {
		var r0 uint32
		return r0
	}
	return s.id
}

// Connection is the connection the semaphore was built over.
func (s *semaphore) Connection() Connection {
	if s == nil {
		var r0 Connection
		return r0
	}
	return s.conn
}

func (s *semaphore) handle(remote uintptr) devapi.Semaphore {
	return devapi.Semaphore{Inbound: s.inbound.ptr, Expected: s.expected.ptr, Remote: remote,
		Watchdog: s.c.wd.buf.Ptr, Peer: uint32(s.conn.RemoteRank()), ID: s.id}
}

// Inbound reads this rank's token (signals received so far); Expected the
// number consumed. For tests and diagnostics: values are a snapshot.
func (s *semaphore) Inbound() (uint64, error) {
	if s == nil {
		var r0 uint64
		return r0, ErrNil
	}
	return s.read(s.inbound.ptr)
}

// Expected reads the number of signals this rank's device has consumed.
func (s *semaphore) Expected() (uint64, error) {
	if s == nil {
		var r0 uint64
		return r0, ErrNil
	}
	return s.read(s.expected.ptr)
}

func (s *semaphore) read(p uintptr) (uint64, error) {
	if err := s.c.usable(); err != nil {
		return 0, err
	}
	if s.c.kind == device.Host {
		return devapi.U64(p).Load(), nil
	}
	var b [8]byte
	if err := s.c.dev.CopyOut(b[:], p); err != nil {
		return 0, s.c.errorf("read semaphore %d: %w", s.id, err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// DeviceHandle is the goep_semaphore for kernels.
func (s *MemorySemaphore) DeviceHandle() devapi.Semaphore {
	if s == nil {
		var r0 devapi.Semaphore
		return r0
	}
	return s.handle(s.remote.Ptr())
}

// DeviceHandle is the goep_semaphore for kernels; it can wait and poll,
// not signal.
func (s *HostSemaphore) DeviceHandle() devapi.Semaphore {
	if s == nil {
		var r0 devapi.Semaphore
		return r0
	}
	return s.handle(0)
}

// Signal signals the peer's device once: the peer's token becomes the
// number of signals sent, after every earlier Write of the connection.
func (s *HostSemaphore) Signal() error {
	if s == nil {
		return ErrNil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hostRemote != nil {
		k, ok := s.conn.(*cudaIPCConnection)
		if !ok {
			return s.c.errorf("host semaphore %d: a shared-memory token over %v", s.id, s.conn)
		}
		if err := k.setHostToken(*s.hostRemote, s.outbound+1); err != nil {
			return err
		}
		s.outbound++
		return nil
	}
	if err := s.conn.UpdateAndSync(s.remote, 0, s.outbound+1); err != nil {
		return err
	}
	s.outbound++
	return nil
}
