package bench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/plan"
)

// TestPlanCommand runs `ep-bench plan` on a 2-GPU and an 8-GPU plan on the
// host backend: checks pass and timings print; a mode the plan is not
// written for is an error.
func TestPlanCommand(t *testing.T) {
	for _, args := range [][]string{
		{"plan", "--backend", "host", "--plan", "../collectives/plan/testdata/plans/reduce_pack.json", "--size", "4K,1000", "--iters", "1"},
		{"plan", "--backend", "host", "--plan", "../collectives/plan/testdata/plans/allreduce.json", "--size", "8K", "--iters", "1", "--dtype", "fp32"},
		{"plan", "--backend", "host", "--plan", "../collectives/plan/testdata/plans/sn_send_recv.json", "--size", "4K", "--iters", "1", "--packet", "LL8"},
	} {
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		if !strings.Contains(out.String(), " ok ") {
			t.Fatalf("%v: no passing check:\n%s", args, out.String())
		}
	}
	var out, errb bytes.Buffer
	code := Main([]string{"plan", "--backend", "host", "--plan", "../collectives/plan/testdata/plans/reduce.json", "--inplace=false", "--size", "4K"}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "the plan is in-place, the call out-of-place") {
		t.Fatalf("out of place run of an in-place plan: exit %d\n%s", code, errb.String())
	}
}

// planExpected's chunked reductions equal plan.Expected on random inputs
// that span several chunks and end in a partial one, for every reducing
// collective and type; a cancelled context stops it.
func TestPlanExpectedInChunksEqualsTheDefinition(t *testing.T) {
	defer func(c int) { planChunk = c }(planChunk)
	planChunk = 64
	for _, dt := range []plan.DataType{plan.BF16, plan.FP16, plan.FP32, plan.Int32} {
		for _, coll := range []string{"allreduce", "reducescatter", "allgather"} {
			const W = 3
			in := 3 * 100 * dt.Size() // three chunks and a part, divisible by W
			inputs := make([][]byte, W)
			for r := range inputs {
				inputs[r] = make([]byte, in)
				plan.FillSmallInt(dt, r, 42, inputs[r])
			}
			outBytes := map[string]int{"allreduce": in, "reducescatter": in / W, "allgather": in * W}[coll]
			want, err := plan.Expected(coll, dt, plan.ReduceSum, inputs, outBytes)
			require.NoError(t, err)
			got, err := planExpected(context.Background(), coll, dt, inputs, outBytes)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s %s", coll, dt)
			for r := range got {
				require.NoError(t, compareOutput(context.Background(), got[r], want[r]))
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := planExpected(ctx, "allreduce", plan.FP32, [][]byte{make([]byte, 1024), make([]byte, 1024)}, 1024)
	require.ErrorIs(t, err, errInterrupted)

	// compareOutput names the first differing byte, past the first chunk.
	a, b := make([]byte, 300), make([]byte, 300)
	b[200], b[250] = 7, 9
	require.EqualError(t, compareOutput(context.Background(), a, b), "output byte 200 of 300 is 0x0, want 0x7")
}

// TestPlanProgram compiles builtin DSL programs with `ep-bench plan
// --program`, runs and checks them on the host backend, and loads what
// --emit wrote.
func TestPlanProgram(t *testing.T) {
	emit := filepath.Join(t.TempDir(), "ring.json")
	for _, args := range [][]string{
		{"plan", "--backend", "host", "--program", "allreduce-ring", "--ranks", "4", "--size", "4K,1000", "--iters", "1", "--emit", emit},
		{"plan", "--backend", "host", "--program", "allgather-fullmesh", "--ranks", "2", "--size", "4K", "--iters", "1", "--inplace"},
		{"plan", "--backend", "host", "--program", "allreduce-allpairs-packet", "--ranks", "8", "--instances", "2", "--size", "64K", "--iters", "1"},
	} {
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		if !strings.Contains(out.String(), " ok ") {
			t.Fatalf("%v: no passing check:\n%s", args, out.String())
		}
	}
	p, err := plan.Load(emit)
	if err != nil || p.Name != "allreduce-ring" || p.World() != 4 {
		t.Fatalf("emitted plan: %v", err)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"plan", "--backend", "host", "--program", "nope"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "no builtin program") {
		t.Fatalf("unknown program: exit %d\n%s", code, errb.String())
	}
}
