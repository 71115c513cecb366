package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Args packs kernel parameters the way the CUDA ABI lays them out: each value
// at its natural alignment in one byte buffer. The CUDA backend hands the
// buffer to the driver; the host backend's Go kernels read the same values
// back by index, so a kernel's parameter list is written once.
//
// An Args is reusable (Reset) so hot paths do not allocate.
type Args struct {
	buf     []byte
	offsets []uint32
	kinds   []argKind
	err     error // the first value that did not fit its parameter (U32Int, I32Int)
}

type argKind uint8

const (
	kindPtr argKind = iota + 1
	kindU32
	kindU64
	kindF32
)

func (k argKind) String() string {
	switch k {
	case kindPtr:
		return "pointer"
	case kindU32:
		return "32-bit integer"
	case kindU64:
		return "64-bit integer"
	case kindF32:
		return "float32"
	}
	return "unknown"
}

// NewArgs returns an empty argument list with room for n parameters.
func NewArgs(n int) *Args {
	return &Args{buf: make([]byte, 0, 8*n), offsets: make([]uint32, 0, n), kinds: make([]argKind, 0, n)}
}

// errNilArgs marks a list built from a nil *Args: the appenders then
// record their values in a new list that carries this error (Err), so a
// launch with it is refused rather than a kernel run with arguments
// missing.
var errNilArgs = errors.New("kernel arguments appended to a nil *Args (NewArgs makes one)")

// orNew is a, or for a nil a a new list that carries errNilArgs.
func (a *Args) orNew() *Args {
	if a == nil {
		return &Args{err: errNilArgs}
	}
	return a
}

// Reset empties the list, keeping its storage.
func (a *Args) Reset() *Args {
	if a == nil {
		return a.orNew()
	}
	a.buf, a.offsets, a.kinds, a.err = a.buf[:0], a.offsets[:0], a.kinds[:0], nil
	return a
}

func (a *Args) put(kind argKind, size int, v uint64) *Args {
	a = a.orNew()
	off := (len(a.buf) + size - 1) &^ (size - 1)
	for len(a.buf) < off+size {
		a.buf = append(a.buf, 0)
	}
	if size == 4 {
		binary.LittleEndian.PutUint32(a.buf[off:], uint32(v))
	} else {
		binary.LittleEndian.PutUint64(a.buf[off:], v)
	}
	a.offsets = append(a.offsets, uint32(off))
	a.kinds = append(a.kinds, kind)
	return a
}

// Ptr appends a device pointer.
func (a *Args) Ptr(p uintptr) *Args { return a.put(kindPtr, 8, uint64(p)) }

// U32 appends an unsigned 32-bit integer.
func (a *Args) U32(v uint32) *Args { return a.put(kindU32, 4, uint64(v)) }

// I32 appends a signed 32-bit integer.
func (a *Args) I32(v int32) *Args { return a.put(kindU32, 4, uint64(uint32(v))) }

// U32Int appends v as an unsigned 32-bit integer, checked: a v outside
// [0, 2^32) is recorded (Err) and both backends refuse to launch with
// these arguments, instead of a kernel seeing the value wrapped.
func (a *Args) U32Int(v int) *Args {
	a = a.orNew()
	if (v < 0 || uint64(v) > math.MaxUint32) && a.err == nil {
		a.err = fmt.Errorf("kernel argument %d: %d does not fit an unsigned 32-bit parameter", len(a.offsets), v)
	}
	return a.put(kindU32, 4, uint64(uint32(v)))
}

// I32Int appends v as a signed 32-bit integer, checked like U32Int.
func (a *Args) I32Int(v int) *Args {
	a = a.orNew()
	if (v < math.MinInt32 || v > math.MaxInt32) && a.err == nil {
		a.err = fmt.Errorf("kernel argument %d: %d does not fit a signed 32-bit parameter", len(a.offsets), v)
	}
	return a.put(kindU32, 4, uint64(uint32(int32(v))))
}

// U64Int appends v as an unsigned 64-bit integer, checked: a negative v is
// recorded (Err).
func (a *Args) U64Int(v int) *Args {
	a = a.orNew()
	if v < 0 && a.err == nil {
		a.err = fmt.Errorf("kernel argument %d: %d does not fit an unsigned 64-bit parameter", len(a.offsets), v)
	}
	return a.put(kindU64, 8, uint64(v))
}

// Err is the first checked value that did not fit its parameter (nil when
// every one did, and on a nil Args).
func (a *Args) Err() error {
	if a == nil {
		return nil
	}
	return a.err
}

// U64 appends an unsigned 64-bit integer.
func (a *Args) U64(v uint64) *Args { return a.put(kindU64, 8, v) }

// I64 appends a signed 64-bit integer.
func (a *Args) I64(v int64) *Args { return a.put(kindU64, 8, uint64(v)) }

// F32 appends a float32.
func (a *Args) F32(v float32) *Args { return a.put(kindF32, 4, uint64(math.Float32bits(v))) }

// Len is the number of parameters (0 for a nil Args).
func (a *Args) Len() int {
	if a == nil {
		return 0
	}
	return len(a.offsets)
}

// Bytes is the packed parameter buffer; Offsets gives each parameter's offset.
func (a *Args) Bytes() []byte {
	if a == nil {
		return nil
	}
	return a.buf
}

// Offsets gives the byte offset of each parameter in Bytes.
func (a *Args) Offsets() []uint32 {
	if a == nil {
		return nil
	}
	return a.offsets
}

func (a *Args) at(i int, want argKind) (int, error) {
	if a == nil {
		return 0, errNilArgs
	}
	if i < 0 || i >= len(a.offsets) {
		return 0, fmt.Errorf("kernel argument %d out of range (have %d)", i, len(a.offsets))
	}
	if a.kinds[i] != want {
		return 0, fmt.Errorf("kernel argument %d is a %v, read as a %v", i, a.kinds[i], want)
	}
	return int(a.offsets[i]), nil
}

// The readers below are for host kernels. They panic on a mismatch because a
// mismatch is a bug in a kernel's Go twin, and the host backend turns a host
// kernel's panic into an error naming the kernel.

// GetPtr reads parameter i as a pointer.
func (a *Args) GetPtr(i int) uintptr { return uintptr(a.get64(i, kindPtr)) }

// GetU64 reads parameter i as an unsigned 64-bit integer.
func (a *Args) GetU64(i int) uint64 { return a.get64(i, kindU64) }

// GetI64 reads parameter i as a signed 64-bit integer.
func (a *Args) GetI64(i int) int64 { return int64(a.get64(i, kindU64)) }

// GetU32 reads parameter i as an unsigned 32-bit integer.
func (a *Args) GetU32(i int) uint32 { return a.get32(i, kindU32) }

// GetI32 reads parameter i as a signed 32-bit integer.
func (a *Args) GetI32(i int) int32 { return int32(a.get32(i, kindU32)) }

// GetF32 reads parameter i as a float32.
func (a *Args) GetF32(i int) float32 { return math.Float32frombits(a.get32(i, kindF32)) }

func (a *Args) get64(i int, k argKind) uint64 {
	off, err := a.at(i, k)
	if err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(a.buf[off:])
}

func (a *Args) get32(i int, k argKind) uint32 {
	off, err := a.at(i, k)
	if err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint32(a.buf[off:])
}

// Launch limits (the CUDA limits; the host backend enforces the same so a
// call that would fail on a GPU fails in CI too).
const (
	MaxGridX        = math.MaxInt32
	MaxGridYZ       = 65535
	MaxBlockThreads = 1024
	MaxSharedMem    = 1 << 30
)

// checkLaunch refuses a launch shape or argument list that a kernel would
// see wrapped: dimensions are 32-bit (0 means 1, as before), the block at
// most 1024 threads, the arguments all fitting (Args.Err).
func checkLaunch(grid, block Dim3, smem int, args *Args) error {
	for _, d := range []struct {
		what string
		v    int
		max  int
	}{{"grid.X", grid.X, MaxGridX}, {"grid.Y", grid.Y, MaxGridYZ}, {"grid.Z", grid.Z, MaxGridYZ},
		{"block.X", block.X, MaxBlockThreads}, {"block.Y", block.Y, MaxBlockThreads}, {"block.Z", block.Z, 64}} {
		if d.v < 0 || d.v > d.max {
			return fmt.Errorf("%s = %d (want 0..%d)", d.what, d.v, d.max)
		}
	}
	if t := max(block.X, 1) * max(block.Y, 1) * max(block.Z, 1); t > MaxBlockThreads {
		return fmt.Errorf("block of %d threads (at most %d)", t, MaxBlockThreads)
	}
	if smem < 0 || smem > MaxSharedMem {
		return fmt.Errorf("shared memory %d bytes (want 0..%d)", smem, MaxSharedMem)
	}
	return args.Err()
}
