// Package devapi is the Go side of the channels' device ABI: the layouts that
// kernels read (watchdog, semaphores, memory and port channels, FIFO) and the
// host twins of their device functions.
//
// Layouts are defined once, as the offset constants in layout.go; Encode
// and Decode use nothing else, and a test checks the constants against the
// static_asserts of channel_abi.cuh and compiles them, with NVRTC, into
// static_asserts of their own.
//
// The host implementation keeps the device API's contract with Go's memory
// model: tokens, flags and packets are read and written with sync/atomic, so
// plain data copied before an atomic signal is visible after the matching
// atomic wait, as release/acquire promise on the GPU. Waits are bounded by
// the same watchdog struct the GPU uses (timeout, abort flag, record), timed
// with the wall clock.
package devapi
