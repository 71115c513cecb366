package bench

import (
	"bytes"
	"encoding/binary"
	"github.com/goep-dev/goep/routing"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A version 1.0 file written out by hand from the format description: the
// 10-byte preamble, a 118-byte header (59 characters of dict, 58 spaces of
// padding, a newline: 128 bytes before the data) and six little-endian
// int64s.
var handMadeNPY = "\x93NUMPY\x01\x00\x76\x00" +
	"{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }" + strings.Repeat(" ", 58) + "\n" +
	"\x00\x00\x00\x00\x00\x00\x00\x00" + // 0
	"\x01\x00\x00\x00\x00\x00\x00\x00" + // 1
	"\xff\xff\xff\xff\xff\xff\xff\xff" + // -1
	"\xff\x00\x00\x00\x00\x00\x00\x00" + // 255
	"\x00\x01\x00\x00\x00\x00\x00\x00" + // 256
	"\x07\x00\x00\x00\x00\x00\x00\x00" // 7

func TestNPYByteExact(t *testing.T) {
	require.Len(t, handMadeNPY, 128+48)
	want := []int64{0, 1, -1, 255, 256, 7}
	var b bytes.Buffer
	require.NoError(t, WriteNPY(&b, want, 2, 3, false))
	assert.Equal(t, []byte(handMadeNPY), b.Bytes(), "the writer produces np.save's bytes")

	n, err := ReadNPY(strings.NewReader(handMadeNPY))
	require.NoError(t, err)
	assert.Equal(t, &NPYIndex{Tokens: 2, K: 3, Idx: want}, n)
}

func TestNPYRoundTrip(t *testing.T) {
	r, err := routing.Generate(routing.Shape{Tokens: 333, K: 9, Experts: 512, Ranks: 8}, routing.GenOptions{Seed: 5, Masked: 30})
	require.NoError(t, err)
	for _, as32 := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "topk.npy")
		var b bytes.Buffer
		require.NoError(t, WriteNPY(&b, r.Idx, r.Tokens, r.K, as32))
		assert.Zero(t, (b.Len()-4*(1+boolInt(!as32))*len(r.Idx))%64, "data starts at a multiple of 64")
		require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
		n, err := LoadNPY(path)
		require.NoError(t, err)
		assert.Equal(t, as32, n.Int32)
		back, err := n.Routing(512, 8)
		require.NoError(t, err)
		assert.Equal(t, r.Idx, back.Idx)
	}
	assert.ErrorContains(t, WriteNPY(&bytes.Buffer{}, []int64{1 << 31}, 1, 1, true), "does not fit int32")
	assert.ErrorContains(t, WriteNPY(&bytes.Buffer{}, []int64{1, 2}, 1, 1, false), "do not make a (1, 1) array")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// npyFile assembles a file of the given version around a header dict,
// padding as np.save does.
func npyFile(major byte, dict string, data []byte) []byte {
	pre := 10
	if major >= 2 {
		pre = 12
	}
	pad := (64 - (pre+len(dict)+1)%64) % 64
	hdr := dict + strings.Repeat(" ", pad) + "\n"
	b := []byte("\x93NUMPY")
	b = append(b, major, 0)
	if major >= 2 {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(hdr)))
	} else {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(hdr)))
	}
	return append(append(b, hdr...), data...)
}

func TestNPYVersions2And3AndHeaderVariants(t *testing.T) {
	data := []byte{5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}
	for _, major := range []byte{1, 2, 3} {
		f := npyFile(major, "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }", data)
		require.Zero(t, (len(f)-len(data))%64)
		n, err := ReadNPY(bytes.NewReader(f))
		require.NoError(t, err, "version %d", major)
		assert.Equal(t, &NPYIndex{Tokens: 1, K: 2, Int32: true, Idx: []int64{5, -1}}, n)
	}
	// Other key orders, double quotes, no trailing comma, extra padding
	// (numpy >= 1.23 leaves room to grow the shape), Python 2 longs.
	for _, dict := range []string{
		`{"shape": (1, 2), "fortran_order": False, "descr": "<i4"}`,
		"{'descr':'<i4','fortran_order':False,'shape':(1,2)}" + strings.Repeat(" ", 100),
		"{'descr': '<i4', 'fortran_order': False, 'shape': (1L, 2L), }",
	} {
		n, err := ReadNPY(bytes.NewReader(npyFile(1, dict, data)))
		require.NoError(t, err, dict)
		assert.Equal(t, []int64{5, -1}, n.Idx)
	}
	n, err := ReadNPY(bytes.NewReader(npyFile(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 8), }", nil)))
	require.NoError(t, err, "an empty routing is a valid file")
	assert.Equal(t, 0, n.Tokens)
	assert.Equal(t, 8, n.K)
}

func TestNPYErrors(t *testing.T) {
	i8 := func(shape string) string {
		return "{'descr': '<i8', 'fortran_order': False, 'shape': " + shape + ", }"
	}
	eight := make([]byte, 8)
	cases := []struct {
		file []byte
		msg  string
	}{
		{[]byte("\x93NUMP"), "file truncated"},
		{[]byte("PK\x03\x04zipfile"), "not a .npy file"},
		{[]byte("\x93NUMPY\x04\x00\x10\x00"), "version 4.0 not supported"},
		{[]byte("\x93NUMPY\x01\x01\x10\x00"), "version 1.1 not supported"},
		{[]byte("\x93NUMPY\x01\x00\x10"), "reading the header length: file truncated"},
		{[]byte("\x93NUMPY\x01\x00\x40\x00{'descr'"), "reading the 64-byte header: file truncated"},
		{[]byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f"), "implausible"},
		{npyFile(1, "{'descr': '<i8', 'fortran_order': True, 'shape': (1, 1), }", eight), "fortran_order is True"},
		{npyFile(1, "{'descr': '>i8', 'fortran_order': False, 'shape': (1, 1), }", eight), `dtype ">i8" not supported`},
		{npyFile(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }", eight), `dtype "<f4" not supported`},
		{npyFile(1, "{'descr': '<u8', 'fortran_order': False, 'shape': (1, 1), }", eight), `dtype "<u8" not supported`},
		{npyFile(1, "{'descr': '|i1', 'fortran_order': False, 'shape': (8, 1), }", eight), `dtype "|i1" not supported`},
		{npyFile(1, i8("(8,)"), make([]byte, 64)), "shape (8,) has 1 dimensions"},
		{npyFile(1, i8("(2, 2, 2)"), make([]byte, 64)), "shape (2, 2, 2) has 3 dimensions"},
		{npyFile(1, i8("()"), eight), "shape () has 0 dimensions"},
		{npyFile(1, i8("(4, 8)"), make([]byte, 100)), "data truncated: shape (4, 8) of <i8 needs 256 bytes, the file has 100"},
		{npyFile(3, i8("(1, 1)"), make([]byte, 9)), "trailing bytes"},
		{npyFile(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1), 'extra': 1}", eight), "want a string, True, False or a tuple"},
		{npyFile(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 1), 'x': 'y'}", eight), `unexpected key "x"`},
		{npyFile(1, "{'descr': '<i8', 'shape': (1, 1)}", eight), "'fortran_order' is missing"},
		{npyFile(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1, -1)}", eight), "want a non-negative dimension"},
		{npyFile(1, "{'descr': '<i8', 'descr': '<i8'}", eight), `key "descr" repeated`},
		{npyFile(1, "['descr']", eight), "want '{'"},
		{[]byte("\x93NUMPY\x01\x00\x04\x00{}  "), "does not end with a newline"},
	}
	for _, c := range cases {
		_, err := ReadNPY(bytes.NewReader(c.file))
		if assert.Error(t, err, c.msg) {
			assert.Contains(t, err.Error(), c.msg)
		}
	}
	_, err := LoadNPY(filepath.Join(t.TempDir(), "missing.npy"))
	assert.Error(t, err)
}

func TestNPYRoutingNamesBadEntry(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteNPY(&b, []int64{0, 1, 2, 300}, 2, 2, false))
	n, err := ReadNPY(&b)
	require.NoError(t, err)
	_, err = n.Routing(256, 8)
	assert.ErrorContains(t, err, "topk_idx[1][1] = 300")
}
