// Package channeltest is test support for channels: goroutine-rank worlds and
// the checks and benchmarks that tests and ep-bench channels share.
package channeltest
