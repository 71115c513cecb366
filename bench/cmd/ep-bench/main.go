// Command ep-bench runs, checks and measures goep: `ep-bench help` lists the
// subcommands.

package main

import (
	"os"

	"github.com/goep-dev/goep/bench"
)

func main() { os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr)) }
