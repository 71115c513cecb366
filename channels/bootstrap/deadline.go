package bootstrap

import (
	"context"
	"errors"
	"net"
	"time"
)

// aLongTimeAgo is a deadline in the past, to make blocked I/O return now.
var aLongTimeAgo = time.Unix(1, 0)

// within runs fn with a deadline installed by set (SetDeadline or
// SetWriteDeadline), cutting it short when ctx ends, and clears the deadline
// afterwards. It waits for the ctx hook to finish so that the hook cannot
// clobber a deadline a later caller installs.
func within(ctx context.Context, set func(time.Time) error, d time.Time, fn func() error) error {
	set(d)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		set(aLongTimeAgo)
		close(fired)
	})
	err := fn()
	if !stop() {
		<-fired
	}
	set(time.Time{})
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
