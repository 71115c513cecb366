// Package kernelflags holds the process-wide switches that change how
// goep's kernels are compiled, for measurement only. Today there is one:
// GOEP_NO_FINGERPRINT, which compiles the always-on call fingerprint out of
// the collectives and intranode kernels, so that a benchmark can time the
// same commit with and without it (an A/B on one binary).
//
// Only the benchmark and test harnesses turn it on (ApplyEnv in their
// TestMain, from $GOEP_BENCH_NO_FINGERPRINT); no product package reads the
// variable (internal/layers enforces who may import this package). With
// the switch on, mismatched calls across ranks are NOT detected: they may
// return wrong data as success or end in a timeout, as before fingerprints.
//
// The kernels package appends Defines to every NVRTC compile (so the
// define is part of every cache key and a switched build never shares a
// cache entry with a default one) and internal/cpuemu to every g++ build of
// the emulation. The first of those calls freezes the switch: kernels
// compiled and loaded already cannot change, so Set after it fails.
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

var (
	mu     sync.Mutex
	noFP   bool
	frozen bool
)

// SetNoFingerprint turns the switch on or off. It fails once kernels were
// compiled with the other setting (after the first Defines).
func SetNoFingerprint(on bool) error {
	mu.Lock()
	defer mu.Unlock()
	if frozen && on != noFP {
		return fmt.Errorf("kernelflags: the fingerprint switch cannot change to %v: kernels were already compiled with %v", on, noFP)
	}
	if on && !noFP {
		slog.Warn("goep: kernel call fingerprints are compiled out (" + EnvNoFingerprint + "=1): " +
			"mismatched calls across ranks are not detected; for measurement only")
	}
	noFP = on
	return nil
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
	if noFP {
		return []string{DefineNoFingerprint}
	}
	return nil
}

// ApplyEnv sets the switch from $GOEP_BENCH_NO_FINGERPRINT, for the
// harnesses' TestMain (before any kernel is compiled). Any value other than
// "", "0" and "1" is an error.
func ApplyEnv() error {
	switch v := os.Getenv(EnvNoFingerprint); v {
	case "", "0":
		return SetNoFingerprint(false)
	case "1":
		return SetNoFingerprint(true)
	default:
		return fmt.Errorf("kernelflags: %s=%q: want 1 (fingerprint compiled out) or 0", EnvNoFingerprint, v)
	}
}

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
	cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), EnvNoFingerprint+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kernelflags: the switched run of %q failed: %w", run, err)
	}
	return string(out), nil
}
