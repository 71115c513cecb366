// Package kernelflags holds the process-wide switches that change how
// goep's kernels are compiled, for measurement only. There are three:
//
//   - GOEP_BENCH_NO_FINGERPRINT compiles the always-on call fingerprint
//     (-DGOEP_NO_FINGERPRINT=1) out of the collectives and intranode
//     kernels, so that a benchmark can time the same commit with and
//     without it (an A/B on one binary). With it on, mismatched calls
//     across ranks are NOT detected: they may return wrong data as success
//     or end in a timeout, as before fingerprints.
//   - GOEP_LL_TRACE compiles the low-latency kernels' phase trace in
//     (-DGOEP_LL_TRACE=1): thread 0 of every block stamps %globaltimer at
//     its phase points into the workspace's trace region, which
//     lowlatency.ParseTrace decodes (`ep-bench lowlatency --trace`). The
//     default build compiles none of it.
//   - GOEP_INN_TRACE does the same for the internode dispatch and combine
//     kernels (-DGOEP_INN_TRACE=1; internode.ParseKernelTrace, `ep-bench
//     internode --trace-kernels`).
//
// Only the benchmark and test harnesses turn them on (ApplyEnv in their
// TestMain; the benchmark's --trace flag); no product package reads the
// variables (internal/layers enforces who may import this package).
//
// The kernels package appends Defines to every NVRTC compile (so the
// defines are part of every cache key and a switched build never shares a
// cache entry with a default one) and internal/cpuemu to every g++ build of
// the emulation. The first of those calls freezes the switches: kernels
// compiled and loaded already cannot change, so a Set after it fails.
package kernelflags

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
)

// EnvNoFingerprint is the variable the harnesses read: "1" compiles the
// fingerprint out, "" or "0" leaves it in.
const EnvNoFingerprint = "GOEP_BENCH_NO_FINGERPRINT"

// DefineNoFingerprint is the compiler option the switch adds.
const DefineNoFingerprint = "-DGOEP_NO_FINGERPRINT=1"

// EnvLLTrace is the low-latency trace switch's variable: "1" compiles the
// phase trace in, "" or "0" leaves it out.
const EnvLLTrace = "GOEP_LL_TRACE"

// DefineLLTrace is the compiler option the trace switch adds.
const DefineLLTrace = "-DGOEP_LL_TRACE=1"

// EnvInnTrace is the internode trace switch's variable: "1" compiles the
// phase trace in, "" or "0" leaves it out.
const EnvInnTrace = "GOEP_INN_TRACE"

// DefineInnTrace is the compiler option the internode trace switch adds.
const DefineInnTrace = "-DGOEP_INN_TRACE=1"

var (
	mu      sync.Mutex
	noFP    bool
	llTrace bool
	inTrace bool
	frozen  bool
)

// SetNoFingerprint turns the switch on or off. It fails once kernels were
// compiled with the other setting (after the first Defines).
func SetNoFingerprint(on bool) error {
	return set(&noFP, on, "fingerprint", "goep: kernel call fingerprints are compiled out ("+EnvNoFingerprint+"=1): "+
		"mismatched calls across ranks are not detected; for measurement only")
}

// SetLLTrace turns the low-latency phase trace on or off. It fails once
// kernels were compiled with the other setting (after the first Defines).
func SetLLTrace(on bool) error {
	return set(&llTrace, on, "low-latency trace", "goep: the low-latency kernels' phase trace is compiled in ("+
		EnvLLTrace+"=1): every block stamps its phases; for measurement only")
}

// SetInnTrace turns the internode phase trace on or off. It fails once
// kernels were compiled with the other setting (after the first Defines).
func SetInnTrace(on bool) error {
	return set(&inTrace, on, "internode trace", "goep: the internode kernels' phase trace is compiled in ("+
		EnvInnTrace+"=1): every block stamps its phases; for measurement only")
}

// InnTrace reports whether the internode trace switch is on.
func InnTrace() bool {
	mu.Lock()
	defer mu.Unlock()
	return inTrace
}

// InnTraceEnv parses $GOEP_INN_TRACE: "" and "0" are off, "1" on.
func InnTraceEnv() (bool, error) { return switchEnv(EnvInnTrace, "internode phase trace compiled in") }

// switchEnv parses a switch's variable: "" and "0" are off, "1" on, any
// other value an error saying what 1 means.
func switchEnv(name, what string) (bool, error) {
	switch v := os.Getenv(name); v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	default:
		return false, fmt.Errorf("kernelflags: %s=%q: want 1 (%s) or 0", name, v, what)
	}
}

// set turns the switch *cur on or off unless kernels were already
// compiled with the other setting, and warns when it turns on.
func set(cur *bool, on bool, what, warning string) error {
	mu.Lock()
	defer mu.Unlock()
	if frozen && on != *cur {
		return fmt.Errorf("kernelflags: the %s switch cannot change to %v: kernels were already compiled with %v", what, on, *cur)
	}
	if on && !*cur {
		slog.Warn(warning)
	}
	*cur = on
	return nil
}

// LLTrace reports whether the low-latency trace switch is on.
func LLTrace() bool {
	mu.Lock()
	defer mu.Unlock()
	return llTrace
}

// NoFingerprint reports whether the switch is on.
func NoFingerprint() bool {
	mu.Lock()
	defer mu.Unlock()
	return noFP
}

// Defines returns the compiler options the switches add (nil by default)
// and freezes them.
func Defines() []string {
	mu.Lock()
	defer mu.Unlock()
	frozen = true
	var d []string
	if noFP {
		d = append(d, DefineNoFingerprint)
	}
	if llTrace {
		d = append(d, DefineLLTrace)
	}
	if inTrace {
		d = append(d, DefineInnTrace)
	}
	return d
}

// ApplyEnv sets the switches from $GOEP_BENCH_NO_FINGERPRINT,
// $GOEP_LL_TRACE and $GOEP_INN_TRACE, for the harnesses' TestMain (before any kernel is
// compiled). Any value other than "", "0" and "1" is an error.
func ApplyEnv() error {
	switch v := os.Getenv(EnvNoFingerprint); v {
	case "", "0":
		if err := SetNoFingerprint(false); err != nil {
			return err
		}
	case "1":
		if err := SetNoFingerprint(true); err != nil {
			return err
		}
	default:
		return fmt.Errorf("kernelflags: %s=%q: want 1 (fingerprint compiled out) or 0", EnvNoFingerprint, v)
	}
	if err := ApplyLLTraceEnv(); err != nil {
		return err
	}
	on, err := InnTraceEnv()
	if err != nil {
		return err
	}
	return SetInnTrace(on)
}

// ApplyLLTraceEnv sets the low-latency trace switch from $GOEP_LL_TRACE
// (before any kernel is compiled). Any value other than "", "0" and "1" is
// an error.
func ApplyLLTraceEnv() error {
	on, err := LLTraceEnv()
	if err != nil {
		return err
	}
	return SetLLTrace(on)
}

// LLTraceEnv parses $GOEP_LL_TRACE: "" and "0" are off, "1" on.
func LLTraceEnv() (bool, error) { return switchEnv(EnvLLTrace, "low-latency phase trace compiled in") }

// Mode names the setting, for benchmark output.
func Mode() string {
	if NoFingerprint() {
		return "fingerprint=off (" + EnvNoFingerprint + "=1: compiled out, measurement only)"
	}
	return "fingerprint=on (default build)"
}

// RerunSwitched runs this test binary again (os.Args[0]) with the switch on,
// -test.run run and -test.v, and returns its combined output: the
// harnesses' own check that the switched build is what a child gets. It
// refuses to run from a process whose switch is already on (the parent
// must be the default build it compares against).
func RerunSwitched(run string) (string, error) {
	if NoFingerprint() || os.Getenv(EnvNoFingerprint) == "1" {
		return "", fmt.Errorf("kernelflags: %s is set in the parent: the rerun compares a default parent with a switched child", EnvNoFingerprint)
	}
	return rerun(EnvNoFingerprint, run)
}

// RerunLLTrace is RerunSwitched for the low-latency trace switch: this
// test binary again with $GOEP_LL_TRACE=1 (its TestMain applies it), from
// a parent whose switch is off.
func RerunLLTrace(run string) (string, error) {
	if LLTrace() || os.Getenv(EnvLLTrace) == "1" {
		return "", fmt.Errorf("kernelflags: %s is set in the parent: the rerun compares a default parent with a switched child", EnvLLTrace)
	}
	return rerun(EnvLLTrace, run)
}

// RerunInnTrace is RerunSwitched for the internode trace switch: this test
// binary again with $GOEP_INN_TRACE=1 (its TestMain applies it), from a
// parent whose switch is off.
func RerunInnTrace(run string) (string, error) {
	if InnTrace() || os.Getenv(EnvInnTrace) == "1" {
		return "", fmt.Errorf("kernelflags: %s is set in the parent: the rerun compares a default parent with a switched child", EnvInnTrace)
	}
	return rerun(EnvInnTrace, run)
}

func rerun(env, run string) (string, error) {
	cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kernelflags: the switched run of %q failed: %w", run, err)
	}
	return string(out), nil
}
