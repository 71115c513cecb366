package collectives

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/goep-dev/goep/collectives/abi"
	"github.com/goep-dev/goep/internal/device"
)

// Registration is a user buffer every rank registered together (Register):
// the zero-copy algorithms read and write the peers' registered buffers
// directly instead of going through the scratch.
type Registration struct {
	c      *Communicator
	id     int
	buf    device.Buffer
	closed bool
}

// ID is the registration's index, the same on every rank.
func (r *Registration) ID() int {
	if r == nil {
		return -1
	}
	return r.id
}

// Buffer is the registered allocation.
func (r *Registration) Buffer() device.Buffer {
	if r == nil {
		return device.Buffer{}
	}
	return r.buf
}

// Register registers buf, a whole allocation of this rank's Device (as
// Device.Alloc returned it), for the zero-copy algorithms. Collective:
// every rank registers its buffer at the same point, and calls then use
// zero-copy only when their buffers are registered on every rank (a
// mismatch is a wrong-call error that Config.Debug catches). Registrations
// live until Close (or Deregister, which only stops their use).
func (c *Communicator) Register(ctx context.Context, buf device.Buffer) (*Registration, error) {
	if c == nil {
		return nil, ErrNil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkLocked(); err != nil {
		return nil, err
	}
	if err := checkCtx(ctx); err != nil {
		return nil, c.errorf("register: %w", err)
	}
	if buf.Ptr == 0 || buf.Size <= 0 {
		return nil, c.errorf("register: empty buffer [%#x, +%d)", buf.Ptr, buf.Size)
	}
	if _, ok := rangeEnd(buf.Ptr, buf.Size); !ok {
		return nil, c.errorf("register: [%#x, +%d) overflows the address space: %w", buf.Ptr, buf.Size, ErrOverflow)
	}
	if rc, ok := c.dev.(device.RangeChecker); ok && c.gpu == nil && !c.cfg.ForeignHostMemory {
		if err := rc.CheckRange(buf.Ptr, buf.Size); err != nil {
			return nil, c.errorf("register: %w", err)
		}
	}
	if !c.native {
		return nil, c.errorf("register: the native algorithms need 2..%d ranks (have %d)", abi.MaxRanks, c.size)
	}
	if c.nextReg >= c.cfg.MaxRegistrations {
		return nil, c.errorf("register: all %d registrations are used (Config.MaxRegistrations)", c.cfg.MaxRegistrations)
	}
	for _, r := range c.regs {
		if buf.Ptr < r.buf.Ptr+uintptr(r.buf.Size) && r.buf.Ptr < buf.Ptr+uintptr(buf.Size) {
			return nil, c.errorf("register: [%#x, +%d) overlaps registration %d", buf.Ptr, buf.Size, r.id)
		}
	}
	id := c.nextReg
	mem, err := c.chans.RegisterMemory(buf)
	if err != nil {
		return nil, c.errorf("register: %w", err)
	}
	peers := make([]int, 0, c.size-1)
	for p := 0; p < c.size; p++ {
		if p != c.rank {
			peers = append(peers, p)
		}
	}
	theirs, err := c.chans.ExchangeMemory(ctx, mem, peers, tagRegBase+id)
	if err != nil {
		return nil, c.errorf("register %d: %w", id, err)
	}
	row := make([]byte, 8*abi.MaxRanks)
	binary.LittleEndian.PutUint64(row[8*c.rank:], uint64(buf.Ptr))
	for i, p := range peers {
		binary.LittleEndian.PutUint64(row[8*p:], uint64(theirs[i].Ptr()))
	}
	if err := c.dev.CopyIn(c.regsBuf.Ptr+uintptr(id*len(row)), row); err != nil {
		return nil, c.errorf("register %d: %w", id, err)
	}
	c.nextReg++
	r := &Registration{c: c, id: id, buf: buf}
	c.regs = append(c.regs, r)
	return r, nil
}

// Deregister stops using r for zero-copy (peers keep their mapping until
// Close). Every rank deregisters at the same point.
func (r *Registration) Deregister() {
	if r == nil || r.c == nil {
		return
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.regs {
		if x == r {
			c.regs = append(c.regs[:i], c.regs[i+1:]...)
			break
		}
	}
	r.closed = true
}

// lookup finds the registration holding [p, p+n), and p's offset in it.
func (c *Communicator) lookup(p uintptr, n int) (*Registration, uint64) {
	for _, r := range c.regs {
		if p >= r.buf.Ptr && p+uintptr(n) <= r.buf.Ptr+uintptr(r.buf.Size) {
			return r, uint64(p - r.buf.Ptr)
		}
	}
	return nil, 0
}

func (r *Registration) String() string {
	if r == nil {
		return "registration <nil>"
	}
	return fmt.Sprintf("registration %d ([%#x, +%d))", r.id, r.buf.Ptr, r.buf.Size)
}
