package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// NewInProcess returns size connected Bootstraps for goroutine ranks of one
// process; result[r] is rank r. cfg.Rank, cfg.Size (if non-zero it must equal
// size), cfg.RootAddr and cfg.ListenHost are not used; cfg.Timeout and
// cfg.UniqueID (random if empty) are. Each rank must be closed.
func NewInProcess(size int, cfg Config) ([]Bootstrap, error) {
	if size < 1 {
		return nil, fmt.Errorf("bootstrap: in-process size %d must be at least 1", size)
	}
	if cfg.Size != 0 && cfg.Size != size {
		return nil, fmt.Errorf("bootstrap: in-process size %d disagrees with Config.Size %d", size, cfg.Size)
	}
	timeout, err := resolveTimeout(cfg.Timeout)
	if err != nil {
		return nil, err
	}
	uid := cfg.UniqueID
	if uid == "" {
		uid = NewUniqueID()
	} else if err := validateUniqueID(uid); err != nil {
		return nil, err
	}
	members := make([]*core, size)
	for r := range members {
		members[r] = &core{
			rank: r, size: size, uid: uid, timeout: timeout,
			in: newInbox[[]byte](size),
			tr: &inprocTransport{rank: r, members: members},
		}
	}
	out := make([]Bootstrap, size)
	for r, m := range members {
		out[r] = m
	}
	return out, nil
}

var errClosedItsBootstrap = errors.New("it closed its bootstrap")

// inprocTransport delivers by pushing straight into the peer's inbox.
type inprocTransport struct {
	rank    int
	members []*core
}

func (t *inprocTransport) send(_ context.Context, _ time.Time, peer int, tag int64, data []byte) error {
	if !t.members[peer].in.push(t.rank, tag, clone(data)) {
		return &PeerClosedError{Rank: peer, Err: errClosedItsBootstrap}
	}
	return nil
}

// close tells every other rank we are gone, which fails their waits on us
// (after they have drained what we sent).
func (t *inprocTransport) close() error {
	for r, m := range t.members {
		if r != t.rank {
			m.in.failPeer(t.rank, &PeerClosedError{Rank: t.rank, Err: errClosedItsBootstrap})
		}
	}
	return nil
}

// RunInProcess runs fn on size goroutine ranks of this process, each with
// its own in-process Bootstrap (NewInProcess with cfg), and returns each
// rank's error once every rank has returned. A rank's Bootstrap is closed
// when its fn returns, so a rank that fails makes the others fail at their
// next exchange instead of waiting out the timeout.
func RunInProcess(ctx context.Context, size int, cfg Config, fn func(ctx context.Context, bs Bootstrap) error) []error {
	errs := make([]error, max(size, 0))
	bss, err := NewInProcess(size, cfg)
	if err != nil {
		for r := range errs {
			errs[r] = err
		}
		return errs
	}
	done := make(chan struct{}, size)
	for r, bs := range bss {
		go func() {
			defer func() { done <- struct{}{} }()
			errs[r] = errors.Join(fn(ctx, bs), bs.Close())
		}()
	}
	for range bss {
		<-done
	}
	return errs
}
