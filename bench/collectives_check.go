package bench

import (
	"github.com/goep-dev/goep/collectives/colltest"
)

// checkOnce runs one call of cs on fresh data and checks the whole output
// on the device; it returns the algorithm that ran.
func (r *collRun) checkOnce(cs colltest.Case) (string, error) {
	if err := r.b.Prepare(cs, r.s); err != nil {
		return "", err
	}
	if err := r.s.Synchronize(); err != nil {
		return "", err
	}
	if err := r.c.Barrier(r.ctx); err != nil {
		return "", err
	}
	w, err := r.b.Issue(r.ctx, cs, r.s)
	if err != nil {
		return "", err
	}
	if err := r.b.VerifyDevice(cs, r.s); err != nil {
		return "", err
	}
	return w.Algorithm(), w.Err()
}

// allPassed tells every rank whether every rank's check passed, so that
// all time the same things (a rank that skips a call would hang the
// others).
func (r *collRun) allPassed(ok bool) (bool, error) {
	v := byte(0)
	if ok {
		v = 1
	}
	all, err := r.c.Bootstrap().AllGather(r.ctx, []byte{v})
	if err != nil {
		return false, err
	}
	for _, b := range all {
		if len(b) != 1 || b[0] != 1 {
			return false, nil
		}
	}
	return true, nil
}
