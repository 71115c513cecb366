package core

import (
	"context"
	"sync"

	"github.com/goep-dev/goep/collectives/nccl"
)

// NCCL's groups belong to a thread: calls between ncclGroupStart and the
// matching ncclGroupEnd are queued and issued together at the end. The C
// layer names the thread (pthread_self); Go tests name their goroutines.
var groups struct {
	mu sync.Mutex
	m  map[uint64]*group
}

type group struct {
	depth int
	calls []queued
}

type queued struct {
	c *Comm
	x Call
}

// GroupStart opens (or nests) thread tid's group.
func GroupStart(tid uint64) {
	groups.mu.Lock()
	defer groups.mu.Unlock()
	if groups.m == nil {
		groups.m = map[uint64]*group{}
	}
	g := groups.m[tid]
	if g == nil {
		g = &group{}
		groups.m[tid] = g
	}
	g.depth++
}

// InGroup reports whether thread tid has a group open.
func InGroup(tid uint64) bool {
	groups.mu.Lock()
	defer groups.mu.Unlock()
	g := groups.m[tid]
	return g != nil && g.depth > 0
}

// queue adds x to thread tid's open group; false when none is open.
func queue(tid uint64, c *Comm, x Call) bool {
	groups.mu.Lock()
	defer groups.mu.Unlock()
	g := groups.m[tid]
	if g == nil || g.depth == 0 {
		return false
	}
	g.calls = append(g.calls, queued{c, x})
	return true
}

// GroupEnd closes thread tid's group; the outermost end issues its calls.
// NCCL's semantics: when any call must go to NCCL, the whole group goes to
// NCCL as one NCCL group (its sends and receives may depend on each other);
// otherwise each communicator's calls run in order, communicators
// concurrently (one thread may drive several ranks), sends first so that
// staged receives find their data.
func GroupEnd(tid uint64) error {
	groups.mu.Lock()
	g := groups.m[tid]
	if g == nil || g.depth == 0 {
		groups.mu.Unlock()
		return errorf(InvalidUsage, "ncclGroupEnd without ncclGroupStart")
	}
	g.depth--
	if g.depth > 0 {
		groups.mu.Unlock()
		return nil
	}
	calls := g.calls
	delete(groups.m, tid)
	groups.mu.Unlock()
	if len(calls) == 0 {
		return nil
	}
	return runGroup(calls)
}

func runGroup(calls []queued) error {
	// Lock each communicator once, in a fixed order.
	var comms []*Comm
	byComm := map[*Comm][]Call{}
	for _, q := range calls {
		if _, ok := byComm[q.c]; !ok {
			comms = append(comms, q.c)
		}
		byComm[q.c] = append(byComm[q.c], q.x)
	}
	for _, c := range comms {
		c.mu.Lock()
	}
	defer func() {
		for _, c := range comms {
			c.mu.Unlock()
		}
	}()
	for _, c := range comms {
		if c.closed {
			return errorf(InvalidArgument, "ncclGroupEnd: a communicator of the group (rank %d) is destroyed", c.rank)
		}
	}
	ctx, cancel := background()
	defer cancel()

	decisions := map[*Comm][]decision{}
	toNCCL := false
	for _, c := range comms {
		for _, x := range byComm[c] {
			d := c.decide(x)
			toNCCL = toNCCL || d.path == PathNCCL
			decisions[c] = append(decisions[c], d)
		}
	}
	if toNCCL {
		if handled, err := forwardGroup(ctx, comms, byComm); handled {
			return err
		}
	}
	// Natively (or, without NCCL, each call on its own fallback).
	return eachComm(comms, func(c *Comm) error {
		xs, ds := byComm[c], decisions[c]
		var first error
		for pass := 0; pass < 2; pass++ { // sends, then the rest
			for j, x := range xs {
				if (x.Kind == Send) != (pass == 0) {
					continue
				}
				if err := c.run(ctx, x, ds[j]); err != nil && first == nil {
					first = err
				}
			}
		}
		return first
	})
}

// forwardGroup issues the whole group on NCCL. handled is false when some
// communicator cannot have NCCL (then nothing was issued).
func forwardGroup(ctx context.Context, comms []*Comm, byComm map[*Comm][]Call) (handled bool, err error) {
	// Setting NCCL up is collective over each communicator's ranks, so it
	// is not done for a group of sends and receives on a larger
	// communicator (its other ranks are not here); run falls back.
	for _, c := range comms {
		if c.ncclComm == nil && !c.ncclTried && c.size > 2 && allP2P(byComm[c]) {
			return false, nil
		}
	}
	// This one thread may drive several communicators: concurrently.
	eachComm(comms, func(c *Comm) error { return c.ensureNCCL(ctx) })
	for _, c := range comms {
		if c.ensureNCCL(ctx) != nil {
			return false, nil
		}
	}
	issue := func(c *Comm) error {
		for _, x := range byComm[c] {
			if err := c.forward(x); err != nil {
				return errorf(InternalError, "rank %d: %s in a group: %v", c.rank, x, err)
			}
			c.counts[x.Kind][PathNCCL].Add(1)
		}
		return nil
	}
	if err := nccl.GroupStart(); err != nil {
		// An NCCL without groups (the test stand-in): each call on its
		// own, as the caller does when NCCL is missing.
		return false, nil
	}
	var errs []error
	for _, c := range comms {
		if err := issue(c); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if err := nccl.GroupEnd(); err != nil {
		errs = append(errs, errorf(InternalError, "ncclGroupEnd: %v", err))
	}
	if len(errs) > 0 {
		return true, errs[0]
	}
	return true, nil
}

// eachComm runs fn for every communicator, concurrently when there are
// several, and returns the first error.
func eachComm(comms []*Comm, fn func(c *Comm) error) error {
	if len(comms) == 1 {
		return fn(comms[0])
	}
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func allP2P(xs []Call) bool {
	for _, x := range xs {
		if x.Kind != Send && x.Kind != Recv {
			return false
		}
	}
	return true
}
