// Package twins registers the Go twin of every kernel in package kernels
// with the host backend (internal/device). Import it for its side effect in
// any program that may run on the host backend.
//
// A twin computes what its kernel computes, sequentially, from the same
// packed arguments; it is the reference GPU results are checked against.
package twins
