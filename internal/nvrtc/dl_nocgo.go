//go:build !cgo

package nvrtc

const haveCgo = false

// Open always fails without cgo.
func Open(path string) (*Library, error) { return nil, errNoCgo }

// Compile always fails without cgo.
func (l *Library) Compile(p Program) (Output, error) { return Output{}, errNoCgo }
