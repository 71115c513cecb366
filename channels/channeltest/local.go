package channeltest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// RunLocal runs fn on n goroutine ranks of this process, each with its own
// in-process bootstrap, and returns each rank's error: rank r on
// device.RankOrdinal(kind, r), so ranks share GPUs when there are fewer
// GPUs than ranks. A rank whose fn fails closes its
// bootstrap at once, so the others fail fast at their next exchange instead
// of waiting out the bootstrap timeout.
func RunLocal(ctx context.Context, kind device.Kind, n int, cfg bootstrap.Config, fn func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error) []error {
	return RunLocalOn(ctx, kind, n, func(r int) int {
		o, err := device.RankOrdinal(kind, r)
		if err != nil {
			return r // device.Open then says why
		}
		return o
	}, cfg, fn)
}

// RunLocalOn is RunLocal with rank r on device (kind, ordinal(r)): several
// ranks may share a GPU (their kernels then run side by side on it).
func RunLocalOn(ctx context.Context, kind device.Kind, n int, ordinal func(rank int) int, cfg bootstrap.Config, fn func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error) []error {
	return bootstrap.RunInProcess(ctx, n, cfg, func(ctx context.Context, bs bootstrap.Bootstrap) (err error) {
		r := bs.Rank()
		dev, err := device.Open(kind, ordinal(r))
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		defer func() { err = errors.Join(err, dev.Close()) }()
		return fn(ctx, bs, dev)
	})
}

// RunRanks runs fn on n goroutine ranks, each with a communicator (ccfg)
// and a Rank (layout) of its own. A rank whose fn fails closes its
// bootstrap at once so the others fail fast, but no rank frees memory
// until every rank's fn has returned: a peer may still be reading it.
func RunRanks(ctx context.Context, kind device.Kind, n int, bcfg bootstrap.Config, ccfg channels.Config, layout Layout,
	fn func(ctx context.Context, r *Rank) error) []error {
	var finished sync.WaitGroup
	finished.Add(n)
	return RunLocal(ctx, kind, n, bcfg, func(ctx context.Context, bs bootstrap.Bootstrap, dev device.Device) error {
		var comm *channels.Communicator
		var r *Rank
		err := func() (err error) {
			if comm, err = channels.NewCommunicator(bs, dev, ccfg); err != nil {
				return err
			}
			if r, err = NewRank(ctx, comm, layout); err != nil {
				return err
			}
			return fn(ctx, r)
		}()
		if err != nil {
			_ = bs.Close()
		}
		finished.Done()
		finished.Wait()
		if r != nil {
			err = errors.Join(err, r.Close())
		}
		if comm != nil {
			err = errors.Join(err, comm.Close())
		}
		return err
	})
}
