package dtype

import (
	"fmt"
	"strings"
)

// DType is an element type.
type DType uint8

// The element types. Do not renumber: the values are kernel dtype codes.
const (
	None    DType = 0
	BF16    DType = 1 // bfloat16
	FP8E4M3 DType = 2 // float8 e4m3fn
	FP32    DType = 3 // float32
	I32     DType = 4 // int32
	I64     DType = 5 // int64
	U8      DType = 6 // uint8 (also torch.bool storage, 0 or 1)
	FP16    DType = 7 // IEEE half
)

// All lists every type, in a fixed order.
var All = []DType{BF16, FP16, FP32, FP8E4M3, I32, I64, U8}

// Size is the size of one element in bytes, 0 for None and unknown values.
func (d DType) Size() int {
	switch d {
	case BF16, FP16:
		return 2
	case FP8E4M3, U8:
		return 1
	case FP32, I32:
		return 4
	case I64:
		return 8
	}
	return 0
}

// Valid reports whether d is a known type (not None).
func (d DType) Valid() bool { return d.Size() != 0 }

// Float reports whether d is a floating-point type.
func (d DType) Float() bool {
	switch d {
	case BF16, FP16, FP32, FP8E4M3:
		return true
	}
	return false
}

func (d DType) String() string {
	if n, ok := names[d]; ok {
		return n[0]
	}
	if d == None {
		return "none"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// names holds each type's canonical name first, then accepted spellings
// (torch's and numpy's among them).
var names = map[DType][]string{
	BF16:    {"bf16", "bfloat16"},
	FP16:    {"fp16", "f16", "half", "float16"},
	FP32:    {"fp32", "f32", "float", "float32"},
	FP8E4M3: {"fp8_e4m3", "fp8", "e4m3", "float8_e4m3fn"},
	I32:     {"int32", "i32"},
	I64:     {"int64", "i64"},
	U8:      {"uint8", "u8", "bool"},
}

// Parse accepts a type's name or a common spelling, case-insensitively.
// Packages that run only some types check the result against their own list
// (see Parse's callers), so the error here names every type.
func Parse(s string) (DType, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, d := range All {
		for _, n := range names[d] {
			if t == n {
				return d, nil
			}
		}
	}
	return None, fmt.Errorf("unknown data type %q (want one of %s)", clip(s), List(All))
}

// ParseOf is Parse restricted to the types in allowed; the error lists them.
func ParseOf(s string, allowed []DType) (DType, error) {
	d, err := Parse(s)
	if err == nil && !In(d, allowed) {
		err = fmt.Errorf("data type %s is not supported here", d)
	}
	if err != nil {
		return None, fmt.Errorf("%w (want %s)", stripWant(err), List(allowed))
	}
	return d, nil
}

// In reports whether d is one of ds.
func In(d DType, ds []DType) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// List writes ds as "a, b or c".
func List(ds []DType) string {
	var b strings.Builder
	for i, d := range ds {
		switch {
		case i == 0:
		case i == len(ds)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(d.String())
	}
	return b.String()
}

// stripWant drops Parse's own "(want ...)" so ParseOf can give the narrower list.
type wantless struct{ msg string }

func (w wantless) Error() string { return w.msg }

func stripWant(err error) error {
	m := err.Error()
	if i := strings.LastIndex(m, " (want "); i >= 0 {
		m = m[:i]
	}
	return wantless{m}
}

// clip bounds echoed input: an error must not carry a caller's megabytes.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + fmt.Sprintf("...(%d bytes)", len(s))
}
