package buffer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// Setup steps that Buffer and LowLatency share: meeting the peers over the
// bootstrap and opening their workspaces.

// exchangeAll sends msg to every peer under tag and returns theirs (nil at
// rank's index), sending to all before receiving.
func exchangeAll(ctx context.Context, bs bootstrap.Bootstrap, rank, ranks, tag int, msg []byte) ([][]byte, error) {
	out := make([][]byte, ranks)
	for p := 0; p < ranks; p++ {
		if p != rank {
			if err := bs.Send(ctx, p, tag, msg); err != nil {
				return nil, fmt.Errorf("send to rank %d: %w", p, err)
			}
		}
	}
	var errs []error
	for p := 0; p < ranks; p++ {
		if p != rank {
			m, err := bs.Recv(ctx, p, tag)
			if err != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", p, err))
				continue
			}
			out[p] = m
		}
	}
	return out, errors.Join(errs...)
}

// sameConfig tells every peer mine (this rank's shared configuration) and
// compares theirs, so that a mismatch is an error naming the rank instead
// of kernels reading each other's memory at different offsets; what names
// the configuration in that error.
func sameConfig(ctx context.Context, bs bootstrap.Bootstrap, rank, ranks, tag int, what, mine string) error {
	theirs, err := exchangeAll(ctx, bs, rank, ranks, tag, []byte(mine))
	if err != nil {
		return fmt.Errorf("config check: %w", timeoutError(err))
	}
	for r, t := range theirs {
		if t != nil && string(t) != mine {
			return fmt.Errorf("rank %d's %s (%s) differs from this rank's (%s)%s", r, what, t, mine, differing(string(t), mine))
		}
	}
	return nil
}

// differing names the fields of two "name=value ..." strings that differ
// (", fields: a, b"), or nothing when they are not in that form.
func differing(a, b string) string {
	fa, fb := strings.Fields(a), strings.Fields(b)
	if len(fa) != len(fb) {
		return ""
	}
	var names []string
	for i := range fa {
		na, _, oka := strings.Cut(fa[i], "=")
		nb, _, okb := strings.Cut(fb[i], "=")
		if !oka || !okb || na != nb {
			return ""
		}
		if fa[i] != fb[i] {
			names = append(names, na)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return ", fields: " + strings.Join(names, ", ")
}

// exchangeWorkspaces registers ws with comm, opens every peer's (each
// must hold at least need bytes) and uploads the peer table, u64[ranks] of
// every rank's workspace as mapped here, into table. It returns the peers
// (every rank but this one, ascending).
func exchangeWorkspaces(ctx context.Context, comm *channels.Communicator, dev device.Device, ws, table device.Buffer,
	rank, ranks, tag, need int) ([]int, error) {
	mine, err := comm.RegisterMemory(ws)
	if err != nil {
		return nil, err
	}
	var peers []int
	for p := 0; p < ranks; p++ {
		if p != rank {
			peers = append(peers, p)
		}
	}
	theirs, err := comm.ExchangeMemory(ctx, mine, peers, tag)
	if err != nil {
		return nil, fmt.Errorf("exchange workspaces: %w", err)
	}
	tab := make([]byte, 8*ranks)
	binary.LittleEndian.PutUint64(tab[8*rank:], uint64(ws.Ptr))
	for i, p := range peers {
		if theirs[i].Size() < need {
			return nil, fmt.Errorf("rank %d's workspace has %d bytes; the layout needs %d", p, theirs[i].Size(), need)
		}
		binary.LittleEndian.PutUint64(tab[8*p:], uint64(theirs[i].Ptr()))
	}
	if err := dev.CopyIn(table.Ptr, tab); err != nil {
		return nil, fmt.Errorf("peer table: %w", err)
	}
	return peers, nil
}

// The broken/closed state that Buffer and LowLatency keep under their mu.

// firstFailure records err as the reason the buffer is unusable unless one
// is recorded already or the buffer is closed, and returns the recorded
// reason (err when there is none). The caller holds the buffer's mu.
func firstFailure(broken *error, closed bool, err error) error {
	if *broken == nil && !closed {
		*broken = err
	}
	if *broken != nil {
		return *broken
	}
	return err
}

// markClosed marks a buffer closed under mu and reports whether it already
// was (a second Close is a no-op).
func markClosed(mu *sync.Mutex, closed *bool) (already bool) {
	mu.Lock()
	defer mu.Unlock()
	already, *closed = *closed, true
	return already
}
