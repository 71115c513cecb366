package plan

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// loadTestPlan loads testdata/plans/name.
func loadTestPlan(t testing.TB, name string) *Plan {
	t.Helper()
	p, err := Load(filepath.Join("testdata", "plans", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mustParse parses a hand-written plan.
func mustParse(t testing.TB, js string) *Plan {
	t.Helper()
	p, err := Parse([]byte(js))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return p
}

// buffers allocates a launch's buffers, filled with rank-dependent data;
// in place, inputs alias outputs. The inputs' original contents come back
// too (in place runs overwrite them).
func buffers(w *HostWorld, dt DataType, seed uint64) (in, out, orig [][]byte) {
	W := w.World()
	in, out, orig = make([][]byte, W), make([][]byte, W), make([][]byte, W)
	for r := 0; r < W; r++ {
		res := w.Resolved(r)
		garbage := rand.New(rand.NewPCG(seed^0xdead, uint64(r)))
		if res.InPlace && res.InputBytes > res.OutputBytes {
			in[r] = make([]byte, res.InputBytes)
			out[r] = InPlaceOutput(res, in[r])
		} else {
			out[r] = make([]byte, res.OutputBytes)
			for i := range out[r] {
				out[r][i] = byte(garbage.Uint32())
			}
			if res.InPlace {
				in[r] = InPlaceInput(res, out[r])
			} else {
				in[r] = make([]byte, res.InputBytes)
			}
		}
		FillSmallInt(dt, r, seed, in[r])
		orig[r] = bytes.Clone(in[r])
	}
	return in, out, orig
}

// runAndCheck runs p on its world for msgBytes and compares every output
// with the collective's definition.
func runAndCheck(t testing.TB, p *Plan, msgBytes uint64, dt DataType, op ReduceOp, cfg HostConfig, launches int) {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 20 * time.Second
	}
	w, err := NewHostWorld(p, p.World(), msgBytes, p.InPlace, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for l := 0; l < launches; l++ {
		seed := uint64(msgBytes)*31 + uint64(l)
		in, out, orig := buffers(w, dt, seed)
		if err := w.Run(context.Background(), dt, in, out); err != nil {
			t.Fatalf("%s size %d %s launch %d: %v", p.Name, msgBytes, dt, l, err)
		}
		want, err := Expected(p.Collective, dt, op, orig, len(out[0]))
		if err != nil {
			t.Fatal(err)
		}
		for r := range out {
			if i := firstDiff(out[r], want[r]); i >= 0 {
				t.Fatalf("%s size %d %s launch %d: rank %d: output differs first at byte %d of %d (got %#x, want %#x)",
					p.Name, msgBytes, dt, l, r, i, len(out[r]), out[r][i], want[r][i])
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func planFiles(t testing.TB) []string {
	ents, err := os.ReadDir(filepath.Join("testdata", "plans"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".json" {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatal("no plans in testdata/plans")
	}
	return out
}

func describe(a ...any) string { return fmt.Sprint(a...) }
