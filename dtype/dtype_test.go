package dtype

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The values are kernel ABI (coll_common.cuh's GOEP_COLL_* codes are checked
// against them in collectives/abi): pin them here so a renumbering is seen.
func TestValuesArePinned(t *testing.T) {
	want := map[DType]uint8{None: 0, BF16: 1, FP8E4M3: 2, FP32: 3, I32: 4, I64: 5, U8: 6, FP16: 7}
	for d, v := range want {
		require.Equal(t, v, uint8(d), d.String())
	}
}

func TestSizes(t *testing.T) {
	want := map[DType]int{None: 0, BF16: 2, FP16: 2, FP32: 4, FP8E4M3: 1, I32: 4, I64: 8, U8: 1, DType(200): 0}
	for d, n := range want {
		require.Equal(t, n, d.Size(), d.String())
		require.Equal(t, n != 0, d.Valid())
	}
}

func TestParseEveryNameRoundTrips(t *testing.T) {
	for _, d := range All {
		got, err := Parse(" " + strings.ToUpper(d.String()) + " ")
		require.NoError(t, err)
		require.Equal(t, d, got)
		for _, n := range names[d] {
			got, err := Parse(n)
			require.NoError(t, err, n)
			require.Equal(t, d, got, n)
		}
	}
	_, err := Parse("fp4")
	require.ErrorContains(t, err, `unknown data type "fp4"`)
	require.Equal(t, "dtype(99)", DType(99).String())
	require.Equal(t, "none", None.String())
}

func TestParseOfNamesTheAllowedTypes(t *testing.T) {
	allowed := []DType{BF16, FP16, FP32}
	d, err := ParseOf("half", allowed)
	require.NoError(t, err)
	require.Equal(t, FP16, d)
	_, err = ParseOf("int32", allowed)
	require.EqualError(t, err, "data type int32 is not supported here (want bf16, fp16 or fp32)")
	_, err = ParseOf("x", allowed)
	require.EqualError(t, err, `unknown data type "x" (want bf16, fp16 or fp32)`)
	require.Equal(t, "bf16", List([]DType{BF16}))
}

func TestParseClipsEchoedInput(t *testing.T) {
	_, err := Parse(strings.Repeat("x", 1<<20))
	require.Error(t, err)
	require.Less(t, len(err.Error()), 200)
	require.Contains(t, err.Error(), "(1048576 bytes)")
}
