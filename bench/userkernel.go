package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/userkernel/tutorial"
)

func init() {
	register("userkernel", "MSCCL++'s channel tutorial with a user kernel compiled at run time: every rank puts its slice to every peer over port or memory channels and waits for theirs, checked byte for byte (goroutine ranks; without a GPU, in the CPU emulation)", runUserKernel)
}

func runUserKernel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("userkernel", stderr)
	backend := fs.String("backend", "auto", "cuda, host or auto (cuda when a GPU is present); host runs the user kernel in goep's CPU emulation (needs g++)")
	chans := fs.String("channels", "port,memory", "channel kinds to run: port, memory or both")
	ranks := fs.Int("ranks", 0, "goroutine ranks (default: every GPU, at least 2, or 4 host ranks); more ranks than GPUs share them")
	slice := fs.String("slice", "", "bytes each rank sends to every peer (default 1M on GPU, 4093 on host)")
	rounds := fs.Int("rounds", 0, "exchanges per channel kind, each with new data (default 100 on GPU, 3 on host)")
	timeout := fs.Duration("timeout", 0, "device-side wait timeout (default $"+channels.TimeoutEnv+" or 60s)")
	gpus := addGPUsFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	kind, why, err := device.ParseKind(*backend)
	if err != nil {
		return err
	}
	if err := gpus.apply(kind); err != nil {
		return err
	}
	gpu := kind == device.CUDA
	var kinds []tutorial.Channels
	for _, c := range strings.Split(*chans, ",") {
		switch k := tutorial.Channels(strings.TrimSpace(c)); k {
		case tutorial.Port, tutorial.Memory:
			kinds = append(kinds, k)
		default:
			return fmt.Errorf("--channels: %q is neither port nor memory", clip(c, 100))
		}
	}
	sl, err := parseSizes(*slice, pick(gpu, "1M", "4093"))
	if err != nil || len(sl) != 1 {
		return fmt.Errorf("--slice: want one size (%v)", err)
	}
	if *rounds == 0 {
		*rounds = pick(gpu, 100, 3)
	}
	if *rounds < 1 || *timeout < 0 {
		return fmt.Errorf("--rounds must be positive, --timeout not negative")
	}
	n, err := goroutineRanks("userkernel", kind, *ranks, 0, 2)
	if err != nil {
		return err
	}
	open := func(r int) (device.Device, error) { return device.OpenRank(kind, r) }
	if !gpu {
		// The plain host backend runs goep's kernels through Go twins and
		// cannot run a CUDA source; the CPU emulation can, given g++.
		if _, err := cpuemu.Compiler(); err != nil {
			msg := "user kernels need a GPU"
			if why != "" {
				msg += " (" + why + ")"
			}
			return fmt.Errorf("%s, or g++ for goep's CPU emulation of CUDA sources: %w", msg, err)
		}
		open = func(r int) (device.Device, error) { return cpuemu.Open(r, cpuemu.Options{SMs: 2}) }
		fmt.Fprintln(stdout, "note: no GPU: the user kernel runs on CPU threads in goep's CPU emulation; timings say nothing of a GPU")
	}
	if note := sharedGPUNote(kind, n); note != "" {
		fmt.Fprintln(stdout, "note:", note)
	}
	results := make([][]tutorial.Result, n)
	var info device.Info
	var once sync.Once
	var done sync.WaitGroup
	done.Add(n)
	errs := bootstrap.RunInProcess(ctx, n, bootstrap.Config{}, func(ctx context.Context, bs bootstrap.Bootstrap) (err error) {
		dev, err := open(bs.Rank())
		if err == nil {
			once.Do(func() { info = dev.Info() })
			// One communicator per channel kind: a communicator keeps the
			// peers' memory it opened (by handle) until Close, and a later
			// run's buffer may be allocated where an earlier run's was.
			var comms []*channels.Communicator
			for i, k := range kinds {
				var comm *channels.Communicator
				if comm, err = channels.NewCommunicator(bs, dev, channels.Config{Timeouts: channels.Timeouts{Wait: *timeout}}); err != nil {
					break
				}
				comms = append(comms, comm)
				release := abortOnCancel(ctx, comm.Abort)
				var res tutorial.Result
				res, err = tutorial.Run(ctx, comm, tutorial.Config{Channels: k, SliceBytes: sl[0], Rounds: *rounds, Seed: uint64(i + 1)})
				release()
				if err != nil {
					break
				}
				results[bs.Rank()] = append(results[bs.Rank()], res)
			}
			defer func() {
				for _, c := range comms {
					err = errors.Join(err, c.Close())
				}
				err = errors.Join(err, dev.Close())
			}()
		}
		if err != nil {
			_ = bs.Close() // the others fail fast
		}
		// No rank closes what a peer may still reach before every rank is
		// done.
		done.Done()
		done.Wait()
		return err
	})
	if err := interrupted(ctx); err != nil {
		return err
	}
	var failed []error
	for r, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("rank %d: %w", r, err))
		}
	}
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	fmt.Fprintf(stdout, "userkernel: channel tutorial, %d ranks on %s, %s per peer, %d rounds per kind\n", n, info.Name, human(sl[0]), *rounds)
	for i, k := range kinds {
		slowest := time.Duration(0)
		for r := range results {
			slowest = max(slowest, results[r][i].Elapsed)
		}
		per := slowest / time.Duration(*rounds)
		fmt.Fprintf(stdout, "  %-6s checked: every rank received every peer's slice, byte for byte; %v per exchange (slowest rank, launch to synchronize)\n",
			k, per.Round(time.Microsecond))
	}
	return nil
}
