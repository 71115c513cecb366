package buffer

import (
	"encoding/binary"
	"unsafe"
)

// littleEndian: the host's byte order is the device buffers' (every
// platform goep builds for today), so the host backend's conversions
// between typed slices and device bytes are one copy instead of a loop per
// element (they were about half of a host-backend internode call).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// u16Bytes and f32Bytes view v's memory as bytes (little-endian hosts).
func u16Bytes(v []uint16) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 2*len(v))
}

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
