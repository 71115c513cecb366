package channeltest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/devapi"
	"github.com/goep-dev/goep/internal/device"
)

// partner is this rank's ping-pong partner (ranks pair up 0-1, 2-3, ...;
// the last of an odd number sits out), -1 for none.
func (r *Rank) partner() int {
	p := r.me ^ 1
	if p >= r.n {
		return -1
	}
	return p
}

// pingpong runs the ping-pong kernel with peer and returns its output
// (rounds done, data mismatches, elapsed ns).
func (r *Rank) pingpong(peer int, rounds uint64, withData, relaxed bool, stage uint32) ([]uint64, error) {
	args := device.NewArgs(8).Ptr(r.Handles.Ptr()).U32(uint32(peer)).U64(rounds).U32(b2u(r.me < peer)).
		U32(b2u(withData)).U32(b2u(relaxed)).U32(stage).Ptr(r.out.Ptr)
	return r.launchOut(devapi.KernelChanPingPong, 1, 32, 3, args)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// CheckSignals checks that signals are neither lost nor duplicated:
//   - ping-pong between partners for rounds round trips, each carrying its
//     round number as data written before the signal (release/acquire,
//     then relaxed with explicit fences for rounds/10); afterwards each
//     side's token equals its expected counter;
//   - over a ring, a burst of burst release and burst relaxed signals is
//     consumed by as many waits and relaxed waits, then another burst by
//     polls, and the token equals the expected counter again.
func (r *Rank) CheckSignals(ctx context.Context, rounds, burst int) error {
	if r.n < 2 {
		return nil
	}
	if p := r.partner(); p >= 0 {
		for _, relaxed := range []bool{false, true} {
			n := uint64(rounds)
			if relaxed {
				n = max(n/10, 1)
			}
			out, err := r.pingpong(p, n, true, relaxed, 3)
			if err != nil {
				return r.errorf("ping-pong with rank %d (relaxed %v): %w", p, relaxed, err)
			}
			if out[0] != n || out[1] != 0 {
				return r.errorf("ping-pong with rank %d (relaxed %v): %d of %d rounds, %d carried the wrong data", p, relaxed, out[0], n, out[1])
			}
		}
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	if p := r.partner(); p >= 0 {
		if err := r.balanced(p); err != nil {
			return err
		}
	}
	// Every rank checks its tokens before anyone signals again.
	if err := r.barrier(ctx); err != nil {
		return err
	}
	to, from := r.ring(1)
	for _, phase := range []struct {
		name     string
		relaxed  uint32
		waitMode uint32
	}{{"signal/wait", 0, 0}, {"relaxed signal/relaxed wait", 1, 1}, {"signal/poll", 0, 2}} {
		args := device.NewArgs(5).Ptr(r.Handles.Ptr()).U32(devapi.MemoryChannelSize).U32(uint32(to)).U32(uint32(burst)).U32(phase.relaxed)
		if err := r.launch(devapi.KernelChanSemSignal, 1, 32, args); err != nil {
			return err
		}
		if err := r.clearOut(4); err != nil {
			return err
		}
		args = device.NewArgs(7).Ptr(r.Handles.Ptr()).U32(devapi.MemoryChannelSize).U32(uint32(from)).U32(uint32(burst)).
			U32(phase.waitMode).U32(4).Ptr(r.out.Ptr)
		if err := r.launch(devapi.KernelChanSemWait, 1, 32, args); err != nil {
			return err
		}
		if err := r.sync(); err != nil {
			return r.errorf("%s burst from rank %d: %w", phase.name, from, err)
		}
		out, err := r.readOut(4)
		if err != nil {
			return err
		}
		if out[0] != uint64(burst) {
			return r.errorf("%s burst from rank %d: consumed %d of %d signals", phase.name, from, out[0], burst)
		}
		if err := r.barrier(ctx); err != nil {
			return err
		}
		if err := r.balanced(from); err != nil {
			return r.errorf("after the %s burst: %w", phase.name, err)
		}
		if err := r.barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// balanced checks that every signal that reached this rank on its channel
// to peer was consumed exactly once (token == expected). Call when the
// peer has stopped signalling.
func (r *Rank) balanced(peer int) error {
	sem := r.ByRank[peer].Semaphore()
	in, err := sem.Inbound()
	if err != nil {
		return err
	}
	exp, err := sem.Expected()
	if err != nil {
		return err
	}
	if in != exp {
		return r.errorf("channel from rank %d: %d signals arrived but %d were consumed", peer, in, exp)
	}
	return nil
}

// CheckHostSemaphores checks host-to-device semaphores: every rank's host
// signals the next rank's device count times while that device already
// waits, and signals its own device through a loopback connection.
func (r *Rank) CheckHostSemaphores(ctx context.Context, tag, count int) error {
	to, from := r.ring(1)
	peers := []int{to}
	if from != to {
		peers = append(peers, from)
	}
	peers = append(peers, r.me) // loopback
	conns, err := r.Comm.ConnectAll(ctx, peers, tag)
	if err != nil {
		return err
	}
	sems, err := r.Comm.NewHostSemaphores(ctx, conns)
	if err != nil {
		return err
	}
	// Device side: wait on the semaphore from `from` and on the loopback.
	waitOn := []channels.Semaphore{sems[len(peers)-1]}
	if r.n > 1 {
		waitOn = append(waitOn, sems[indexOf(peers, from)])
	}
	arr, err := r.Comm.UploadSemaphores(waitOn)
	if err != nil {
		return err
	}
	defer arr.Close()
	if err := r.clearOut(4 * len(waitOn)); err != nil {
		return err
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	// The host backend runs a kernel inside Launch, so the waiting launch
	// goes to its own goroutine while this one signals.
	var wg sync.WaitGroup
	var launchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		args := device.NewArgs(7).Ptr(arr.Ptr()).U32(devapi.SemaphoreSize).U32(0).U32(uint32(count)).U32(0).U32(5).Ptr(r.out.Ptr)
		if launchErr = r.launch(devapi.KernelChanSemWait, len(waitOn), 32, args); launchErr == nil {
			launchErr = r.sync()
		}
	}()
	var signalErr error
	for i := 0; i < count && signalErr == nil; i++ {
		signalErr = sems[len(peers)-1].Signal()
		if signalErr == nil && r.n > 1 {
			signalErr = sems[0].Signal()
		}
	}
	wg.Wait()
	if err := errors.Join(signalErr, launchErr); err != nil {
		return r.errorf("host semaphores: %w", err)
	}
	out, err := r.readOut(4 * len(waitOn))
	if err != nil {
		return err
	}
	for b, s := range waitOn {
		if out[4*b] != uint64(count) || out[4*b+1] != uint64(count) {
			return r.errorf("host semaphore from rank %d: consumed %d of %d signals, token %d", s.Peer(), out[4*b], count, out[4*b+1])
		}
	}
	return r.barrier(ctx)
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// CheckCounterWait checks goep_wait_ge_u64 under the communicator's
// watchdog: a kernel waits for a counter in device memory that the host
// raises a moment later.
func (r *Rank) CheckCounterWait(ctx context.Context) error {
	// The counter is pinned host memory mapped into the device, raised by a
	// plain host store: no CUDA call is made while the wait spins. A host
	// copy into device memory would be stream work, and with ranks sharing a
	// GPU, streams beyond the hardware queues share in-order queues, so the
	// copy could sit behind a peer's spinning kernel that waits for its own
	// copy, which sits behind ours (seen: a stall of 8 ranks on one GPU).
	ctr, err := r.Dev.AllocHostMapped(8)
	if err != nil {
		return err
	}
	word := (*atomic.Uint64)(unsafe.Pointer(&ctr.Host[0]))
	word.Store(0)
	if err := r.clearOut(1); err != nil {
		return errors.Join(err, r.Dev.FreeHostMapped(ctr))
	}
	id := r.Comm.NewWaitID("test counter")
	var wg sync.WaitGroup
	var launchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		args := device.NewArgs(7).Ptr(ctr.Dev).U64(3).Ptr(r.Comm.Watchdog()).U32(id).U32(uint32(r.me)).U32(6).Ptr(r.out.Ptr)
		if launchErr = r.launch(devapi.KernelChanWaitValue, 1, 32, args); launchErr == nil {
			launchErr = r.sync()
		}
	}()
	time.Sleep(20 * time.Millisecond)
	word.Store(3)
	wg.Wait()
	// Every rank's wait ends before any rank frees its counter: freeing
	// pinned memory synchronizes the context, which ranks sharing a GPU share.
	err = r.barrier(ctx)
	if launchErr != nil {
		err = errors.Join(r.errorf("counter wait: %w", launchErr), err)
	}
	if err != nil {
		return errors.Join(err, r.Dev.FreeHostMapped(ctr))
	}
	if err := r.Dev.FreeHostMapped(ctr); err != nil {
		return err
	}
	out, err := r.readOut(1)
	if err != nil {
		return err
	}
	if out[0] != 1 {
		return r.errorf("counter wait gave up")
	}
	return nil
}

// sharedGPUInFlight bounds the launches a rank keeps queued when ranks
// share a GPU (collectives keep 32 calls in flight for the same reason).
const sharedGPUInFlight = 32

// CheckGraphPackets captures one LL exchange of generated data (words
// payload words each way between partners me^mask, for every power-of-two
// mask below the number of ranks) in a graph and replays it replays times:
// every replay must use a fresh flag (a stale packet would fail the
// kernel's own check) and the packet buffer's flag must advance by exactly
// replays. Partners both send and receive every replay, which is what lets
// a double buffer (goep_ll_half) absorb a partner running one replay ahead.
func (r *Rank) CheckGraphPackets(ctx context.Context, seed uint32, proto, words, replays int) error {
	for mask := 1; mask < r.n; mask <<= 1 {
		if err := r.graphPackets(ctx, seed, proto, words, replays, r.me^mask); err != nil {
			return err
		}
	}
	return nil
}

func (r *Rank) graphPackets(ctx context.Context, seed uint32, proto, words, replays, peer int) error {
	if peer >= r.n {
		return r.barrier(ctx) // no partner at this mask
	}
	pkt := devapi.LL16Size
	if proto == 8 {
		pkt = devapi.LL8Size
	}
	if words*pkt > r.Layout.HalfPackets {
		return r.errorf("graph packets: %d LL%d words do not fit half of the packet buffer", words, proto)
	}
	s, err := r.Dev.NewStream()
	if err != nil {
		return err
	}
	// The graph and the stream are freed only once every rank is done with
	// its replays (quiesce, below); on an error path nothing waits.
	var g device.Graph
	quiet := false
	defer func() {
		if !quiet {
			if g != nil {
				g.Close()
			}
			s.Close()
		}
	}()
	grid := r.spinGrid(min(max(words/4096, 1), 16))
	args := device.NewArgs(12).Ptr(r.Handles.Ptr()).U32(uint32(peer)).U32(uint32(peer)).U32(uint32(proto)).U32(uint32(r.me)).
		U64(uint64(words)).U64(0).U64(uint64(words * pkt)).U32(seed).U32(1).U32(7).Ptr(r.out.Ptr)
	// One plain launch first (the partner does the same, so the flags stay
	// in step): it loads the module outside the capture.
	if err := r.launch(devapi.KernelChanLLPattern, grid, 256, args); err != nil {
		return err
	}
	if err := r.sync(); err != nil {
		return err
	}
	if err := r.clearOut(4); err != nil {
		return err
	}
	before, err := r.Packets.Flag()
	if err != nil {
		return err
	}
	g, err = r.Dev.Capture(s, func() error {
		return r.Dev.Launch(devapi.KernelChanLLPattern, device.D1(grid), device.D1(256), 0, s, args)
	})
	if err != nil {
		return r.errorf("capture: %w", err)
	}
	if err := r.barrier(ctx); err != nil {
		return err
	}
	for i := 0; i < replays; i++ {
		if err := g.Launch(s); err != nil {
			return r.errorf("graph replay %d: %w", i, err)
		}
		// Ranks sharing a GPU share its hardware queues: a rank far ahead can
		// fill one with replays that wait for a peer whose own replays then
		// cannot be queued. Keep a bounded number in flight, as collectives do.
		if r.shared && i%sharedGPUInFlight == sharedGPUInFlight-1 {
			if err := s.Synchronize(); err != nil {
				return r.errorf("graph replays: %w", err)
			}
		}
	}
	if err := s.Synchronize(); err != nil {
		return r.errorf("graph replays: %w", err)
	}
	if err := r.Comm.Check(); err != nil {
		return err
	}
	out, err := r.readOut(4)
	if err != nil {
		return err
	}
	if out[0] != 0 || out[1] != 0 {
		return r.errorf("LL%d graph replays with rank %d: %d wrong words, %d threads gave up", proto, peer, out[0], out[1])
	}
	after, err := r.Packets.Flag()
	if err != nil {
		return err
	}
	want := before
	for i := 0; i < replays; i++ {
		want = flagNext(want)
	}
	if after != want {
		return r.errorf("LL%d graph replays with rank %d: packet flag went from %d to %d, want %d", proto, peer, before, after, want)
	}
	return r.quiesce(ctx, func() error { quiet = true; return errors.Join(g.Close(), s.Close()) })
}

// quiesce frees resources (free) between two barriers, so that no rank has
// a kernel in flight while any rank frees: on a GPU that ranks share, CUDA
// may serialise streams around a free (or an allocation), and a spinning
// kernel whose peer's launch is held behind it would wait until its
// timeout (ARCHITECTURE.md, "Ranks sharing a GPU").
func (r *Rank) quiesce(ctx context.Context, free func() error) error {
	if err := r.barrier(ctx); err != nil {
		return err
	}
	err := free()
	return errors.Join(err, r.barrier(ctx))
}
