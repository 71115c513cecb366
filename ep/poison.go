package ep

import (
	"os"
)

// PoisonEnv names the environment variable of the debug mode for borrowed
// outputs: when it is set (to anything but "" or "0") when a Buffer is
// built, every view a call returns is overwritten when it expires, in
// stream order, just before the call that ends it launches: dispatch views
// by the next Dispatch, the default combine output by the next Combine,
// Layout's outputs by the next Layout. Float views (rows, scales, weights)
// become NaN (0xff bytes), integer views (ids, source tokens, layout
// counts) 0x80 bytes (large negative values, 0x80 in is_token_in_rank). A
// test that reads a view after it expired then fails loudly instead of
// reading stale data that happens to look right. It costs a memset of the
// expired views per call: for tests, not production.
const PoisonEnv = "GOEP_EP_POISON"

// Poison bytes.
const (
	poisonFloat = 0xff
	poisonInt   = 0x80
)

func poisonViews() bool {
	v := os.Getenv(PoisonEnv)
	return v != "" && v != "0"
}

// poisonView is memory a returned view covered.
type poisonView struct {
	ptr  uintptr
	n    int
	fill byte
}

// viewsToPoison lists the views of a result to poison when it expires
// (nothing outside the debug mode): floats with NaN, integers with 0x80.
func (b *Buffer) viewsToPoison(ts ...Tensor) []poisonView {
	if !b.poison {
		return nil
	}
	var out []poisonView
	for _, t := range ts {
		if t.Ptr == 0 || t.Bytes() == 0 {
			continue
		}
		fill := byte(poisonInt)
		switch t.DType {
		case BF16, FP8E4M3, F32:
			fill = poisonFloat
		}
		out = append(out, poisonView{t.Ptr, t.Bytes(), fill})
	}
	return out
}

// poisonExpired overwrites the views in *vs on s (they expire now) and
// forgets them.
func (b *Buffer) poisonExpired(s Stream, vs *[]poisonView) error {
	dev := b.b.Device()
	for _, v := range *vs {
		if err := dev.MemsetAsync(v.ptr, v.fill, v.n, s); err != nil {
			return err
		}
	}
	*vs = nil
	return nil
}
