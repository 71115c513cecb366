// Package lowlatency is the low-latency (decode) EP protocol inside one
// node: dispatch into an expert-major receive layout of fixed shape
// [local experts][ranks x max tokens][hidden] (or rank-major), combine back
// with the routing weights, two alternating buffer sets, every call split
// into a send and a receive phase, no host synchronisation, and a mask of
// active ranks. DESIGN.md has the protocol; ReferenceDispatch and
// ReferenceCombine the semantics; the kernels are kernels/lowlatency.cu.
//
// It is the EP layer's low-latency mode: buffer.LowLatency runs it and
// ep.LowLatencyBuffer is its API (ep.NewBuffer's normal mode is package
// intranode).
//
// Ranks sharing a GPU: a kernel that waits behind its own rank's spinning
// kernel (the second micro-batch's receive behind the first's) blocks
// whatever another rank queued after it in a shared hardware queue, so a
// peer's send that the spinning kernel needs must be queued first. Goroutine
// ranks on one GPU issue each step (send, receive, or the fused call) on
// every rank before any rank issues the next; one process per GPU needs
// nothing of the kind.
//
// Across nodes (Config.Nodes > 1, Connect): ranks of a node store into
// each other's workspaces; rows and counts for ranks on other nodes go into
// this rank's send regions and over port channels, one put per region and
// destination a call, then a port-channel atomic add on the receiver's
// arrival counter, which the proxy applies after the puts landed.
package lowlatency
