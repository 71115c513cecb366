package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/goep-dev/goep/internal/spawn"
)

func init() {
	register("launch", "start N local ranks of ep-bench, one per GPU: launch -n 8 -- <command> [flags]", runLaunch)
}

func runLaunch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("launch", stderr)
	n := fs.Int("n", 0, "number of ranks (one process per GPU; rank i uses GPU i)")
	grace := fs.Duration("grace", 5*time.Second, "how long ranks get to stop after one fails, before they are killed")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-bench launch -n N [--grace 5s] -- <ep-bench command> [flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err.Error() == "flag: help requested" {
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
	return spawn.Run(ctx, spawn.Options{N: *n, Args: rest, Stdout: stdout, Stderr: stderr, GracePeriod: *grace})
}
