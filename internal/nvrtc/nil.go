package nvrtc

import "errors"

// errNil is what the methods of a nil pointer of this package's types
// return (typ names the type), instead of a panic: the library's rule is no
// panic across the API, internal layers included.
func errNil(typ string) error { return errors.New("nvrtc: nil *" + typ) }
