package channels

import (
	"context"
	"errors"
	"fmt"
)

// The communicator talks to its peers over the bootstrap under its own
// tags, out of the way of tags the application uses on the same bootstrap:
// bit 40 set, the kind of exchange in bits 32..39, the caller's tag in the
// low 32 bits. Messages with the same (peer, tag) arrive in order, which is
// what pairs the k-th A->B exchange with the k-th B->A one.
const tagSpace = 1 << 40

type exchangeKind int

const (
	kindMemory exchangeKind = iota + 1
	kindConnect
	kindSemaphore
	kindPlacement
	kindNetSetup
	kindTopology
)

func (k exchangeKind) String() string {
	switch k {
	case kindMemory:
		return "memory"
	case kindConnect:
		return "connection"
	case kindSemaphore:
		return "semaphore"
	case kindPlacement:
		return "placement"
	case kindNetSetup:
		return "network setup"
	case kindTopology:
		return "topology"
	}
	return fmt.Sprintf("kind %d", int(k))
}

// MaxTag is the largest tag the communicator accepts.
const MaxTag = 1<<32 - 1

func checkTag(tag int) error {
	if tag < 0 || tag > MaxTag {
		return fmt.Errorf("tag %d is outside [0, %d]", tag, MaxTag)
	}
	return nil
}

func bootstrapTag(kind exchangeKind, tag int) int { return tagSpace | int(kind)<<32 | tag }

// exchange sends mine(peer) to every peer, then receives every peer's
// message, so that ranks exchanging with several peers in any order never
// wait on each other in a cycle (sends do not block). theirs[i] is peers[i]'s.
func (c *Communicator) exchange(ctx context.Context, kind exchangeKind, tag int, peers []int, mine func(i int) []byte) ([][]byte, error) {
	if err := checkTag(tag); err != nil {
		return nil, c.errorf("%s exchange: %w", kind, err)
	}
	bt := bootstrapTag(kind, tag)
	for i, p := range peers {
		if err := c.bs.Send(ctx, p, bt, mine(i)); err != nil {
			return nil, c.errorf("%s exchange with rank %d (tag %d): %w", kind, p, tag, err)
		}
	}
	theirs := make([][]byte, len(peers))
	var errs []error
	for i, p := range peers {
		msg, err := c.bs.Recv(ctx, p, bt)
		if err != nil {
			// Keep receiving from the others so that a single dead peer is
			// named, not every peer after it.
			errs = append(errs, c.errorf("%s exchange with rank %d (tag %d): %w", kind, p, tag, err))
			continue
		}
		theirs[i] = msg
	}
	return theirs, errors.Join(errs...)
}
