package plan

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// hostRank is what persists for a rank across launches: its scratch.
type hostRank struct {
	res     *Resolved
	scratch []byte // 8-byte aligned (packets are read and written as atomic words)
}

func newHostRank(res *Resolved) *hostRank {
	words := make([]uint64, (res.ScratchBytes+7)/8)
	var s []byte
	if len(words) > 0 {
		s = unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), res.ScratchBytes)
	}
	return &hostRank{res: res, scratch: s}
}

// hostLaunch is one launch: the buffers, the flag and every
// synchronization object (counters start at zero each launch: launches on
// the host are separated by a join of every goroutine, so nothing carries
// over but scratch contents).
type hostLaunch struct {
	w       *HostWorld
	dt      DataType
	flag    uint32
	in, out [][]byte

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
	first  error

	chans    [][2][]chanState // [rank][memory, port][channel]
	barriers [][MaxBarriers]hostBarrier
	sems     [][]atomic.Int64
	proxies  []*proxy
}

// chanState is one channel end: signals received, and waits done.
type chanState struct {
	inbound  atomic.Uint64
	expected atomic.Uint64
}

// errAborted marks blocks stopped because another one failed.
var errAborted = errors.New("aborted: another threadblock failed")

// ErrTimeout is wrapped by every timeout of the host interpreter (a wait
// of a threadblock, the proxy's FIFO and flush, a rank that never joined a
// launch), for errors.Is.
var ErrTimeout = errors.New("timed out")

func (l *hostLaunch) run(parent context.Context) error {
	w := l.w
	l.ctx, l.cancel = context.WithCancel(parent)
	defer l.cancel()
	W := len(w.res)
	l.chans = make([][2][]chanState, W)
	l.barriers = make([][MaxBarriers]hostBarrier, W)
	l.sems = make([][]atomic.Int64, W)
	l.proxies = make([]*proxy, W)
	for r, res := range w.res {
		l.chans[r][0] = make([]chanState, len(res.MemoryChannels))
		l.chans[r][1] = make([]chanState, len(res.PortChannels))
		l.sems[r] = make([]atomic.Int64, len(res.Semaphores))
		for i, v := range res.Semaphores {
			l.sems[r][i].Store(v)
		}
		l.proxies[r] = newProxy(l, r)
	}
	var proxiesDone sync.WaitGroup
	for _, p := range l.proxies {
		proxiesDone.Add(1)
		go func() { defer proxiesDone.Done(); p.serve() }()
	}
	var blocks sync.WaitGroup
	for r, res := range w.res {
		for b := range res.Blocks {
			blocks.Add(1)
			go func() {
				defer blocks.Done()
				if err := l.runBlock(r, &res.Blocks[b]); err != nil {
					l.fail(err)
				}
			}()
		}
	}
	blocks.Wait()
	for _, p := range l.proxies {
		p.close()
	}
	proxiesDone.Wait()
	if l.first != nil {
		return l.first
	}
	return parent.Err()
}

// fail records the first real error and stops every other wait.
func (l *hostLaunch) fail(err error) {
	if errors.Is(err, errAborted) {
		return
	}
	l.once.Do(func() {
		l.first = err
		l.cancel()
	})
}

// wait spins (then sleeps) until cond holds, bounded by the timeout and the
// launch's cancellation. what says what it waited for.
func (l *hostLaunch) wait(cond func() bool, what func() string) error {
	if cond() {
		return nil
	}
	start := time.Now()
	for i := 0; ; i++ {
		if cond() {
			return nil
		}
		if l.ctx.Err() != nil {
			return errAborted
		}
		if waited := time.Since(start); waited > l.w.cfg.Timeout {
			return fmt.Errorf("%w after %s waiting for %s", ErrTimeout, l.w.cfg.Timeout, what())
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(min(time.Duration(i)*time.Microsecond, time.Millisecond))
		}
	}
}

// hostBarrier is a reusable barrier among n blocks of one rank.
type hostBarrier struct {
	mu      sync.Mutex
	n       int
	arrived int
	gen     atomic.Uint64
}

func (l *hostLaunch) barrier(rank int, id uint8, n int) error {
	b := &l.barriers[rank][id]
	b.mu.Lock()
	if b.arrived > 0 && b.n != n {
		b.mu.Unlock()
		return fmt.Errorf("barrier %d: blocks disagree on num_threadblocks (%d and %d)", id, b.n, n)
	}
	b.n = n
	gen := b.gen.Load()
	b.arrived++
	if b.arrived == n {
		b.arrived = 0
		b.gen.Add(1)
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	return l.wait(func() bool { return b.gen.Load() != gen }, func() string {
		return fmt.Sprintf("barrier %d (%d blocks)", id, n)
	})
}

// scratch is rank's scratch as this launch sees it (the current half).
func (l *hostLaunch) scratch(rank int) []byte {
	res := l.w.res[rank]
	s := l.w.ranks[rank].scratch
	if res.ScratchHalf != 0 && l.flag%2 == 0 {
		return s[res.ScratchHalf:]
	}
	return s
}

// buffer is rank's buffer of kind k.
func (l *hostLaunch) buffer(rank int, k BufKind) []byte {
	switch k {
	case BufInput:
		return l.in[rank]
	case BufOutput:
		return l.out[rank]
	case BufScratch:
		return l.scratch(rank)
	}
	return nil
}

// locate finds the rank and buffer an operand of rank's block b addresses.
func (l *hostLaunch) locate(rank int, b *Block, o *Operand) (owner int, buf []byte) {
	res := l.w.res[rank]
	switch o.Kind {
	case BufRemoteMemory:
		pb := res.RemoteBuffers[b.MemoryBuffers[o.Remote]]
		return pb.Rank, l.buffer(pb.Rank, pb.Kind)
	case BufRemotePort:
		pb := res.RemoteBuffers[b.PortBuffers[o.Remote]]
		return pb.Rank, l.buffer(pb.Rank, pb.Kind)
	}
	return rank, l.buffer(rank, o.Kind)
}

// span checks that [off, off+n) lies in buf.
func span(buf []byte, off, n uint64, o *Operand) error {
	if n == 0 {
		return nil
	}
	if off > uint64(len(buf)) || n > uint64(len(buf))-off {
		return fmt.Errorf("operand %s [%d, +%d) is past the buffer's %d bytes", o.Target, off, n, len(buf))
	}
	return nil
}

// ErrNil is returned by methods called on a nil *Plan, *HostWorld,
// *Registry or *Entry.
var ErrNil = errors.New("plan: nil receiver")
