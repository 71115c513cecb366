// Package dsl writes execution plans in Go: programs of chunks, channels and
// operations, checked for races and compiled to the MSCCL++ plan format.
//
// Ops also carry what the GPU interpreter needs and a program should not
// have to say: block barriers (nop) between ops of a block that depend on
// each other, one-per-type channel lists, remote-buffer tables, chunk
// counts and scratch size.
//
// Files: program.go (the program and its operations), check.go (argument
// checks at record time), deps.go (the happens-before check), compile.go
// (replication, fusion, barriers, JSON), builtin.go (the classic
// algorithms), registry.go (registration and selection).
//
// # Semantics the check relies on
//
// Ops of one threadblock run in order. A signal on a channel happens
// before the wait it pairs with: the k-th signal on the channel from A to
// B (the t-th channel of its type created from A to B) pairs with the k-th
// wait on the t-th channel from B to A. Relaxed signals count the same way
// but order no data (they are for handshakes: "I have started"). A port
// channel's puts are carried out by a proxy in order, per threadblock and
// channel: they finish before a later signal on that channel arrives and
// before a later flush on it returns, and no earlier; ppkt's port form
// copies packet bytes without waiting for them (rppkt waits). A barrier orders everything
// before it in every listed threadblock before everything after it. The
// k-th acquire of a semaphore (in the order the program records them) pairs
// with release k minus the initial value. LL packets order themselves: a
// packet read of scratch happens after the packet write of the same scratch
// chunk, which must exist and be the only one. Pipelines are checked as one
// pass over their body. Hazards between launches are not checked: programs
// that write into a peer's buffers start with a handshake, as the builtins
// do.
package dsl
