// Package lowlatency is the low-latency (decode) EP protocol inside one
// node: dispatch into an expert-major receive layout of fixed shape
// [local experts][ranks x max tokens][hidden] (or rank-major), combine back
// with the routing weights, two alternating buffer sets, every call split
// into a send and a receive phase, no host synchronisation, and a mask of
// active ranks. DESIGN.md has the protocol; ReferenceDispatch and
// ReferenceCombine the semantics; the kernels are kernels/lowlatency.cu.
//
// Across nodes (port channels) is not built yet: NewLayout refuses a
// group that spans nodes (Config.Nodes > 1).
package lowlatency
