package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/internal/spawn"
	"github.com/goep-dev/goep/internode"
)

func init() {
	register("launch", "start N local ranks of ep-bench, one per GPU: launch -n 8 -- <command> [flags]", runLaunch)
}

// oneProcessOnly are the commands that a launch of several processes
// would only run several independent copies of.
var oneProcessOnly = map[string]string{
	"plan":    "it runs every rank of the plan as a goroutine",
	"route":   "it reads a file, no GPU",
	"kernels": "it compiles for every GPU at once",
	"layout":  "it times one GPU's layout kernel",
}

func runLaunch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("launch", stderr)
	n := fs.Int("n", 0, "number of ranks (one process per GPU; rank i uses GPU i)")
	grace := fs.Duration("grace", 5*time.Second, "how long ranks get to stop after one fails, before they are killed")
	maxRanks := fs.Int("max-ranks", 0, "the most ranks -n may ask for (0: one per GPU, or one per CPU core without GPUs)")
	nodes := fs.Int("nodes", 0, "split the ranks into this many virtual nodes (sets "+internode.VirtualNodesEnv+" in every rank: cross-node traffic goes over the network transport, and ep Buffers run internode); must divide -n")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-bench launch -n N [--nodes K] [--grace 5s] -- <ep-bench command> [flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	rest := fs.Args()
	if *n < 1 {
		fs.Usage()
		return fmt.Errorf("-n must be at least 1")
	}
	if len(rest) == 0 {
		fs.Usage()
		return fmt.Errorf("no command to launch after --")
	}
	if rest[0] == "launch" {
		return fmt.Errorf("launch cannot launch itself")
	}
	if _, ok := commands[rest[0]]; !ok {
		return fmt.Errorf("no ep-bench command %q to launch (ep-bench help lists them)", clip(rest[0], 100))
	}
	if why, ok := oneProcessOnly[rest[0]]; ok {
		return fmt.Errorf("%s runs in one process (%s); run `ep-bench %s` without launch", rest[0], why, rest[0])
	}
	var env []string
	if *nodes != 0 {
		if _, err := internode.VirtualNodes(*n, *nodes); err != nil {
			return fmt.Errorf("--nodes: %w", err)
		}
		env = append(env, fmt.Sprintf("%s=%d", internode.VirtualNodesEnv, *nodes))
	}
	bound, what := launchBound(*maxRanks)
	if *n > bound {
		return fmt.Errorf("-n %d: at most %d ranks here (%s); --max-ranks raises the bound", *n, bound, what)
	}
	return spawn.Run(ctx, spawn.Options{N: *n, Args: rest, Stdout: stdout, Stderr: stderr, GracePeriod: *grace, MaxN: bound, Env: env})
}

// maxLaunchRanks is the hard ceiling of -n, whatever --max-ranks says.
const maxLaunchRanks = 1024

// launchBound is the most ranks a launch may start: --max-ranks when given
// (up to maxLaunchRanks), else one per GPU (launch runs one process per
// GPU; processes sharing a GPU are refused), else one per CPU core.
func launchBound(override int) (int, string) {
	if override > 0 {
		return min(override, maxLaunchRanks), "--max-ranks"
	}
	if n, err := device.CUDADeviceCount(); err == nil && n > 0 {
		return min(n, maxLaunchRanks), fmt.Sprintf("%d GPUs, one process each", n)
	}
	c := runtime.NumCPU()
	return min(c, maxLaunchRanks), fmt.Sprintf("no GPU; %d CPU cores", c)
}
