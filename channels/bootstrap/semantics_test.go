package bootstrap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests run the same cases against the TCP and in-process bootstraps.

func TestAllGatherBarrier(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			const size, rounds = 8, 5
			bs := k.connect(t, size, 10*time.Second)
			defer closeAll(t, bs)
			// blob(round, rank) is random but reproducible, sizes 0..4 KiB,
			// with every rank's blob empty in round 0.
			blob := func(round, r int) []byte {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(r)))
				n := 0
				if round > 0 {
					n = rng.IntN(4097)
				}
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				return b
			}
			ctx := context.Background()
			requireAllOK(t, forAll(size, func(r int) error {
				for round := range rounds {
					got, err := bs[r].AllGather(ctx, blob(round, r))
					if err != nil {
						return err
					}
					if len(got) != size {
						return fmt.Errorf("round %d: %d results", round, len(got))
					}
					for p := range size {
						if !bytes.Equal(got[p], blob(round, p)) {
							return fmt.Errorf("round %d: rank %d's blob differs (len %d vs %d)", round, p, len(got[p]), len(blob(round, p)))
						}
						if got[p] == nil {
							return fmt.Errorf("round %d: rank %d's blob is nil", round, p)
						}
					}
					if err := bs[r].Barrier(ctx); err != nil {
						return err
					}
				}
				return nil
			}))
		})
	}
}

func TestSendRecvTagsAndOrder(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			const size, tags, perTag = 8, 3, 20
			bs := k.connect(t, size, 10*time.Second)
			defer closeAll(t, bs)
			ctx := context.Background()
			msg := func(from, to, tag, i int) []byte { return fmt.Appendf(nil, "%d>%d t%d #%d", from, to, tag, i) }
			requireAllOK(t, forAll(size, func(r int) error {
				// Everyone sends to everyone, itself included, interleaving tags.
				for i := range perTag {
					for p := range size {
						for tag := range tags {
							if err := bs[r].Send(ctx, p, tag, msg(r, p, tag, i)); err != nil {
								return err
							}
						}
					}
				}
				// Receive tags in reverse and peers in reverse: order must hold per (peer, tag).
				for tag := tags - 1; tag >= 0; tag-- {
					for p := size - 1; p >= 0; p-- {
						for i := range perTag {
							got, err := bs[r].Recv(ctx, p, tag)
							if err != nil {
								return err
							}
							if want := msg(p, r, tag, i); !bytes.Equal(got, want) {
								return fmt.Errorf("got %q, want %q", got, want)
							}
						}
					}
				}
				// An empty message arrives as an empty, non-nil slice.
				next := (r + 1) % size
				prev := (r + size - 1) % size
				if err := bs[r].Send(ctx, next, 9, nil); err != nil {
					return err
				}
				got, err := bs[r].Recv(ctx, prev, 9)
				if err != nil {
					return err
				}
				if got == nil || len(got) != 0 {
					return fmt.Errorf("empty message arrived as %#v", got)
				}
				return nil
			}))
		})
	}
}

func TestThousandSmallMessages(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			const size, n = 8, 1000
			bs := k.connect(t, size, 10*time.Second)
			defer closeAll(t, bs)
			ctx := context.Background()
			requireAllOK(t, forAll(size, func(r int) error {
				next, prev := (r+1)%size, (r+size-1)%size
				errc := make(chan error, 1)
				go func() { // send and receive at once, as a real ring would
					var buf [8]byte
					for i := range n {
						binary.LittleEndian.PutUint64(buf[:], uint64(i))
						if err := bs[r].Send(ctx, next, 7, buf[:]); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				for i := range n {
					got, err := bs[r].Recv(ctx, prev, 7)
					if err != nil {
						return err
					}
					if v := binary.LittleEndian.Uint64(got); v != uint64(i) {
						return fmt.Errorf("message %d arrived as %d", i, v)
					}
				}
				return <-errc
			}))
		})
	}
}

func TestBarrierTimeoutNamesMissingRanks(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			const size = 6
			bs := k.connect(t, size, 700*time.Millisecond)
			defer closeAll(t, bs)
			start := time.Now()
			// Ranks 3 and 5 never arrive.
			errs := forAll(size, func(r int) error {
				if r == 3 || r == 5 {
					return nil
				}
				return bs[r].Barrier(context.Background())
			})
			require.Less(t, time.Since(start), 3*time.Second)
			for r, err := range errs {
				if r == 3 || r == 5 {
					continue
				}
				require.ErrorIs(t, err, ErrTimeout, "rank %d", r)
				requireMentions(t, err, fmt.Sprintf("rank %d:", r), "barrier timed out after 700ms waiting for ranks [3 5]")
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				require.Equal(t, []int{3, 5}, te.Ranks)
			}
			// Recv names its peer too, and a context deadline counts as a timeout.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := bs[0].Recv(ctx, 4, 1)
			require.ErrorIs(t, err, ErrTimeout)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			requireMentions(t, err, "recv from rank 4 tag 1", "waiting for ranks [4]")
		})
	}
}

func TestPeerCloseFailsWaitsPromptly(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			const size, victim = 8, 5
			bs := k.connect(t, size, 20*time.Second) // far longer than we allow below
			defer closeAll(t, bs)
			ctx := context.Background()
			// One message sent before the close must still be delivered.
			require.NoError(t, bs[victim].Send(ctx, 0, 4, []byte("last words")))
			time.AfterFunc(200*time.Millisecond, func() { bs[victim].Close() })
			start := time.Now()
			errs := forAll(size, func(r int) error {
				switch {
				case r == victim:
					return nil
				case r%2 == 0:
					return bs[r].Barrier(ctx)
				default:
					_, err := bs[r].Recv(ctx, victim, 1)
					return err
				}
			})
			require.Less(t, time.Since(start), 2*time.Second, "waits must fail well before the 20s timeout")
			for r, err := range errs {
				if r == victim {
					continue
				}
				require.ErrorIs(t, err, ErrPeerClosed, "rank %d", r)
				var pe *PeerClosedError
				require.ErrorAs(t, err, &pe)
				require.Equal(t, victim, pe.Rank)
				requireMentions(t, err, "rank 5")
			}
			got, err := bs[0].Recv(ctx, victim, 4)
			require.NoError(t, err)
			require.Equal(t, "last words", string(got))
			// Later operations that need the dead rank fail at once.
			start = time.Now()
			require.ErrorIs(t, bs[1].Send(ctx, victim, 0, []byte("x")), ErrPeerClosed)
			_, err = bs[2].AllGather(ctx, []byte("y"))
			require.ErrorIs(t, err, ErrPeerClosed)
			require.Less(t, time.Since(start), time.Second)
			// The victim itself reports ErrClosed.
			_, err = bs[victim].Recv(ctx, 0, 0)
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, bs[victim].Barrier(ctx), ErrClosed)
		})
	}
}

func TestCancelAndLocalClose(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			bs := k.connect(t, 3, 20*time.Second)
			defer closeAll(t, bs)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			_, err := bs[0].Recv(ctx, 1, 0)
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, errors.Is(err, ErrTimeout))
			requireMentions(t, err, "rank 0:", "canceled", "[1]")

			// Closing a rank fails its own pending wait with ErrClosed.
			errc := make(chan error, 1)
			go func() { errc <- bs[2].Barrier(context.Background()) }()
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, bs[2].Close())
			require.ErrorIs(t, <-errc, ErrClosed)
			require.NoError(t, bs[2].Close(), "Close is idempotent")
		})
	}
}

func TestArgumentErrors(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			bs := k.connect(t, 2, 5*time.Second)
			defer closeAll(t, bs)
			ctx := context.Background()
			requireMentions(t, bs[0].Send(ctx, 2, 0, nil), "peer 2 is outside [0, 2)")
			requireMentions(t, bs[0].Send(ctx, 1, -1, nil), "reserved")
			_, err := bs[0].Recv(ctx, -1, 0)
			requireMentions(t, err, "peer -1")
			requireMentions(t, bs[0].Send(ctx, 1, 0, make([]byte, MaxMessageSize+1)), "limit")
		})
	}
}

func TestCollectiveMismatch(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			checkLeaks(t)
			bs := k.connect(t, 2, 5*time.Second)
			defer closeAll(t, bs)
			errs := forAll(2, func(r int) error {
				if r == 0 {
					return bs[0].Barrier(context.Background())
				}
				_, err := bs[1].AllGather(context.Background(), []byte("x"))
				return err
			})
			requireMentions(t, errs[0], "this rank called barrier but rank 1 called allgather")
			requireMentions(t, errs[1], "this rank called allgather but rank 0 called barrier")
		})
	}
}

func TestSingleRank(t *testing.T) {
	checkLeaks(t)
	b, err := Connect(context.Background(), Config{Rank: 0, Size: 1, UniqueID: NewUniqueID()})
	require.NoError(t, err)
	defer b.Close()
	got, err := b.AllGather(context.Background(), []byte("solo"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("solo")}, got)
	require.NoError(t, b.Barrier(context.Background()))
	require.NoError(t, b.Send(context.Background(), 0, 1, []byte("me")))
	m, err := b.Recv(context.Background(), 0, 1)
	require.NoError(t, err)
	require.Equal(t, "me", string(m))
}
