package userkernel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/userkernel"
	"github.com/goep-dev/goep/userkernel/tutorial"
)

// The channel tutorial, checked byte for byte against the data each sender
// wrote (computed in Go by the tutorial, not read back from the sender):
// port and memory channels, 2 and 4 ranks (2, 4 and 8 on GPUs, sharing the
// GPUs present), odd slice sizes, several rounds through the same
// semaphores.
func TestTutorial(t *testing.T) {
	for _, b := range kernelBackends(t) {
		worlds, slices, rounds := []int{2, 3, 4}, []int{1, 4093}, 2
		if b == gpu {
			worlds, slices, rounds = []int{2, 4, 8}, []int{1, 4093, 1 << 20}, 20
		}
		for _, n := range worlds {
			for _, ch := range []tutorial.Channels{tutorial.Port, tutorial.Memory} {
				t.Run(fmt.Sprintf("%s-%d-%s", b, n, ch), func(t *testing.T) {
					// A communicator per run: it keeps the peers' memory it
					// opened until Close, and a later run's buffer may be
					// allocated where an earlier one's was.
					for i, s := range slices {
						noErrors(t, runRanks(t, b, n, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
							res, err := tutorial.Run(ctx, comm, tutorial.Config{Channels: ch, SliceBytes: s, Rounds: rounds, Seed: uint64(11 + i)})
							if err == nil && (res.Rounds != rounds || res.Ranks != n || res.SliceBytes != s || res.Channels != ch) {
								err = fmt.Errorf("result %+v does not describe the run", res)
							}
							return err
						}))
					}
				})
			}
		}
	}
}

// The plain host backend refuses the tutorial, saying user kernels need a
// GPU, on every rank and at once.
func TestTutorialOnPlainHostRefuses(t *testing.T) {
	errs := runRanks(t, host, 2, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
		_, err := tutorial.Run(ctx, comm, tutorial.Config{})
		return err
	})
	for r, err := range errs {
		if assert.Error(t, err, "rank %d", r) {
			assert.True(t, errors.Is(err, userkernel.ErrNeedsGPU), "rank %d: %v", r, err)
			assert.Contains(t, err.Error(), "need a GPU")
		}
	}
}

func TestTutorialConfigRefusals(t *testing.T) {
	noErrors(t, runRanks(t, host, 2, time.Minute, func(ctx context.Context, comm *channels.Communicator) error {
		for _, c := range []tutorial.Config{
			{Channels: "switch"}, {SliceBytes: -1}, {Rounds: -2}, {SliceBytes: 1<<31 + 1},
		} {
			if _, err := tutorial.Run(ctx, comm, c); err == nil || errors.Is(err, userkernel.ErrNeedsGPU) {
				return fmt.Errorf("config %+v: error %v, want a refusal of the config", c, err)
			}
		}
		if _, err := tutorial.Run(ctx, nil, tutorial.Config{}); err == nil {
			return errors.New("a nil communicator was accepted")
		}
		return nil
	}))
}
