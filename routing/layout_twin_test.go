package routing_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/internal/device"
	"github.com/goep-dev/goep/routing"
)

type handLayout struct {
	perRank, perExpert []int32
	invalid            int32
	inRank             []byte
}

// launchByHand packs the layout kernel's parameter list by hand (the twins
// read it in the kernel's order; LaunchLayout packs the same list) and
// reads the outputs back.
func launchByHand(t *testing.T, d device.Device, kernel string, s routing.Shape, ids []int64) handLayout {
	t.Helper()
	elem := 8
	if kernel == routing.KernelLayoutInt32 {
		elem = 4
	}
	raw := make([]byte, elem*len(ids))
	for i, v := range ids {
		if elem == 8 {
			binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
		} else {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
		}
	}
	oRank := len(raw)
	oExpert := oRank + 4*s.Ranks
	oInvalid := oExpert + 4*s.Experts
	oInRank := oInvalid + 4
	mem, err := d.Alloc(oInRank + s.Tokens*s.Ranks)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(mem)) }()
	poison := make([]byte, mem.Size)
	for i := range poison {
		poison[i] = 0xA5
	}
	copy(poison, raw)
	require.NoError(t, d.CopyIn(mem.Ptr, poison))
	at := func(o int) uintptr { return mem.Ptr + uintptr(o) }
	args := device.NewArgs(10).Ptr(at(0)).I32(int32(s.Tokens)).I32(int32(s.K)).I32(int32(s.Experts)).I32(int32(s.Ranks)).
		Ptr(at(oRank)).Ptr(at(oExpert)).Ptr(at(oInRank)).Ptr(at(oInvalid)).Ptr(0)
	require.NoError(t, d.Launch(kernel, device.D1(1), device.D1(32), 0, nil, args))
	out := make([]byte, mem.Size)
	require.NoError(t, d.CopyOut(out, mem.Ptr))
	i32s := func(o, n int) []int32 {
		v := make([]int32, n)
		for i := range v {
			v[i] = int32(binary.LittleEndian.Uint32(out[o+4*i:]))
		}
		return v
	}
	return handLayout{perRank: i32s(oRank, s.Ranks), perExpert: i32s(oExpert, s.Experts),
		invalid: i32s(oInvalid, 1)[0], inRank: out[oInRank:]}
}

// Hand-computed layouts, independent of CountLayout (the reference the
// other tests compare the twin with).
func TestLayoutTwinHandCases(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	for _, kernel := range []string{routing.KernelLayoutInt64, routing.KernelLayoutInt32} {
		// 2 tokens, K=2, 4 experts on 2 ranks; token 1 has a bad id (7).
		got := launchByHand(t, d, kernel, routing.Shape{Tokens: 2, K: 2, Experts: 4, Ranks: 2}, []int64{1, 2, 7, -1})
		assert.Equal(t, []int32{1, 1}, got.perRank, "%s: tokens per rank", kernel)
		assert.Equal(t, []int32{0, 1, 1, 0}, got.perExpert, "%s: tokens per expert", kernel)
		assert.Equal(t, int32(1), got.invalid, "%s: invalid entries", kernel)
		assert.Equal(t, []byte{1, 1, 0, 0}, got.inRank, "%s: is_token_in_rank", kernel)

		// 3 experts per rank (the rank is a multiply-high, not a shift), ids
		// on every rank boundary, a repeated rank, -1 and E itself.
		got = launchByHand(t, d, kernel, routing.Shape{Tokens: 3, K: 3, Experts: 12, Ranks: 4},
			[]int64{2, 3, -1, 11, 9, 12, 5, 6, 8})
		assert.Equal(t, []int32{1, 2, 1, 1}, got.perRank, "%s: tokens per rank", kernel)
		assert.Equal(t, []int32{0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1}, got.perExpert, "%s: tokens per expert", kernel)
		assert.Equal(t, int32(1), got.invalid, "%s: invalid entries", kernel)
		assert.Equal(t, []byte{1, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0}, got.inRank, "%s: is_token_in_rank", kernel)

		// 64 ranks of 5 experts: the last expert lands on the last rank.
		got = launchByHand(t, d, kernel, routing.Shape{Tokens: 1, K: 2, Experts: 320, Ranks: 64}, []int64{319, 4})
		wantRanks := make([]int32, 64)
		wantRanks[0], wantRanks[63] = 1, 1
		assert.Equal(t, wantRanks, got.perRank, "%s: tokens per rank", kernel)
		assert.Equal(t, []byte{1}, got.inRank[:1], kernel)
		assert.Equal(t, byte(1), got.inRank[63], kernel)
		assert.Equal(t, int32(0), got.invalid, kernel)
	}
}

func TestLayoutTwinRejectsBadShape(t *testing.T) {
	d := device.OpenHost(0)
	defer d.Close()
	args := device.NewArgs(10).Ptr(0).I32(1).I32(1).I32(6).I32(4).Ptr(0).Ptr(0).Ptr(0).Ptr(0).Ptr(0)
	err := d.Launch(routing.KernelLayoutInt64, device.D1(1), device.D1(32), 0, nil, args)
	assert.ErrorContains(t, err, "do not divide evenly")
	err = d.Launch(routing.KernelLayoutInt32, device.D1(1), device.D1(32), 0, nil, device.NewArgs(1).Ptr(0))
	assert.ErrorContains(t, err, "out of range", "a short argument list is an error, not a crash")
}
