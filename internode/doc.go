// Package internode is internode high-throughput EP: DeepEP V1's internode
// mode, where a token crosses the network once per destination node, to the
// rank with its source's local index, which forwards it over NVLink to the
// ranks of that node holding its experts; combine reduces inside each node,
// sends one partial per (token, node) back, and reduces at the source.
//
// Built so far: the topology (nodes of consecutive ranks, or virtual nodes
// of one host), the layout with per-node counts, and a plain-Go reference
// of dispatch and combine that spells out the route (forwarders' relay
// buffers, per-hop traffic: network and NVLink bytes apart, as DeepEP
// reports them). It is checked against the intranode reference: the route
// changes, the rows received do not. Notify, the count exchange, runs on
// the host backend as the Go twin of its planned kernel (notify.go: port
// channels with atomicAdd between nodes, direct memory inside a node), and
// so does dispatch's data path after it (dispatch.go: rows put once per
// destination node into the forwarder's relay region, then placed at their
// receivers), and so does combine's (combine.go: forwarders reduce their
// node's rows in ascending local rank and put one partial per token back,
// the source reduces the partials in ascending node, bit for bit the
// reference's). On a GPU (or in the CPU emulation of CUDA sources) the
// same three steps run as kernels of kernels/internode.cu (kernel.go) on
// the same memory with the same protocol, one block per rank and step,
// called with host slices (Run, Dispatch, Combine) or with device pointers
// on a stream (RunAsync, DispatchAsync, CombineAsync: devptr.go, what the
// Buffer's internode mode uses on CUDA); the twins stay the host backend's
// path and the protocol's reference.
package internode
