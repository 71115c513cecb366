package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireBatch skips where the driver has no cuMemcpyBatchAsync.
func requireBatch(t *testing.T) {
	t.Helper()
	if !HasMemcpyBatch() {
		v, _ := DriverVersion()
		t.Skipf("the driver (CUDA %d) has no cuMemcpyBatchAsync (12.8+)", v)
	}
}

// A batch of random pieces lands byte-exact where a plain Go copy of the
// same pieces puts them, and leaves every other byte alone.
func TestMemcpyBatchGPU(t *testing.T) {
	ctx := gpuContext(t)
	requireBatch(t)
	s := newStream(t, ctx)
	const size = 8<<20 + 12
	src := randomBytes(23, size)
	ps, pd := memAlloc(t, ctx, size), memAlloc(t, ctx, size)
	require.NoError(t, MemcpyHtoD(ctx, ps, src))
	rng := rand.New(rand.NewPCG(23, 1))
	for _, count := range []int{1, 3, 17, 200} {
		for _, overlap := range []bool{false, true} {
			require.NoError(t, MemsetD8(ctx, pd, 0x5a, size))
			want := bytes.Repeat([]byte{0x5a}, size)
			// Disjoint destination ranges (a batch's copies run in no order),
			// each from a random source offset.
			cuts := make([]int, 0, 2*count)
			for len(cuts) < 2*count {
				cuts = append(cuts, rng.IntN(size+1))
			}
			sort.Ints(cuts)
			var dsts, srcs []DevicePtr
			var sizes []int
			for i := 0; i < len(cuts); i += 2 {
				d, n := cuts[i], cuts[i+1]-cuts[i]
				o := rng.IntN(size - n + 1)
				dsts, srcs, sizes = append(dsts, pd.Add(d)), append(srcs, ps.Add(o)), append(sizes, n)
				copy(want[d:d+n], src[o:o+n])
			}
			require.NoError(t, MemcpyBatchAsync(dsts, srcs, sizes, overlap, s))
			require.NoError(t, s.Synchronize())
			got := readDevice(t, ctx, pd, size)
			if !bytes.Equal(want, got) {
				i := 0
				for want[i] == got[i] {
					i++
				}
				t.Fatalf("%d copies (overlap %v): byte %d is %#x, want %#x", count, overlap, i, got[i], want[i])
			}
		}
	}
	require.NoError(t, MemcpyBatchAsync(nil, nil, nil, false, s), "an empty batch")
	require.ErrorContains(t, MemcpyBatchAsync([]DevicePtr{pd}, nil, []int{1}, false, s), "1 destinations, 0 sources")
	require.ErrorIs(t, MemcpyBatchAsync([]DevicePtr{pd}, []DevicePtr{ps}, []int{-1}, false, s), errNegativeSize)
	require.ErrorIs(t, MemcpyBatchAsync([]DevicePtr{pd}, []DevicePtr{ps}, []int{1}, false, nil), errNilStream)
}

// TestCopyBatchLab measures what a copy costs the copy engine when a put
// is cut into pieces (issue 14: the port over CUDA IPC pays about 3 us a
// put): GPUs 0 and 1 copy the same count to each other at once over
// NVLink, cut into 1 to 256 pieces issued as separate copies on one stream
// or as one cuMemcpyBatchAsync (with and without the hint to overlap with
// kernels). Every copy is queued behind a stream wait that the host
// releases after issuing all of them, so the host's issue cost is not in
// the figure. It measures, it does not check: it runs only with
// GOEP_CE_LAB=1 on 2+ GPUs with peer access.
func TestCopyBatchLab(t *testing.T) {
	if os.Getenv("GOEP_CE_LAB") != "1" {
		t.Skip("set GOEP_CE_LAB=1 to run the copy-engine lab")
	}
	devs := requireGPUs(t, 2)
	requireBatch(t)
	ctxs := []*Context{retain(t, devs[0]), retain(t, devs[1])}
	for i := range 2 {
		ok, err := devs[i].CanAccessPeer(devs[1-i])
		require.NoError(t, err)
		if !ok {
			t.Skip("no peer access between GPUs 0 and 1")
		}
		require.NoError(t, ctxs[i].EnablePeerAccess(ctxs[1-i]))
	}
	t.Cleanup(func() {
		for i := range 2 {
			_ = ctxs[i].DisablePeerAccess(ctxs[1-i])
		}
	})
	const size = 58720256 // an EP2 dispatch's network bytes at 4096 tokens of 7168 BF16
	var src, dst [2]DevicePtr
	var streams, gates [2]*Stream
	var flags [2]DevicePtr
	for i := range 2 {
		src[i], dst[i] = memAlloc(t, ctxs[i], size), memAlloc(t, ctxs[i], size)
		require.NoError(t, MemsetD8(ctxs[i], src[i], byte(i+1), size))
		streams[i], gates[i] = newStream(t, ctxs[i]), newStream(t, ctxs[i])
		flags[i] = memAlloc(t, ctxs[i], 4)
		require.NoError(t, MemsetD32(ctxs[i], flags[i], 0, 1))
	}
	type mode struct {
		name           string
		batch, overlap bool
	}
	modes := []mode{{"stream", false, false}, {"batch", true, false}, {"batch+overlap", true, true}}
	const reps = 7 // the first warms up; the median of the rest
	gate := uint32(0)
	run := func(m mode, pieces int) (us [2]float64, issueUS float64) {
		var samples [2][]float64
		var issue []float64
		for rep := range reps {
			gate++
			var ev [2][2]*Event
			for i := range 2 {
				for k := range 2 {
					e, err := NewEvent(ctxs[i], 0)
					require.NoError(t, err)
					ev[i][k] = e
				}
				require.NoError(t, streams[i].WaitValue32(flags[i], gate, WaitValueGEQ))
				require.NoError(t, ev[i][0].Record(streams[i]))
				piece := (size / pieces) &^ 15
				var dsts, srcs []DevicePtr
				var sizes []int
				for off := 0; off < size; off += piece {
					n := min(piece, size-off)
					dsts, srcs, sizes = append(dsts, dst[1-i].Add(off)), append(srcs, src[i].Add(off)), append(sizes, n)
				}
				t0 := time.Now()
				if m.batch {
					require.NoError(t, MemcpyBatchAsync(dsts, srcs, sizes, m.overlap, streams[i]))
				} else {
					for k := range dsts {
						require.NoError(t, MemcpyDtoDAsync(dsts[k], srcs[k], sizes[k], streams[i]))
					}
				}
				if rep > 0 {
					issue = append(issue, float64(time.Since(t0).Nanoseconds())/1e3)
				}
				require.NoError(t, ev[i][1].Record(streams[i]))
			}
			for i := range 2 {
				require.NoError(t, gates[i].WriteValue32(flags[i], gate, 0))
			}
			for i := range 2 {
				require.NoError(t, ev[i][1].Synchronize())
				ms, err := ElapsedTime(ev[i][0], ev[i][1])
				require.NoError(t, err)
				if rep > 0 {
					samples[i] = append(samples[i], 1e3*float64(ms))
				}
				require.NoError(t, ev[i][0].Destroy())
				require.NoError(t, ev[i][1].Destroy())
			}
		}
		for i := range 2 {
			slices.Sort(samples[i])
			us[i] = samples[i][len(samples[i])/2]
		}
		slices.Sort(issue)
		return us, issue[len(issue)/2]
	}
	start := time.Now()
	var table bytes.Buffer
	fmt.Fprintf(&table, "%d bytes each way, GPU 0 -> 1 and 1 -> 0 at once, median of %d, us (GB/s) GPU 0 / GPU 1, [host us to issue them]\n", size, reps-1)
	fmt.Fprintf(&table, "%-8s", "pieces")
	for _, m := range modes {
		fmt.Fprintf(&table, " | %-38s", m.name)
	}
	fmt.Fprintln(&table)
	for _, pieces := range []int{1, 4, 16, 64, 256} {
		fmt.Fprintf(&table, "%-8d", pieces)
		for _, m := range modes {
			us, issue := run(m, pieces)
			fmt.Fprintf(&table, " | %6.1f / %6.1f (%3.0f / %3.0f) [%5.1f]", us[0], us[1], size/us[0]/1e3, size/us[1]/1e3, issue)
		}
		fmt.Fprintln(&table)
	}
	// A batch's source and destination order: the data is what a stream of
	// the same pieces would have written.
	for i := range 2 {
		got := make([]byte, 4096)
		require.NoError(t, MemcpyDtoH(ctxs[1-i], got, dst[1-i].Add(size-4096)))
		require.Equal(t, bytes.Repeat([]byte{byte(i + 1)}, 4096), got, "GPU %d's copy", i)
	}
	t.Logf("copy-engine batch lab (%v):\n%s", time.Since(start).Round(time.Millisecond), table.String())
}
