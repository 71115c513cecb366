package collectives_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives"
	"github.com/goep-dev/goep/collectives/colltest"
	"github.com/goep-dev/goep/collectives/ref"
	"github.com/goep-dev/goep/internal/device"
)

// A tuning table drives the selector: the most specific covering rule
// wins, then the tightest bound; zero-copy rules fall back to their
// unregistered choice; a table for another world is ignored.
func TestTuningTableDrivesSelection(t *testing.T) {
	table := &collectives.Tuning{Version: collectives.TuningVersion, World: 2, Rules: []collectives.Rule{
		{Collective: "allreduce", MaxBytes: 4096, Algorithm: "scratch", Blocks: 2},
		{Collective: "allreduce", MaxBytes: 1 << 20, Algorithm: "ll2"},
		{Collective: "allreduce", Algorithm: "zc", Blocks: 3, Unregistered: "scratch"},
		{Collective: "allreduce", Mode: "graph", MaxBytes: 1 << 16, Algorithm: "ll"},
		{Collective: "allgather", DType: "fp32", Algorithm: "scratch"},
	}}
	path := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, table.Save(path))
	loaded, err := collectives.LoadTuning(path)
	require.NoError(t, err)
	require.Equal(t, table, loaded)

	run(t, world{device.Host, 2}, hostConfig(), func(ctx context.Context, c *collectives.Communicator) error {
		c.SetTuning(loaded)
		for _, tc := range []struct {
			k          collectives.Kind
			bytes      int
			dt         ref.DataType
			reg, graph bool
			want       string
		}{
			{collectives.AllReduce, 1024, ref.BF16, false, false, "scratch"},
			{collectives.AllReduce, 8192, ref.BF16, false, false, "ll2"},
			{collectives.AllReduce, 8 << 20, ref.BF16, true, false, "zc"},
			{collectives.AllReduce, 8 << 20, ref.BF16, false, false, "scratch"},
			{collectives.AllReduce, 1024, ref.BF16, false, true, "ll"},     // the graph rule beats a tighter general one
			{collectives.AllReduce, 1 << 17, ref.BF16, false, true, "ll2"}, // past the graph rule's bound
			{collectives.AllGather, 64, ref.FP32, false, false, "scratch"},
			{collectives.AllGather, 64, ref.BF16, false, false, "ll"}, // no rule: built in
		} {
			got, err := c.Select(tc.k, tc.bytes/tc.dt.Size(), tc.dt, ref.Sum, tc.reg, tc.graph)
			if err != nil {
				return err
			}
			if got != tc.want {
				return fmt.Errorf("%+v selected %s", tc, got)
			}
		}
		// Another world's table is ignored.
		other := *loaded
		other.World = 8
		c.SetTuning(&other)
		got, err := c.Select(collectives.AllReduce, 512, ref.BF16, ref.Sum, false, false)
		if err != nil || got != collectives.AlgoLL {
			return fmt.Errorf("with another world's table: %s, %v", got, err)
		}
		return nil
	})
	// Bad tables are refused with the reason.
	for _, bad := range []collectives.Tuning{
		{Version: 99, World: 2},
		{Version: 1, World: 2, Rules: []collectives.Rule{{Collective: "alltoall", Algorithm: "ll"}}},
		{Version: 1, World: 2, Rules: []collectives.Rule{{Collective: "allgather", Algorithm: "ll2"}}},
		{Version: 1, World: 2, Rules: []collectives.Rule{{Collective: "allreduce", Algorithm: "ll", Mode: "sometimes"}}},
	} {
		require.NoError(t, bad.Save(path))
		_, err := collectives.LoadTuning(path)
		require.Error(t, err, "%+v", bad)
	}
	require.NoError(t, os.WriteFile(path, []byte("{"), 0o644))
	_, err = collectives.LoadTuning(path)
	require.Error(t, err)
}

// GPUs: pointers that are not this GPU's device memory are refused before
// anything is enqueued; Work.Wait orders another stream after the call.
func TestGPUPointersAndWork(t *testing.T) {
	if gpus() == 0 {
		t.Skip("no CUDA GPU")
	}
	w := world{device.CUDA, 2}
	bufs := make([]device.Buffer, 2)
	run(t, w, gpuConfig(w.ranks), func(ctx context.Context, c *collectives.Communicator) error {
		b, err := colltest.NewBuffers(ctx, c, 1<<20, false)
		if err != nil {
			return err
		}
		defer b.Free()
		bufs[c.Rank()] = b.Send
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		other := bufs[1-c.Rank()]
		s := c.Device().DefaultStream()
		host := make([]byte, 4096)
		type badCall struct {
			send, recv uintptr
			count      int
			want       string
		}
		cases := []badCall{
			{b.Send.Ptr, b.Send.Ptr, 1 << 20, "past the end of its allocation"}, // in place: no overlap to refuse first
			{hostPtr(host), b.Recv.Ptr, 64, "not device memory"},
		}
		// The other rank's memory is another GPU's only when the two ranks
		// do not share one (with one GPU it is this GPU's memory, and valid).
		if gpus() > 1 {
			cases = append(cases, badCall{other.Ptr, b.Recv.Ptr, 64, "memory of GPU"})
		}
		for _, tc := range cases {
			_, err := c.AllReduce(ctx, s, tc.send, tc.recv, tc.count, ref.BF16, ref.Sum)
			if err == nil || !containsAll(err.Error(), tc.want) {
				return fmt.Errorf("call with %#x: %v, want an error with %q", tc.send, err, tc.want)
			}
		}
		// Work.Wait: a second stream's check runs after the call.
		s2, err := c.Device().NewStream()
		if err != nil {
			return err
		}
		defer s2.Close()
		cs := colltest.Case{Kind: collectives.AllReduce, Count: 100000, DType: ref.BF16, Op: ref.Sum, Seed: 8}
		if err := b.Prepare(cs, s); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		work, err := b.Issue(ctx, cs, s)
		if err != nil {
			return err
		}
		if err := work.Wait(s2); err != nil {
			return err
		}
		if err := b.VerifyDevice(cs, s2); err != nil {
			return err
		}
		if !work.Done() || work.Err() != nil {
			return fmt.Errorf("after the wait: done %v, err %v", work.Done(), work.Err())
		}
		return c.Barrier(ctx)
	})
}
