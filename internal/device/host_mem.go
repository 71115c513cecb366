package device

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"syscall"
)

// The host backend's memory is process memory, so a bad pointer there is
// not a GPU fault the driver reports but a SIGSEGV that ends the process,
// and a range past an allocation reads a neighbour silently. hostMem is
// the process-wide table of live host-backend allocations (of every rank's
// device: ranks share memory by handing over addresses), so that the host
// backend can check ranges as the CUDA path does with the driver's pointer
// queries, and so that memory is unmapped only when nothing can still be
// reading it:
//
//   - an allocation that a peer imported stays mapped until the last
//     importer closes its import (or its device), whatever the owner does;
//   - an allocation freed while a host kernel or copy is running stays
//     mapped until every operation that began before the free has ended
//     (a generation count: operations that begin after the free cannot
//     find the allocation any more).
var hostMem = struct {
	sync.Mutex
	regions   []*hostRegion // sorted by lo
	gen       uint64        // bumped by every release
	active    map[uint64]int
	graveyard []*hostRegion
}{active: map[uint64]int{}}

type hostRegion struct {
	lo, hi   uintptr
	mem      []byte
	owner    *hostDevice
	imports  int    // live imports by any device
	released bool   // freed by its owner (or its owner closed)
	freedAt  uint64 // generation at release
}

// ErrBadPointer is wrapped by host-backend errors for a range that is not
// inside one live allocation.
var ErrBadPointer = fmt.Errorf("not inside one live allocation")

// checkedEnd is p+n, failing on a negative n or a range that wraps.
func checkedEnd(p uintptr, n int) (uintptr, error) {
	if n < 0 {
		return 0, fmt.Errorf("negative length %d", n)
	}
	if uint64(n) > math.MaxUint64-uint64(p) {
		return 0, fmt.Errorf("[%#x, +%d) wraps around the address space", p, n)
	}
	return p + uintptr(n), nil
}

// findLocked is the live region holding p (nil when none).
func hostFindLocked(p uintptr) *hostRegion {
	rs := hostMem.regions
	i := sort.Search(len(rs), func(i int) bool { return rs[i].hi > p })
	if i < len(rs) && rs[i].lo <= p && !rs[i].released {
		return rs[i]
	}
	return nil
}

func hostAdd(r *hostRegion) {
	hostMem.Lock()
	defer hostMem.Unlock()
	rs := hostMem.regions
	i := sort.Search(len(rs), func(i int) bool { return rs[i].lo >= r.lo })
	rs = append(rs, nil)
	copy(rs[i+1:], rs[i:])
	rs[i] = r
	hostMem.regions = rs
}

// hostRangeCheck checks that [p, p+n) lies inside one live allocation.
func hostRangeCheck(p uintptr, n int) error {
	end, err := checkedEnd(p, n)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	hostMem.Lock()
	r := hostFindLocked(p)
	hostMem.Unlock()
	if r == nil {
		return fmt.Errorf("[%#x, +%d) is %w of the host backend (unallocated, freed or not device memory)", p, n, ErrBadPointer)
	}
	if end > r.hi {
		return fmt.Errorf("[%#x, +%d) runs %d bytes past the end of its allocation [%#x, +%d): %w", p, n, end-r.hi, r.lo, r.hi-r.lo, ErrBadPointer)
	}
	return nil
}

// hostEnter marks the start of an operation that touches host-backend
// memory; hostExit(gen) its end.
func hostEnter() uint64 {
	hostMem.Lock()
	defer hostMem.Unlock()
	g := hostMem.gen
	hostMem.active[g]++
	return g
}

func hostExit(g uint64) {
	hostMem.Lock()
	if hostMem.active[g]--; hostMem.active[g] <= 0 {
		delete(hostMem.active, g)
	}
	dead := hostSweepLocked()
	hostMem.Unlock()
	unmapAll(dead)
}

// hostReleaseLocked takes r out of use; it is unmapped now or later
// (hostSweepLocked decides). It returns what may be unmapped now.
func hostReleaseLocked(r *hostRegion) []*hostRegion {
	r.released = true
	r.freedAt = hostMem.gen
	hostMem.gen++
	hostMem.graveyard = append(hostMem.graveyard, r)
	return hostSweepLocked()
}

// hostSweepLocked removes and returns the released regions nothing can
// still read: no import left and no operation begun before the release.
func hostSweepLocked() []*hostRegion {
	if len(hostMem.graveyard) == 0 {
		return nil
	}
	oldest := uint64(math.MaxUint64)
	for g := range hostMem.active {
		oldest = min(oldest, g)
	}
	var dead []*hostRegion
	keep := hostMem.graveyard[:0]
	for _, r := range hostMem.graveyard {
		if r.imports == 0 && r.freedAt < oldest {
			dead = append(dead, r)
		} else {
			keep = append(keep, r)
		}
	}
	hostMem.graveyard = keep
	if len(dead) > 0 {
		rs := hostMem.regions[:0]
		for _, r := range hostMem.regions {
			if !contains(dead, r) {
				rs = append(rs, r)
			}
		}
		hostMem.regions = rs
	}
	return dead
}

func contains(list []*hostRegion, r *hostRegion) bool {
	for _, x := range list {
		if x == r {
			return true
		}
	}
	return false
}

func unmapAll(rs []*hostRegion) {
	for _, r := range rs {
		_ = syscall.Munmap(r.mem) // unmapping a mapping we made fails only on a bad address
	}
}

// CheckRange reports whether [p, p+n) lies inside one live allocation of
// this device, as the CUDA path requires memory of the rank's own GPU:
// what the upper layers check before they hand a caller's pointer to a
// kernel twin. A peer's memory (even imported) is refused, naming its
// owner. n == 0 always passes.
func (d *hostDevice) CheckRange(p uintptr, n int) error {
	if err := hostRangeCheck(p, n); err != nil {
		return d.errorf("%w", err)
	}
	if n == 0 {
		return nil
	}
	hostMem.Lock()
	r := hostFindLocked(p)
	hostMem.Unlock()
	if r != nil && r.owner != d {
		return d.errorf("[%#x, +%d) is memory of host rank %d, not this rank's: %w", p, n, r.owner.ordinal, ErrBadPointer)
	}
	return nil
}

// RangeChecker is implemented by backends that know their allocations
// (the host backend): CheckRange fails unless [p, p+n) lies inside one
// live allocation. The CUDA path asks the driver instead.
type RangeChecker interface {
	CheckRange(p uintptr, n int) error
}
