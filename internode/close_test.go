package internode_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// Close after notify rounds, the ranks arriving at random times: each
// rank's Close drains its proxy and meets the others before it withdraws
// and frees its memory, so no peer's operation arrives into memory it
// withdrew (that would break its communicator: DeregisterMemory) and every
// Close succeeds. With gone set, rank 3 leaves without closing (its
// bootstrap closed): the others' Close returns within the bound, naming it.
func TestNotifyCloseOrder(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(fmt.Sprintf("peer-gone=%v", gone), func(t *testing.T) { checkNotifyClose(t, gone, 11) })
	}
}

func checkNotifyClose(t *testing.T, gone bool, seed int64) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	w := topo.World()
	rng := rand.New(rand.NewSource(seed))
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 2, Experts: 2 * w}
	const rounds = 3
	in := make([][]internode.RankInput, rounds)
	maxTokens := 1
	for e := range in {
		in[e] = make([]internode.RankInput, w)
		for r := range in[e] {
			in[e][r] = dispatchInput(rng, s, notifyIDs(rng, s, r, -1), e == 1, true)
			maxTokens = max(maxTokens, len(in[e][r].TopK)/s.TopK)
		}
	}
	delay := make([]time.Duration, w)
	for r := range delay {
		delay[r] = time.Duration(rng.Intn(40)) * time.Millisecond
	}
	const absent = 3
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	errs := runLocal(ctx, hostBackend, w, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		c, err := channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: 30 * time.Second},
			Network: channels.NetworkConfig{VirtualNodes: topo.Nodes, Sockets: 2, ChunkBytes: 16 << 10}})
		if err != nil {
			return err
		}
		me := c.Rank()
		nt, err := internode.NewNotify(ctx, c, s, internode.NotifyConfig{Tag: 5, MaxTokens: maxTokens})
		if err != nil {
			return errors.Join(err, c.Close())
		}
		// Notify, dispatch and combine: the steps' completion flags to
		// the network peers are the operations nobody waits for last.
		yr := rand.New(rand.NewSource(seed + int64(me)))
		for e := 0; e < rounds; e++ {
			err := func() error {
				if _, err := nt.Run(in[e][me].TopK); err != nil {
					return err
				}
				out, err := nt.Dispatch(in[e][me])
				if err != nil {
					return err
				}
				_, err = nt.Combine(internode.CombineInput{Y: bf16s(yr, out.Received()*s.Hidden)}, internode.CombineOptions{})
				return err
			}()
			if err != nil {
				return errors.Join(err, nt.Close(), c.Close())
			}
		}
		if gone && me == absent {
			// Leaves without its Close: its connections and bootstrap end
			// (the communicator's Close still carries out what its proxy's
			// FIFO holds: the last partials its peers wait for).
			return errors.Join(c.Close(), bs.Close())
		}
		time.Sleep(delay[me])
		cerr := nt.Close()
		if gone {
			// The absent rank, or a rank that left after seeing it gone
			// (a bootstrap ends when its rank returns).
			if cerr == nil || !strings.Contains(cerr.Error(), fmt.Sprintf("rank %d", absent)) && !strings.Contains(cerr.Error(), "is gone") {
				return fmt.Errorf("rank %d: Close with rank %d gone: %v, want an error naming a gone peer", me, absent, cerr)
			}
			return c.Close()
		}
		if cerr != nil {
			return errors.Join(cerr, c.Close())
		}
		// Every rank has closed its Notify (its drain needs the peers'
		// connections) before anyone checks or closes its communicator.
		if err := bs.Barrier(ctx); err != nil {
			return errors.Join(err, c.Close())
		}
		if err := c.Check(); err != nil {
			return errors.Join(fmt.Errorf("rank %d: communicator after Close: %w", me, err), c.Close())
		}
		return c.Close()
	})
	for r, err := range errs {
		if err != nil {
			t.Logf("rank %d: %v", r, err)
		}
	}
	ranktest.NoErrors(t, errs)
	require.Less(t, time.Since(start), 2*time.Minute, "Close is bounded")
}
