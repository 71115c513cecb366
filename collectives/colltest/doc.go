// Package colltest is test support for collectives: goroutine-rank worlds
// and buffers with guards, shared by tests and ep-bench collectives.
package colltest
