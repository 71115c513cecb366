package apicheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The guard finds every exported type with an exported method, whatever
// its receiver form, and only those; a table missing one names it.
func TestDeclaredAndUncovered(t *testing.T) {
	dir := t.TempDir()
	src := `package p

type A struct{}
func (a *A) M() {}

type B int
func (B) String() string { return "" }

type G[T any] struct{ v T }
func (g *G[T]) Get() T { return g.v }

type H[K comparable, V any] struct{}
func (h H[K, V]) Len() int { return 0 }

type quiet struct{}
func (quiet) M() {}

type C struct{}
func (c *C) unexported() {}

type D struct{}
`
	other := "package p\n\nfunc (d *D) Later() {}\n"
	test := "package p\n\ntype T struct{}\n\nfunc (T) InTest() {}\n"
	for name, s := range map[string]string{"p.go": src, "q.go": other, "p_test.go": test} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Declared(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A", "B", "D", "G", "H"}; !slices.Equal(got, want) {
		t.Fatalf("Declared = %v, want %v", got, want)
	}
	type B int // matching is by type name: a table holds values of the package under test
	missing, err := Uncovered(dir, (*struct{ A int })(nil), B(0))
	if err != nil {
		t.Fatal(err)
	}
	// An anonymous struct has no name, so A stays uncovered.
	if want := []string{"A", "D", "G", "H"}; !slices.Equal(missing, want) {
		t.Fatalf("Uncovered = %v, want %v", missing, want)
	}
}

type probe struct{ n int }

func (p *probe) Deref() int         { return p.n }
func (p *probe) Safe() int          { return 0 }
func (p probe) Value() int          { return p.n }
func (p *probe) Hang()              { time.Sleep(time.Hour) }
func (p *probe) Panics(x []int) int { return x[3] }

// Call reports a nil dereference, a panic on a zero argument and a hang,
// passes a safe method, and skips value methods on a nil pointer (Go
// panics there before any library code runs).
func TestCallReports(t *testing.T) {
	fails := Call((*probe)(nil), Options{Bound: 100 * time.Millisecond})
	var names []string
	for _, f := range fails {
		names = append(names, f.Method)
	}
	want := []string{"(*apicheck.probe).Deref", "(*apicheck.probe).Hang", "(*apicheck.probe).Panics"}
	if !slices.Equal(names, want) {
		t.Fatalf("failures %v, want %v", names, want)
	}
	if fails[1].Panic != nil || fails[0].Panic == nil {
		t.Errorf("a hang has no panic value and a panic has one: %+v", fails[:2])
	}
	if fails := Call(&probe{}, Options{Skip: []string{"Hang", "Panics"}}); len(fails) != 0 {
		t.Errorf("a live value: %v", fails)
	}
}
