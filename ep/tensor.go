package ep

import (
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/goep-dev/goep/dtype"
)

// DType is the element type of a Tensor: goep's one element type
// (package dtype), shared with the collectives and the plan executor.
type DType = dtype.DType

// Element types. The zero value is "no dtype": a Tensor left zero is an
// absent optional argument.
const (
	BF16    = dtype.BF16    // bfloat16
	FP8E4M3 = dtype.FP8E4M3 // float8 e4m3fn (FP8 rows, with float32 scales)
	F32     = dtype.FP32
	I32     = dtype.I32
	I64     = dtype.I64
	U8      = dtype.U8 // bytes, and torch.bool storage (0 or 1)
)

// Tensor is an array in device memory: a pointer (a CUdeviceptr, or a
// host-backend address), a shape, a dtype and, optionally, strides. No
// framework is involved: engines pass what their tensors point to.
//
// Strides are in elements, one per dimension (torch's Tensor.stride()); nil
// means dense row-major. Only DispatchArgs.Scales accepts other strides
// (see there); every other argument must be row-major (nil Strides, or
// exactly the row-major ones). Results are always row-major, nil Strides.
//
// The zero Tensor is "absent" (optional arguments). A present tensor with
// no elements (a dimension 0) may have a null pointer.
type Tensor struct {
	Ptr     uintptr
	Shape   []int
	DType   DType
	Strides []int
}

// NewTensor is a row-major Tensor{ptr, shape, dtype}.
func NewTensor(ptr uintptr, dtype DType, shape ...int) Tensor {
	return Tensor{Ptr: ptr, Shape: shape, DType: dtype}
}

// WithStrides is t with strides (in elements, one per dimension).
func (t Tensor) WithStrides(strides ...int) Tensor {
	t.Strides = strides
	return t
}

// Present reports whether t was given (it is not the zero Tensor).
func (t Tensor) Present() bool {
	return t.Ptr != 0 || t.Shape != nil || t.DType != 0 || t.Strides != nil
}

// Numel is the number of elements (0 when a dimension is negative or the
// product overflows an int: such a tensor is refused by every call).
func (t Tensor) Numel() int {
	n, ok := t.numel()
	if !ok {
		return 0
	}
	return n
}

// numel is the element count, false on a negative dimension or overflow.
func (t Tensor) numel() (int, bool) {
	n := 1
	for _, d := range t.Shape {
		if d < 0 {
			return 0, false
		}
		var ok bool
		if n, ok = mulInt(n, d); !ok {
			return 0, false
		}
	}
	return n, true
}

// Bytes is the size of the elements in bytes (0 on overflow, as Numel).
// For a strided tensor the memory it spans may be larger (Span).
func (t Tensor) Bytes() int {
	n, ok := mulInt(t.Numel(), t.DType.Size())
	if !ok {
		return 0
	}
	return n
}

// RowMajor is the dense row-major strides of t's shape (nil on overflow).
func (t Tensor) RowMajor() []int {
	st := make([]int, len(t.Shape))
	n := 1
	for i := len(t.Shape) - 1; i >= 0; i-- {
		st[i] = n
		var ok bool
		if n, ok = mulInt(n, max(t.Shape[i], 1)); !ok {
			return nil
		}
	}
	return st
}

// Contiguous reports whether t is dense row-major: nil Strides, or the
// row-major ones (a dimension of size 1 may have any stride).
func (t Tensor) Contiguous() bool {
	if t.Strides == nil {
		return true
	}
	rm := t.RowMajor()
	if len(t.Strides) != len(t.Shape) || rm == nil {
		return false
	}
	for i, s := range t.Strides {
		if s != rm[i] && t.Shape[i] != 1 {
			return false
		}
	}
	return true
}

// Span is the bytes from Ptr to the end of t's last element, false when t
// has bad strides (count, or not positive) or the span overflows.
func (t Tensor) Span() (int, bool) {
	n, ok := t.numel()
	if !ok {
		return 0, false
	}
	if t.Strides == nil {
		return mulInt(n, t.DType.Size())
	}
	if len(t.Strides) != len(t.Shape) {
		return 0, false
	}
	if n == 0 {
		return 0, true
	}
	last := 0 // offset of the last element, in elements
	for i, st := range t.Strides {
		if st < 1 {
			return 0, false
		}
		o, ok := mulInt(t.Shape[i]-1, st)
		if !ok {
			return 0, false
		}
		if last, ok = addInt(last, o); !ok {
			return 0, false
		}
	}
	last, ok = addInt(last, 1)
	if !ok {
		return 0, false
	}
	return mulInt(last, t.DType.Size())
}

// Rows is Shape[0] (0 for a scalar).
func (t Tensor) Rows() int {
	if len(t.Shape) == 0 {
		return 0
	}
	return t.Shape[0]
}

// Slice returns rows [lo, hi) of t (same pointer arithmetic as t[lo:hi],
// strides kept). Rows out of range give a tensor of -1 rows, which every
// call refuses (no panic across the API; not the zero Tensor, which an
// optional argument would take as absent).
func (t Tensor) Slice(lo, hi int) Tensor {
	if len(t.Shape) == 0 || lo < 0 || hi < lo || hi > t.Shape[0] {
		shape := []int{-1}
		if len(t.Shape) > 1 {
			shape = append(shape, t.Shape[1:]...)
		}
		return Tensor{Ptr: t.Ptr, Shape: shape, DType: t.DType, Strides: t.Strides}
	}
	row := 0
	if len(t.Strides) == len(t.Shape) && t.Strides != nil {
		row = t.Strides[0] * t.DType.Size()
	} else {
		row = t.DType.Size()
		for _, d := range t.Shape[1:] {
			row *= d
		}
	}
	shape := append([]int{hi - lo}, t.Shape[1:]...)
	return Tensor{Ptr: t.Ptr + uintptr(lo*row), Shape: shape, DType: t.DType, Strides: t.Strides}
}

func (t Tensor) String() string {
	if !t.Present() {
		return "absent"
	}
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = fmt.Sprint(d)
	}
	s := fmt.Sprintf("%s[%s]@%#x", t.DType, strings.Join(dims, ","), t.Ptr)
	if t.Strides != nil {
		s += fmt.Sprintf(" strides %v", t.Strides)
	}
	return s
}

// mulInt and addInt are a*b and a+b for non-negative ints, false on
// overflow: every byte count of caller input goes through them.
func mulInt(a, b int) (int, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt {
		return 0, false
	}
	return int(lo), true
}

func addInt(a, b int) (int, bool) {
	if a < 0 || b < 0 || a > math.MaxInt-b {
		return 0, false
	}
	return a + b, true
}

// check describes what an argument must be. Dims of -1 accept any size;
// minRows, when >= 0, is a lower bound on dim 0 instead of an exact size.
type check struct {
	name    string
	dtypes  []DType
	dims    []int
	minRows bool
	align   uintptr
}

// validate checks t against c: dtype, rank, dims, row-major strides, size,
// pointer (non-null when there are elements) and alignment.
func (c check) validate(t Tensor) error { return c.validateStrided(t, false) }

// validateStrided is validate, accepting any positive strides when strided.
func (c check) validateStrided(t Tensor, strided bool) error {
	ok := false
	for _, d := range c.dtypes {
		ok = ok || t.DType == d
	}
	if !ok {
		names := make([]string, len(c.dtypes))
		for i, d := range c.dtypes {
			names[i] = d.String()
		}
		return fmt.Errorf("%s: dtype %s not supported (want %s)", c.name, t.DType, strings.Join(names, " or "))
	}
	if len(t.Shape) != len(c.dims) {
		return fmt.Errorf("%s: shape %v has %d dimensions, want %d (%s)", c.name, t.Shape, len(t.Shape), len(c.dims), c.describe())
	}
	for i, want := range c.dims {
		got := t.Shape[i]
		switch {
		case got < 0:
			return fmt.Errorf("%s: shape %v has a negative dimension", c.name, t.Shape)
		case i == 0 && c.minRows && got < want:
			return fmt.Errorf("%s: shape %v has %d rows, needs at least %d (%s)", c.name, t.Shape, got, want, c.describe())
		case want >= 0 && got != want && !(i == 0 && c.minRows):
			return fmt.Errorf("%s: shape %v, want %s", c.name, t.Shape, c.describe())
		}
	}
	span, ok := t.Span()
	switch {
	case t.Strides != nil && len(t.Strides) != len(t.Shape):
		return fmt.Errorf("%s: %d strides for shape %v", c.name, len(t.Strides), t.Shape)
	case !strided && !t.Contiguous():
		return fmt.Errorf("%s: strides %v: this argument must be row-major (strides %v or nil)", c.name, t.Strides, t.RowMajor())
	case !ok:
		return fmt.Errorf("%s: shape %v, strides %v: want positive strides and a size that fits in memory", c.name, t.Shape, t.Strides)
	case span > 0 && uint64(t.Ptr) > math.MaxUint64-uint64(span):
		return fmt.Errorf("%s: %d bytes at %#x wrap the address space", c.name, span, t.Ptr)
	}
	if t.Numel() > 0 && t.Ptr == 0 {
		return fmt.Errorf("%s: null pointer for %d elements", c.name, t.Numel())
	}
	if c.align > 1 && t.Ptr%c.align != 0 {
		return fmt.Errorf("%s: pointer %#x is not %d-byte aligned", c.name, t.Ptr, c.align)
	}
	return nil
}

func (c check) describe() string {
	dims := make([]string, len(c.dims))
	for i, d := range c.dims {
		switch {
		case d < 0:
			dims[i] = "*"
		case i == 0 && c.minRows:
			dims[i] = fmt.Sprintf(">=%d", d)
		default:
			dims[i] = fmt.Sprint(d)
		}
	}
	return "[" + strings.Join(dims, ", ") + "]"
}
