package bench

import (
	"errors"
	"flag"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// Helpers of the subcommands that run goroutine ranks (intranode,
// lowlatency).

// parseBackend parses args, then resolves --backend and --gpus: the device
// kind and the set of flags given on the command line.
func parseBackend(fs *flag.FlagSet, args []string, backend *string, gpus *gpusFlag) (device.Kind, map[string]bool, error) {
	if err := parse(fs, args); err != nil {
		return "", nil, err
	}
	kind, _, err := device.ParseKind(*backend)
	if err != nil {
		return "", nil, err
	}
	if err := gpus.apply(kind); err != nil {
		return "", nil, err
	}
	return kind, given(fs), nil
}

// onGoroutineRanks runs f for every rank on a goroutine of its own with the
// rank's device open (device.OpenRank, closed after f) and returns each
// rank's error. A rank whose device does not open or whose f fails closes
// its bootstrap, so that the others fail fast instead of waiting for it.
func onGoroutineRanks(kind device.Kind, boots []bootstrap.Bootstrap, f func(r int, dev device.Device) error) []error {
	errs := make([]error, len(boots))
	var wg sync.WaitGroup
	for r := range boots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer boots[r].Close()
			dev, err := device.OpenRank(kind, r)
			if err != nil {
				errs[r] = err
				_ = boots[r].Close()
				return
			}
			defer dev.Close()
			if errs[r] = f(r, dev); errs[r] != nil {
				_ = boots[r].Close()
			}
		}()
	}
	wg.Wait()
	return errs
}

// errRankLeft is what lockstep answers once a rank has left.
var errRankLeft = errors.New("another rank failed")

// lockstep is a reusable barrier of goroutine ranks that also agrees on a
// verdict: every rank issues a step before any issues the next, which
// ranks sharing a GPU need (a launch waiting on a peer must not be queued
// ahead of that peer's launch in a shared hardware queue; lowlatency's
// DESIGN.md), and every rank takes the same branch after a check. A rank
// that fails calls leave, so that no rank waits for it for ever.
type lockstep struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n       int
	arrived int
	gen     uint64
	acc     bool // the running AND of this round's verdicts
	last    bool // the previous round's
	left    bool
}

func newLockstep(n int) *lockstep {
	l := &lockstep{n: n, acc: true}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// all waits until every rank has arrived and reports whether every rank
// passed ok; errRankLeft once a rank has left.
func (l *lockstep) all(ok bool) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left {
		return false, errRankLeft
	}
	l.acc = l.acc && ok
	l.arrived++
	if l.arrived == l.n {
		l.last, l.acc, l.arrived = l.acc, true, 0
		l.gen++
		l.cond.Broadcast()
		return l.last, nil
	}
	for gen := l.gen; gen == l.gen && !l.left; {
		l.cond.Wait()
	}
	if l.left {
		return false, errRankLeft
	}
	return l.last, nil
}

// leave fails every wait from now on.
func (l *lockstep) leave() {
	l.mu.Lock()
	l.left = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// timingDefaults are the defaults of --warmup and --iters, on GPUs and on
// the host backend.
type timingDefaults struct{ warmup, iters, hostWarmup, hostIters int }

// addTimingFlags registers --warmup, --iters and --flush-mib (DeepEP's
// timing rules) into the given fields and returns what applies the host
// backend's defaults (fewer calls, no flush: its timings only show that
// timing works) to those not given on the command line.
func addTimingFlags(fs *flag.FlagSet, warmup, iters, flushMiB *int, d timingDefaults) func(kind device.Kind, set map[string]bool) {
	fs.IntVar(warmup, "warmup", d.warmup, fmt.Sprintf("untimed calls before the timed ones (host backend: %d unless given)", d.hostWarmup))
	fs.IntVar(iters, "iters", d.iters, fmt.Sprintf("timed calls, each between its own two events, back to back; the first is dropped (host backend: %d unless given)", d.hostIters))
	fs.IntVar(flushMiB, "flush-mib", 256, "MiB zeroed to flush L2 after the warm-ups (0: none; host backend: 0 unless given)")
	return func(kind device.Kind, set map[string]bool) {
		if kind != device.Host {
			return
		}
		if !set["warmup"] {
			*warmup = d.hostWarmup
		}
		if !set["iters"] {
			*iters = d.hostIters
		}
		if !set["flush-mib"] {
			*flushMiB = 0
		}
	}
}
