package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/internal/device"
)

// gpusFlag is --gpus: the GPUs goroutine ranks run on, rank r on the
// (r mod len)-th of them, so that --ranks may exceed the GPUs (ranks then
// share GPUs). Empty: every GPU.
type gpusFlag struct{ ordinals []int }

func addGPUsFlag(fs *flag.FlagSet) *gpusFlag {
	g := &gpusFlag{}
	fs.Var(g, "gpus", "GPUs the goroutine ranks run on, e.g. 0,1 (default: every GPU); rank r on the (r mod count)-th, "+
		"so --ranks may exceed them: ranks then share GPUs, which checks everything but times no NVLink")
	return g
}

func (g *gpusFlag) String() string {
	if g == nil {
		return ""
	}
	parts := make([]string, len(g.ordinals))
	for i, o := range g.ordinals {
		parts[i] = strconv.Itoa(o)
	}
	return strings.Join(parts, ",")
}

func (g *gpusFlag) Set(s string) error {
	g.ordinals = nil
	for _, p := range strings.Split(s, ",") {
		o, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || o < 0 {
			return fmt.Errorf("%q is not a GPU ordinal", clip(p, 40))
		}
		g.ordinals = append(g.ordinals, o)
	}
	return nil
}

// apply makes the choice the process's (device.UseGPUs) for a CUDA run.
func (g *gpusFlag) apply(kind device.Kind) error {
	if len(g.ordinals) == 0 {
		return nil
	}
	if kind != device.CUDA {
		return fmt.Errorf("--gpus %s: the host backend has no GPUs", g)
	}
	if err := device.UseGPUs(g.ordinals); err != nil {
		return fmt.Errorf("--gpus %s: %w", g, err)
	}
	return nil
}

// sharedGPUNote says, when goroutine ranks share GPUs, that timings are not
// NVLink figures ("" otherwise).
func sharedGPUNote(kind device.Kind, ranks int) string {
	if kind != device.CUDA {
		return ""
	}
	gpus, err := device.GPUsInUse()
	if err != nil || gpus == 0 || ranks <= gpus {
		return ""
	}
	return fmt.Sprintf("%d ranks share %d GPU(s): results are checked as everywhere, but timings measure ranks "+
		"time-sharing SMs and memory, not NVLink; they are not comparable with one rank per GPU", ranks, gpus)
}

// openProcessDevice opens a launched process's device: GPU LOCAL_RANK, or
// for more processes than GPUs LOCAL_RANK mod the GPUs, where the first
// collective setup (channels.Communicator.Placement) refuses processes
// sharing a GPU and names the goroutine form that works.
func openProcessDevice(kind device.Kind, localRank int) (device.Device, error) {
	if kind == device.CUDA {
		if n, err := device.CUDADeviceCount(); err == nil && n > 0 && localRank >= n {
			return device.Open(kind, localRank%n)
		}
	}
	return device.Open(kind, localRank)
}

// goroutineRanks is the rank count of a run without a launcher: --ranks
// when given, else every GPU in use (at most most, when most > 0) or 4 host
// ranks; fewer than least is refused.
func goroutineRanks(cmd string, kind device.Kind, ranks, most, least int) (int, error) {
	n := ranks
	if n == 0 {
		n = 4
		if kind == device.CUDA {
			gpus, err := device.GPUsInUse()
			if err != nil {
				return 0, err
			}
			n = gpus
			if most > 0 {
				n = min(n, most)
			}
		}
	}
	if n < least {
		return 0, fmt.Errorf("%s needs at least %d ranks (have %d): give --ranks (ranks may share a GPU) or --backend host", cmd, least, n)
	}
	return n, nil
}

// joinProcess is what every launched subcommand does first: join the
// job's bootstrap and open this process's device (GPU localRank, or the
// host backend). release closes both, device first; callers join its
// error into theirs.
func joinProcess(ctx context.Context, env bootstrap.EnvInfo, kind device.Kind) (bs bootstrap.Bootstrap, dev device.Device, release func() error, err error) {
	if bs, err = bootstrap.ConnectFromEnv(ctx, env, 0); err != nil {
		return nil, nil, nil, err
	}
	if dev, err = openProcessDevice(kind, env.LocalRank); err != nil {
		return nil, nil, nil, errors.Join(err, bs.Close())
	}
	return bs, dev, func() error { return errors.Join(dev.Close(), bs.Close()) }, nil
}
