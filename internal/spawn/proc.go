package spawn

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// child is one running rank.
type child struct {
	rank  int
	cmd   *exec.Cmd
	pipes []*os.File // read ends of stdout and stderr
}

type job struct {
	opts     Options
	out      *output
	children []*child
	readers  sync.WaitGroup

	blameMu sync.Mutex
	blames  map[int]int // rank -> the peer its output said was gone
}

// peerGone matches the bootstrap's report of a dead peer ("peer rank N is
// gone"): a rank that printed it most likely failed because of rank N.
var peerGone = regexp.MustCompile(`peer rank (\d+) is gone`)

// noteLine records whom a rank's output blames.
func (j *job) noteLine(rank int, line []byte) {
	if !bytes.Contains(line, []byte("is gone")) {
		return
	}
	m := peerGone.FindSubmatch(line)
	if m == nil {
		return
	}
	peer, err := strconv.Atoi(string(m[1]))
	if err != nil || peer == rank {
		return
	}
	j.blameMu.Lock()
	defer j.blameMu.Unlock()
	if j.blames == nil {
		j.blames = map[int]int{}
	}
	if _, seen := j.blames[rank]; !seen {
		j.blames[rank] = peer
	}
}

// blamed is the peer rank's output blamed (-1: none).
func (j *job) blamed(rank int) int {
	j.blameMu.Lock()
	defer j.blameMu.Unlock()
	if p, ok := j.blames[rank]; ok {
		return p
	}
	return -1
}

// start launches rank in its own process group, so that signalling the group
// reaches whatever it spawned, and so that a terminal's Ctrl-C reaches the
// launcher only, which forwards it.
func (j *job) start(rank int, env []string) error {
	cmd := exec.Command(j.opts.Executable, j.opts.Args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// If the launcher dies without cleaning up (SIGKILL), take the
		// child with it. (Go does not retire the OS threads that fork.)
		Pdeathsig: syscall.SIGKILL,
	}
	c := &child{rank: rank, cmd: cmd}
	prefix := fmt.Sprintf("[rank %d] ", rank)
	// Our copies of the write ends must be closed once the child has its
	// own, or the readers would never see EOF.
	var writeEnds []*os.File
	defer func() {
		for _, f := range writeEnds {
			f.Close()
		}
	}()
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			c.closePipes()
			return err
		}
		c.pipes = append(c.pipes, r)
		writeEnds = append(writeEnds, w)
	}
	cmd.Stdout, cmd.Stderr = writeEnds[0], writeEnds[1]
	if err := cmd.Start(); err != nil {
		c.closePipes()
		return err
	}
	j.children = append(j.children, c)
	for i, r := range c.pipes {
		w := j.opts.Stdout
		if i == 1 {
			w = j.opts.Stderr
		}
		j.readers.Add(1)
		go func() {
			defer j.readers.Done()
			j.out.copyLinesNoting(r, w, prefix, func(line []byte) { j.noteLine(rank, line) })
		}()
	}
	return nil
}

func (c *child) closePipes() {
	for _, f := range c.pipes {
		f.Close()
	}
}

// signalAll signals every child's process group, including groups whose
// leader already exited: their descendants may still be there.
func (j *job) signalAll(sig syscall.Signal) {
	for _, c := range j.children {
		syscall.Kill(-c.cmd.Process.Pid, sig) // ESRCH: the group is gone
	}
}

// abort kills whatever was started when starting the job failed midway.
func (j *job) abort() {
	j.signalAll(syscall.SIGKILL)
	for _, c := range j.children {
		c.cmd.Wait()
	}
	j.drain()
}

type exitInfo struct {
	rank  int
	state *os.ProcessState
}

// supervise waits for every child, stopping the job on the first failure or
// when ctx ends, and reports the outcome.
func (j *job) supervise(ctx context.Context) error {
	exits := make(chan exitInfo, len(j.children))
	for _, c := range j.children {
		go func() {
			c.cmd.Wait() // the state carries the outcome; the error adds nothing
			exits <- exitInfo{c.rank, c.cmd.ProcessState}
		}()
	}
	var (
		failure   *RankError
		interrupt error
		stopping  bool
		stopBy    time.Time
		killTimer <-chan time.Time
		running   = len(j.children)
		ctxDone   = ctx.Done()
		// Failures seen before the job is stopped, in the order reaped; the
		// settle timer runs from the first.
		failed      []exitInfo
		settleTimer <-chan time.Time
	)
	stop := func(sig syscall.Signal) {
		stopping = true
		stopBy = time.Now().Add(j.opts.GracePeriod)
		killTimer = time.After(j.opts.GracePeriod)
		j.signalAll(sig)
	}
	for running > 0 {
		select {
		case e := <-exits:
			running--
			if !stopping && !e.state.Success() {
				failed = append(failed, e)
				if settleTimer == nil {
					settleTimer = time.After(j.opts.Settle)
				}
			}
		case <-settleTimer:
			settleTimer = nil
			if !stopping {
				failure = j.culprit(failed, running, len(j.children)-1)
				stop(syscall.SIGTERM)
			}
		case <-ctxDone:
			ctxDone = nil
			if !stopping && len(failed) > 0 {
				failure = j.culprit(failed, running, len(j.children)-1)
			}
			if !stopping {
				interrupt = ctx.Err()
				stop(forwardedSignal(ctx))
			}
		case <-killTimer:
			killTimer = nil
			j.signalAll(syscall.SIGKILL)
		}
	}
	if failure == nil && len(failed) > 0 {
		// Every rank ended within the settle window.
		failure = j.culprit(failed, 0, len(j.children)-1)
	}
	if stopping {
		j.reapGroups(stopBy)
	}
	j.drain()
	switch {
	case failure != nil:
		return failure
	case interrupt != nil:
		cause := context.Cause(ctx)
		return fmt.Errorf("launch: %w (%v); stopped %d %s: %w", errInterrupted, cause, len(j.children), plural(len(j.children), "rank"), interrupt)
	}
	return nil
}

// reapGroups waits, until the grace deadline, for the descendants left in the
// children's process groups to go, then kills what remains.
func (j *job) reapGroups(deadline time.Time) {
	for time.Now().Before(deadline) {
		alive := false
		for _, c := range j.children {
			if groupAlive(c.cmd.Process.Pid) {
				alive = true
				break
			}
		}
		if !alive {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	j.signalAll(syscall.SIGKILL)
}

// drainTimeout bounds how long output is read after the children exited: a
// descendant that outlives its rank may keep the pipe open indefinitely.
const drainTimeout = 2 * time.Second

func (j *job) drain() {
	done := make(chan struct{})
	go func() {
		j.readers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(drainTimeout):
	}
	for _, c := range j.children {
		c.closePipes() // unblocks readers still waiting
	}
	<-done
}

// culprit picks, among the failures seen before the job was stopped, the
// rank that most likely failed for a reason of its own: not one whose
// output said a failed peer was gone; then one killed by a signal (the
// launcher had sent none yet: a crash or the OOM killer) over one that
// exited with a status; then the first reaped. The others are listed in
// Also.
func (j *job) culprit(failed []exitInfo, stopped, others int) *RankError {
	isFailed := map[int]bool{}
	for _, e := range failed {
		isFailed[e.rank] = true
	}
	score := func(e exitInfo) int {
		s := 0
		if p := j.blamed(e.rank); p < 0 || !isFailed[p] {
			s += 2
		}
		if signaled(e) {
			s++
		}
		return s
	}
	pick := 0
	for i, e := range failed {
		if score(e) > score(failed[pick]) {
			pick = i
		}
	}
	re := rankError(failed[pick], stopped, others)
	for i, e := range failed {
		if i != pick {
			re.Also = append(re.Also, e.rank)
		}
	}
	return re
}

func signaled(e exitInfo) bool {
	ws, ok := e.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

func rankError(e exitInfo, stopped, others int) *RankError {
	re := &RankError{Rank: e.rank, ExitCode: e.state.ExitCode(), Stopped: stopped, Others: others}
	if ws, ok := e.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		re.Signal = ws.Signal()
	}
	return re
}

// forwardedSignal picks what to send the children when ctx ends: SIGINT if
// ctx came from signal.NotifyContext and an interrupt ended it (its cause
// then reads "interrupt signal received"), SIGTERM otherwise.
func forwardedSignal(ctx context.Context) syscall.Signal {
	if cause := context.Cause(ctx); cause != nil && cause.Error() == syscall.SIGINT.String()+" signal received" {
		return syscall.SIGINT
	}
	return syscall.SIGTERM
}
