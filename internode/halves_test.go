package internode_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/channels"
	"github.com/goep-dev/goep/internal/cpuemu"
	"github.com/goep-dev/goep/internal/ranktest"
	"github.com/goep-dev/goep/internode"
)

// The dispatch kernel's halves: a receiver unpacks the rows of its own
// node's sources as soon as the node's forwarders placed them, before any
// other node's rows arrive, and the rest only after. Node 1's ranks run
// notify but never dispatch, so node 0's network counters never move: its
// kernels give up on node 1 (the watchdog names a rank there), and by
// then each node-0 rank must hold exactly the reference's rows from
// sources 0 and 1 (x and source token) at their places in its receive
// outputs, while every other row (those of node 1's sources, which never
// came) is left as poisoned. A kernel that unpacked before the own half's
// counters would show garbage or poison in the own rows; one that
// unpacked the second half without its signal would overwrite poison.
func TestEmulatedOwnNodeRowsFirst(t *testing.T) {
	cpuemu.SkipUnavailable(t)
	_, err := cpuemu.Unknown(internode.KernelNotify)
	require.NoError(t, err)
	checkOwnNodeRowsFirst(t, emuBackend)
}

// The same on the GPUs present (ranks spread over them).
func TestOwnNodeRowsFirstGPU(t *testing.T) {
	skipNoGPU(t)
	checkOwnNodeRowsFirst(t, cudaBackend)
}

func checkOwnNodeRowsFirst(t *testing.T, b backend) {
	topo := internode.Topology{Nodes: 2, RanksPerNode: 2}
	s := internode.Shape{Topology: topo, Hidden: 128, TopK: 3, Experts: 8}
	w, h := s.World(), s.Hidden
	rng := rand.New(rand.NewSource(3100))
	const maxTokens = 12
	in := make([]internode.RankInput, w)
	for r := range in {
		in[r] = dispatchInput(rng, s, devIDs(rng, s, 4+rng.Intn(maxTokens-3)), false, false)
	}
	ref, err := internode.ReferenceDispatch(s, in, 0)
	require.NoError(t, err)
	for r := 0; r < topo.RanksPerNode; r++ {
		own := ref[r].RankPrefix[topo.RanksPerNode-1]
		require.Positive(t, own, "rank %d receives rows from its own node (the draw must give some)", r)
		require.Greater(t, int32(ref[r].Received()), own, "rank %d receives rows from node 1 too", r)
	}
	const poison = 0xA5
	got := make([][]byte, w)
	gotSrc := make([][]byte, w)
	gaveUp := make([]error, w)
	errs := runNotifyRanksFree(t, b, topo, time.Second, func(ctx context.Context, c *channels.Communicator) (*internode.Notify, func() error, error) {
		me := c.Rank()
		nt, m, free, err := notifyWithMem(ctx, c, s, internode.NotifyConfig{Tag: 81, MaxTokens: maxTokens, Forward: forward()})
		if err != nil {
			return nt, free, err
		}
		t := len(in[me].TopK) / s.TopK
		ids := make([]byte, 8*len(in[me].TopK))
		for j, v := range in[me].TopK {
			binary.LittleEndian.PutUint64(ids[8*j:], uint64(v))
		}
		x := make([]byte, 2*len(in[me].X))
		for j, v := range in[me].X {
			binary.LittleEndian.PutUint16(x[2*j:], v)
		}
		rows := w * maxTokens
		for _, p := range []struct {
			name string
			b    []byte
		}{{"ids", ids}, {"x", x}, {"rx", bytesOf(2*rows*h, poison)}, {"rsrc", bytesOf(4*rows, poison)}, {"rtopk", bytesOf(8*rows*s.TopK, poison)}} {
			if err := m.put(p.name, p.b); err != nil {
				return nt, free, err
			}
		}
		if err := nt.RunAsync(m.st, internode.DeviceNotify{TopK: m.off["ids"], Tokens: t, NumRecv: m.off["numRecv"],
			RankPrefix: m.off["prefix"], HostInvalid: m.mapped.Dev, HostRecvCount: m.mapped.Dev + 4, HostExpertCounts: m.mapped.Dev + 8}); err != nil {
			return nt, free, err
		}
		if err := m.st.Synchronize(); err != nil {
			return nt, free, err
		}
		if err := nt.Check(); err != nil {
			return nt, free, fmt.Errorf("rank %d: notify: %w", me, err)
		}
		if s.Node(me) == 1 {
			return nt, free, nil // never dispatches
		}
		if err := nt.DispatchAsync(m.st, internode.DeviceDispatch{X: m.off["x"], RecvX: m.off["rx"], RecvTopK: m.off["rtopk"],
			RecvSrcToken: m.off["rsrc"]}); err != nil {
			return nt, free, err
		}
		if err := m.st.Synchronize(); err != nil {
			return nt, free, err
		}
		gaveUp[me] = nt.Check()
		if got[me], err = m.get("rx", 2*rows*h); err != nil {
			return nt, free, err
		}
		gotSrc[me], err = m.get("rsrc", 4*rows)
		return nt, free, err
	})
	ranktest.NoErrors(t, errs)
	for r := 0; r < topo.RanksPerNode; r++ {
		var te *channels.TimeoutError
		require.True(t, errors.As(gaveUp[r], &te), "rank %d: %v, want a timeout", r, gaveUp[r])
		require.Equal(t, 1, s.Node(te.Peer), "rank %d: %v, want a rank of node 1 named", r, gaveUp[r])
		own := int(ref[r].RankPrefix[topo.RanksPerNode-1])
		for row := 0; row < w*maxTokens; row++ {
			src := int32(binary.LittleEndian.Uint32(gotSrc[r][4*row:]))
			xs := got[r][2*h*row : 2*h*(row+1)]
			if row < own {
				require.Equal(t, ref[r].RecvSrcToken[row], src, "rank %d row %d: source token", r, row)
				for j := 0; j < h; j++ {
					require.Equal(t, ref[r].RecvX[row*h+j], binary.LittleEndian.Uint16(xs[2*j:]), "rank %d row %d x[%d]", r, row, j)
				}
				continue
			}
			require.Equal(t, bytesOf(4, poison), gotSrc[r][4*row:4*row+4], "rank %d row %d (not from its node): source token written", r, row)
			require.Equal(t, bytesOf(2*h, poison), xs, "rank %d row %d (not from its node): x written", r, row)
		}
	}
}
