package plan

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoad feeds arbitrary bytes to the loader (seeded with the shipped
// plans: testdata/fuzz/FuzzLoad keeps the corpus). Whatever parses must
// also resolve without panicking, and a small 2-rank plan that resolves
// must run to a result or an error within its timeout.
func FuzzLoad(f *testing.F) {
	for _, name := range planFiles(f) {
		b, err := os.ReadFile(filepath.Join("testdata", "plans", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(spec{proto: "LL", tbs: []string{
		tb(0, op("cpkt", src(loc("i", 0, 2)), dst(loc("s", 0, 2)))),
		tb(1, op("rppkt", port, ch0, src(loc("s", 0, 2)), dst(rem(peerS, 2, 2)))),
		tb(2, op("upkt", src(loc("s", 2, 2)), dst(loc("o", 0, 2)))),
	}}.json()))
	f.Add([]byte(spec{sems: []int{1}, tbs: []string{tb(0, op("pipeline", `"iter_context":{"unit_size":16,"num_chunks":2}`,
		`"ops":[`+op("copy", `"tbg_info":{"tb_id":0,"tbg_size":1}`, src(loc("i", 0, 2)), dst(loc("o", 0, 2)))+`]`),
		op("sem_acquire", `"semaphore_ids":[0]`), op("sem_release", `"semaphore_ids":[0]`),
		op("barrier", `"barrier_id":1`, `"num_threadblocks":1`))}}.json()))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			return
		}
		for _, size := range []uint64{1, 48, 4096} {
			for r := 0; r < p.World() && r < 4; r++ {
				_, _ = Resolve(p, r, size, p.InPlace)
			}
		}
		// Run only small worlds: the point is no panic and no hang.
		if p.World() > 2 || len(data) > 1<<16 {
			return
		}
		w, err := NewHostWorld(p, p.World(), 64, p.InPlace, HostConfig{Timeout: 20 * time.Millisecond})
		if err != nil {
			return
		}
		for r := 0; r < p.World(); r++ {
			res := w.Resolved(r)
			if res.InputBytes+res.OutputBytes+res.ScratchBytes > 1<<20 || slowPipeline(res) {
				return // big buffers or long loops: slow, not interesting
			}
		}
		in, out := make([][]byte, p.World()), make([][]byte, p.World())
		for r := range in {
			res := w.Resolved(r)
			out[r] = make([]byte, res.OutputBytes)
			in[r] = make([]byte, res.InputBytes)
			if res.InPlace {
				if x := InPlaceInput(res, out[r]); x != nil {
					in[r] = x
				} else {
					out[r] = InPlaceOutput(res, in[r])
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() { _ = w.Run(ctx, Int32, in, out); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("launch did not end")
		}
	})
}

func slowPipeline(r *Resolved) bool {
	for _, b := range r.Blocks {
		for _, in := range b.Instrs {
			if in.Iterations*uint64(len(in.Body)) > 1<<12 {
				return true
			}
		}
	}
	return false
}
