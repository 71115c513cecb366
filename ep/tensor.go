package ep

import (
	"fmt"
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

// Tensor is a dense row-major array in device memory: a pointer (a
// CUdeviceptr, or a host-backend address), a shape and a dtype. No
// framework is involved: engines pass what their tensors point to.
//
// The zero Tensor is "absent" (optional arguments). A present tensor with
// no elements (a dimension 0) may have a null pointer.
type Tensor struct {
	Ptr   uintptr
	Shape []int
	DType DType
}

// NewTensor is Tensor{ptr, shape, dtype}.
func NewTensor(ptr uintptr, dtype DType, shape ...int) Tensor {
	return Tensor{Ptr: ptr, Shape: shape, DType: dtype}
}

// Present reports whether t was given (it is not the zero Tensor).
func (t Tensor) Present() bool { return t.Ptr != 0 || t.Shape != nil || t.DType != 0 }

// Numel is the number of elements.
func (t Tensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes is the size of the data in bytes.
func (t Tensor) Bytes() int { return t.Numel() * t.DType.Size() }

// Rows is Shape[0] (0 for a scalar).
func (t Tensor) Rows() int {
	if len(t.Shape) == 0 {
		return 0
	}
	return t.Shape[0]
}

// Slice returns rows [lo, hi) of t (same pointer arithmetic as t[lo:hi]).
func (t Tensor) Slice(lo, hi int) Tensor {
	if len(t.Shape) == 0 || lo < 0 || hi < lo || hi > t.Shape[0] {
		panic(fmt.Sprintf("ep: rows [%d, %d) of a tensor of shape %v", lo, hi, t.Shape))
	}
	row := t.DType.Size()
	for _, d := range t.Shape[1:] {
		row *= d
	}
	shape := append([]int{hi - lo}, t.Shape[1:]...)
	return Tensor{Ptr: t.Ptr + uintptr(lo*row), Shape: shape, DType: t.DType}
}

func (t Tensor) String() string {
	if !t.Present() {
		return "absent"
	}
	dims := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s[%s]@%#x", t.DType, strings.Join(dims, ","), t.Ptr)
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

// validate checks t against c: dtype, rank, dims, pointer (non-null when
// there are elements) and alignment.
func (c check) validate(t Tensor) error {
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
