package routing

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Index is the element type of topk_idx.
type Index interface{ ~int32 | ~int64 }

// Routing is a host-side topk_idx[T, K] with its shape. Idx is row-major and
// always int64 here; Encode produces the int32 or int64 bytes a device
// buffer takes.
type Routing struct {
	Shape
	Idx []int64 // len Tokens*K; -1 = no expert
}

// NewRouting checks idx against s (shape and every value) and wraps it.
func NewRouting[I Index](idx []I, s Shape) (*Routing, error) {
	if err := ValidateIndices(idx, s); err != nil {
		return nil, err
	}
	r := &Routing{Shape: s, Idx: make([]int64, len(idx))}
	for i, v := range idx {
		r.Idx[i] = int64(v)
	}
	return r, nil
}

// ValidateIndices checks that idx is a valid topk_idx of shape s: the shape
// itself, the length, and every entry in [-1, E). The error names the first
// bad token and slot.
func ValidateIndices[I Index](idx []I, s Shape) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if len(idx) != s.Entries() {
		return fmt.Errorf("routing %v: topk_idx has %d entries, want T*K = %d", s, len(idx), s.Entries())
	}
	for i, v := range idx {
		if int64(v) < -1 || int64(v) >= int64(s.Experts) {
			return fmt.Errorf("routing %v: topk_idx[%d][%d] = %d: expert ids must be in [0, %d) or -1",
				s, i/s.K, i%s.K, int64(v), s.Experts)
		}
	}
	return nil
}

// Validate checks the routing's shape and values.
func (r *Routing) Validate() error {
	if r == nil {
		return errNilRouting
	}
	return ValidateIndices(r.Idx, r.Shape)
}

// errNilRouting is what a nil *Routing answers.
var errNilRouting = errors.New("routing: nil Routing")

// CheckDistinct reports the first token that names one expert in two slots.
// The layout counts such a token twice for that expert (once per entry), as
// DeepEP does; dispatch paths that need distinct experts call this.
func (r *Routing) CheckDistinct() error {
	if r == nil {
		return errNilRouting
	}
	seen := make([]int, r.Experts) // token+1 that last used each expert
	for t := 0; t < r.Tokens; t++ {
		for j, e := range r.Row(t) {
			if e < 0 {
				continue
			}
			if seen[e] == t+1 {
				return fmt.Errorf("routing %v: token %d names expert %d twice (slot %d)", r.Shape, t, e, j)
			}
			seen[e] = t + 1
		}
	}
	return nil
}

// Row is token t's K expert ids (nil for a nil Routing or a token outside
// it).
func (r *Routing) Row(t int) []int64 {
	if r == nil || r.K <= 0 || t < 0 || t >= len(r.Idx)/r.K {
		return nil
	}
	return r.Idx[t*r.K : (t+1)*r.K]
}

// Int32 returns the ids as int32 (every valid id fits).
func (r *Routing) Int32() []int32 {
	if r == nil {
		return nil
	}
	out := make([]int32, len(r.Idx))
	for i, v := range r.Idx {
		out[i] = int32(v)
	}
	return out
}

// Encode returns topk_idx as little-endian bytes, 4 per entry when asInt32 is
// set, else 8: the content of a device buffer.
func (r *Routing) Encode(asInt32 bool) []byte {
	if r == nil {
		return nil
	}
	if asInt32 {
		b := make([]byte, 4*len(r.Idx))
		for i, v := range r.Idx {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		return b
	}
	b := make([]byte, 8*len(r.Idx))
	for i, v := range r.Idx {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}
