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
