package internode

import (
	"encoding/binary"
	"unsafe"
)

// littleEndian: the host's byte order is the wire's (every platform goep
// builds for today), so rows of uint16 convert with one copy instead of a
// decode per element (the host backend's receive unpack spent most of its
// time there).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// getU16s decodes len(dst) little-endian uint16s from src.
func getU16s(dst []uint16, src []byte) {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 2*len(dst)), src[:2*len(dst)])
		return
	}
	for j := range dst {
		dst[j] = binary.LittleEndian.Uint16(src[2*j:])
	}
}

// putU16s encodes src little-endian into dst.
func putU16s(dst []byte, src []uint16) {
	if littleEndian && len(src) > 0 {
		copy(dst[:2*len(src)], unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 2*len(src)))
		return
	}
	for j, v := range src {
		binary.LittleEndian.PutUint16(dst[2*j:], v)
	}
}
