package channels

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/goep-dev/goep/internal/device"
)

// Host-to-device semaphore tokens in shared host memory.
//
// A host semaphore's signal is the peer's proxy (or host code) raising this
// rank's token. With the token in GPU memory that takes a driver call (a
// stream write) on every signal, several microseconds of submission. On a
// GPU backend that can pin foreign host memory, the tokens of host
// semaphores over CUDA IPC instead live in a shared-memory segment
// (/dev/shm, mapped by every process of the host that signals into it and
// registered with each one's GPU): this rank's kernels poll it over PCIe,
// and the peer stores the new value with one CPU store when its
// connection has no copy in flight (else a stream write of the same word
// keeps the signal behind the copies; see cudaIPCConnection.setHostToken).
//
// Segments are named goep-<pid>-<random> and removed at Close; a process
// that dies leaves its segments behind, recognisable by the pid.

const (
	shmDir         = "/dev/shm"
	shmSegmentSize = 64 << 10
	// hostTokenSlot keeps tokens a cache line apart: the owner's GPU reads
	// them across PCIe while peers' CPUs write neighbours.
	hostTokenSlot = 64
)

// shmSegment is a mapped shared-memory segment, registered with this
// rank's device (dev is where kernels and stream writes reach it).
type shmSegment struct {
	name string
	data []byte
	dev  uintptr
	own  bool
	used int // own segments: bytes handed out
}

// hostTokens returns the registrar when this communicator can keep host
// semaphore tokens in shared memory over conn.
func (c *Communicator) hostTokens(b *connBase) (device.HostRegistrar, bool) {
	if b.transport != TransportCudaIPC || os.Getenv("GOEP_HOST_TOKENS") == "device" {
		return nil, false
	}
	r, ok := c.dev.(device.HostRegistrar)
	if !ok {
		return nil, false
	}
	if _, err := os.Stat(shmDir); err != nil {
		return nil, false
	}
	return r, true
}

// allocHostToken returns a zeroed token slot in one of this rank's
// segments. The caller holds c.mu.
func (c *Communicator) allocHostToken(reg device.HostRegistrar) (*shmSegment, int, error) {
	n := len(c.ownSegments)
	if n == 0 || c.ownSegments[n-1].used+hostTokenSlot > len(c.ownSegments[n-1].data) {
		seg, err := createSegment(reg)
		if err != nil {
			return nil, 0, err
		}
		c.ownSegments = append(c.ownSegments, seg)
	}
	seg := c.ownSegments[len(c.ownSegments)-1]
	off := seg.used
	seg.used += hostTokenSlot
	return seg, off, nil
}

func createSegment(reg device.HostRegistrar) (_ *shmSegment, err error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("goep-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	path := filepath.Join(shmDir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host tokens: %w", err)
	}
	defer f.Close()
	seg := &shmSegment{name: name, own: true}
	defer func() {
		if err != nil {
			err = errors.Join(err, seg.release(reg))
		}
	}()
	if err := f.Truncate(shmSegmentSize); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("host tokens: %w", err)
	}
	if seg.data, err = syscall.Mmap(int(f.Fd()), 0, shmSegmentSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("host tokens: mmap %s: %w", path, err)
	}
	if seg.dev, err = reg.RegisterHost(seg.data); err != nil {
		return nil, fmt.Errorf("host tokens: %w", err)
	}
	return seg, nil
}

// openPeerSegment maps a peer's segment (once per name). The caller holds
// c.mu.
func (c *Communicator) openPeerSegment(reg device.HostRegistrar, name string) (_ *shmSegment, err error) {
	if seg := c.peerSegments[name]; seg != nil {
		return seg, nil
	}
	for _, seg := range c.ownSegments {
		if seg.name == name { // a loopback semaphore
			return seg, nil
		}
	}
	if !strings.HasPrefix(name, "goep-") || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("host tokens: bad segment name %q", name)
	}
	f, err := os.OpenFile(filepath.Join(shmDir, name), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("host tokens: %w", err)
	}
	defer f.Close()
	seg := &shmSegment{name: name}
	defer func() {
		if err != nil {
			err = errors.Join(err, seg.release(reg))
		}
	}()
	if seg.data, err = syscall.Mmap(int(f.Fd()), 0, shmSegmentSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("host tokens: mmap %s: %w", name, err)
	}
	if seg.dev, err = reg.RegisterHost(seg.data); err != nil {
		return nil, fmt.Errorf("host tokens: %w", err)
	}
	if c.peerSegments == nil {
		c.peerSegments = map[string]*shmSegment{}
	}
	c.peerSegments[name] = seg
	return seg, nil
}

// word is the token at off, for atomic host access.
func (s *shmSegment) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&s.data[off])) }

// release unregisters, unmaps and (own segments) removes the segment.
func (s *shmSegment) release(reg device.HostRegistrar) error {
	var errs []error
	if s.dev != 0 {
		errs = append(errs, reg.UnregisterHost(s.data))
		s.dev = 0
	}
	if s.data != nil {
		errs = append(errs, syscall.Munmap(s.data))
		s.data = nil
	}
	if s.own {
		if err := os.Remove(filepath.Join(shmDir, s.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// freeHostTokens releases every segment. The caller holds c.mu.
func (c *Communicator) freeHostTokens() error {
	reg, ok := c.dev.(device.HostRegistrar)
	if !ok {
		return nil
	}
	var errs []error
	for _, seg := range c.peerSegments {
		errs = append(errs, seg.release(reg))
	}
	for _, seg := range c.ownSegments {
		errs = append(errs, seg.release(reg))
	}
	c.peerSegments, c.ownSegments = nil, nil
	return errors.Join(errs...)
}

// hostToken is a peer's token in shared memory, as the signalling side
// sees it.
type hostToken struct {
	word *uint64
	dev  uintptr // the same word for stream writes on this rank's GPU
}

func (t hostToken) store(v uint64) { atomic.StoreUint64(t.word, v) }
