//go:build !cgo

package dl

import (
	"errors"
	"unsafe"
)

const haveCgo = false

// ErrNoCgo is what Open returns in a build without cgo.
var ErrNoCgo = errors.New("dl: this binary was built without cgo (CGO_ENABLED=0), so shared libraries cannot be loaded; rebuild with CGO_ENABLED=1")

// Library is never made without cgo.
type Library struct{}

// Open always fails without cgo.
func Open(path string) (*Library, error) { return nil, ErrNoCgo }

// OpenLazy always fails without cgo.
func OpenLazy(path string) (*Library, error) { return nil, ErrNoCgo }

// Sym always fails without cgo.
func (l *Library) Sym(name string) (unsafe.Pointer, error) { return nil, ErrNoCgo }

// Path is empty without cgo.
func (l *Library) Path() string { return "" }

// Requested is empty without cgo.
func (l *Library) Requested() string { return "" }

// Close does nothing without cgo.
func (l *Library) Close() error { return nil }
