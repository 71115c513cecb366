package kernelflags

import (
	"slices"
	"testing"
)

// The trace switch: $GOEP_LL_TRACE parses to on/off (anything else is an
// error), Defines carries its define only while on, and once Defines froze
// the switches a change fails while setting the same value does not.
func TestLLTraceSwitch(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "1": true} {
		t.Setenv(EnvLLTrace, v)
		on, err := LLTraceEnv()
		if err != nil || on != want {
			t.Fatalf("%s=%q: got %v, %v; want %v", EnvLLTrace, v, on, err, want)
		}
	}
	for _, v := range []string{"2", "true", " 1"} {
		t.Setenv(EnvLLTrace, v)
		if _, err := LLTraceEnv(); err == nil {
			t.Fatalf("%s=%q: no error", EnvLLTrace, v)
		}
		if err := ApplyEnv(); err == nil {
			t.Fatalf("ApplyEnv with %s=%q: no error", EnvLLTrace, v)
		}
	}
	t.Setenv(EnvLLTrace, "1")
	if err := ApplyLLTraceEnv(); err != nil || !LLTrace() {
		t.Fatalf("ApplyLLTraceEnv: %v, on %v", err, LLTrace())
	}
	if err := SetLLTrace(false); err != nil || LLTrace() {
		t.Fatalf("before the first Defines the switch may change: %v", err)
	}
	if d := Defines(); slices.Contains(d, DefineLLTrace) {
		t.Fatalf("switch off: Defines %v", d)
	}
	// Frozen now (off).
	if err := SetLLTrace(true); err == nil || LLTrace() {
		t.Fatal("a change after Defines must fail and leave the switch off")
	}
	if err := SetLLTrace(false); err != nil {
		t.Fatalf("the same value after Defines: %v", err)
	}
	mu.Lock()
	frozen, llTrace = false, true // as if set on before any compile
	mu.Unlock()
	if d := Defines(); !slices.Contains(d, DefineLLTrace) {
		t.Fatalf("switch on: Defines %v", d)
	}
	if err := SetLLTrace(false); err == nil || !LLTrace() {
		t.Fatal("a change after Defines must fail and leave the switch on")
	}
}

func TestInnTraceSwitch(t *testing.T) {
	mu.Lock()
	frozen, inTrace = false, false
	mu.Unlock()
	t.Cleanup(func() {
		mu.Lock()
		frozen, inTrace = false, false
		mu.Unlock()
	})
	for _, v := range []string{"yes", "2", " 1"} {
		t.Setenv(EnvInnTrace, v)
		if _, err := InnTraceEnv(); err == nil {
			t.Fatalf("%s=%q: no error", EnvInnTrace, v)
		}
	}
	t.Setenv(EnvInnTrace, "1")
	if on, err := InnTraceEnv(); err != nil || !on {
		t.Fatalf("%s=1: %v, %v", EnvInnTrace, on, err)
	}
	if err := SetInnTrace(true); err != nil || !InnTrace() {
		t.Fatalf("SetInnTrace(true): %v", err)
	}
	if d := Defines(); !slices.Contains(d, DefineInnTrace) {
		t.Fatalf("switch on: Defines %v", d)
	}
	if err := SetInnTrace(false); err == nil || !InnTrace() {
		t.Fatal("a change after Defines must fail and leave the switch on")
	}
	mu.Lock()
	frozen, inTrace = false, false
	mu.Unlock()
	if d := Defines(); slices.Contains(d, DefineInnTrace) {
		t.Fatalf("switch off: Defines %v", d)
	}
}
