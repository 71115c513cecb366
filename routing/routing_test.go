package routing

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateIndicesNamesTokenAndSlot(t *testing.T) {
	s := Shape{Tokens: 3, K: 2, Experts: 8, Ranks: 2}
	cases := []struct {
		idx []int64
		msg string
	}{
		{[]int64{0, 1, 2, 8, 4, 5}, "topk_idx[1][1] = 8"},
		{[]int64{0, 1, 2, 3, -2, 5}, "topk_idx[2][0] = -2"},
		{[]int64{0, 1, 2, 3, 4, 1 << 40}, "topk_idx[2][1] = 1099511627776"},
		{[]int64{0, 1, 2, 3}, "has 4 entries, want T*K = 6"},
	}
	for _, c := range cases {
		err := ValidateIndices(c.idx, s)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.msg)
		_, err = NewRouting(c.idx, s)
		assert.Error(t, err)
	}
	err := ValidateIndices([]int32{0, -1, 7, 7, -1, -1}, s)
	assert.NoError(t, err, "-1 and repeated experts are valid")
	err = ValidateIndices([]int32{0}, Shape{Tokens: 1, K: 1, Experts: 6, Ranks: 4})
	assert.ErrorContains(t, err, "do not divide evenly")
}

func TestCheckDistinct(t *testing.T) {
	s := Shape{Tokens: 2, K: 3, Experts: 4, Ranks: 2}
	r, err := NewRouting([]int64{0, 1, -1, 2, -1, 2}, s)
	require.NoError(t, err)
	assert.ErrorContains(t, r.CheckDistinct(), "token 1 names expert 2 twice (slot 2)")
	r, err = NewRouting([]int32{0, 1, -1, -1, -1, 0}, s)
	require.NoError(t, err)
	assert.NoError(t, r.CheckDistinct(), "-1 may repeat; tokens do not share state")
}

func TestEncode(t *testing.T) {
	r, err := NewRouting([]int64{3, -1}, Shape{Tokens: 1, K: 2, Experts: 4, Ranks: 1})
	require.NoError(t, err)
	b64 := r.Encode(false)
	require.Len(t, b64, 16)
	assert.Equal(t, uint64(3), binary.LittleEndian.Uint64(b64))
	assert.Equal(t, ^uint64(0), binary.LittleEndian.Uint64(b64[8:]))
	b32 := r.Encode(true)
	require.Len(t, b32, 8)
	assert.Equal(t, uint32(3), binary.LittleEndian.Uint32(b32))
	assert.Equal(t, ^uint32(0), binary.LittleEndian.Uint32(b32[4:]))
	assert.Equal(t, []int32{3, -1}, r.Int32())
}
