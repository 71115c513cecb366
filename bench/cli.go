// Package bench is the ep-bench command line: every subcommand checks its
// results against a reference before it times anything.

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"unicode/utf8"
)

// command is one ep-bench subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{summary, run}
}

// errUsage marks an error already explained by a usage message.
var errUsage = errors.New("usage")

// Main runs ep-bench with the given arguments and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "ep-bench: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal a second one ends the process at once: the
	// first asks the work loops to stop, the second is for when they do not.
	restored := make(chan struct{})
	go func() { defer close(restored); <-ctx.Done(); stop() }()
	defer func() { stop(); <-restored }()
	return runCommand(ctx, cmd, args, stdout, stderr)
}

// runCommand runs a known command under ctx (cancelled by Ctrl-C or
// SIGTERM in Main, directly by tests) and returns the exit code.
func runCommand(ctx context.Context, cmd command, args []string, stdout, stderr io.Writer) int {
	return finish(ctx, args[0], cmd.run(ctx, args[1:], stdout, stderr), stderr)
}

// exitInterrupted is the exit code after Ctrl-C or SIGTERM (a shell's 128+SIGINT).
const exitInterrupted = 130

// finish turns a command's error into the exit code and its message. Once
// the context is cancelled every failure is a consequence of that, so the
// message is "interrupted" and nothing else.
func finish(ctx context.Context, name string, err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case ctx.Err() != nil || errors.Is(err, errInterrupted):
		fmt.Fprintf(stderr, "ep-bench %s: interrupted\n", name)
		return exitInterrupted
	case errors.Is(err, errUsage):
		return 1
	}
	fmt.Fprintf(stderr, "ep-bench %s: %s\n", name, clipLines(err.Error(), maxEchoLine))
	return 1
}

// errInterrupted is what a command returns when its context was cancelled
// before it finished.
var errInterrupted = errors.New("interrupted")

// interrupted returns errInterrupted once ctx is cancelled, else nil: work
// loops call it between steps.
func interrupted(ctx context.Context) error {
	if ctx.Err() != nil {
		return errInterrupted
	}
	return nil
}

// maxEchoLine bounds one line of an error message: errors may repeat input
// (file headers, plan strings) and must not flood the terminal.
const maxEchoLine = 400

// clipLines shortens every line of s longer than n bytes.
func clipLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = clip(l, n)
	}
	return strings.Join(lines, "\n")
}

// clip shortens s to about n bytes, saying how long it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes in all)", s[:cut], len(s))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ep-bench <command> [flags]   (ep-bench <command> -h for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
}

// newFlags makes a FlagSet that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ep-bench "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags and turns a bad flag into errUsage (the FlagSet has
// already printed why).
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}
