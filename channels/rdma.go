package channels

import "errors"

// The network-transport contract, which TCP (conn_tcp.go) meets today and
// IB verbs is designed to meet. A network transport serves the Connection
// interface between ranks of different nodes, for port channels and
// host-to-device semaphores (memory channels need mapped memory and stay
// within a node):
//
//   - Registration keys. Every registered allocation gets a key at
//     registration (netKeyLocked) that travels in its serialised form; a
//     peer on another node opens it unmapped (Ptr 0) and names it by key
//     and offset. TCP's key is an index into the owner's table, checked by
//     the receiver against the allocation's bounds. Verbs would register
//     the allocation with the NIC (ibv_reg_mr, or ibv_reg_dmabuf_mr for GPU
//     memory) at the same point and carry the memory region's rkey and
//     address in the same trailer; the receiving NIC checks the bounds.
//   - Ordering. Operations of one connection land in issue order: TCP
//     numbers them and the receiver applies them in sequence on one
//     stream. Verbs would post RDMA writes, then a token update as an RDMA
//     write with immediate (or a fetch-add of the delta) and atomic adds as
//     IBV_WR_ATOMIC_FETCH_AND_ADD, on one reliable-connected queue pair,
//     whose in-order delivery (with a fence on the atomic) gives the same
//     guarantee; with NICs whose atomics are unreliable, a receiver thread
//     would turn write-with-immediate into device atomics as TCP does.
//   - Completion. Flush returns once everything issued has landed: TCP
//     waits for the receiver's acknowledgement of a numbered flush; verbs
//     would post the last work request signalled and poll the completion
//     queue. Both are bounded by Timeouts.Wait and name the peer on error.
//   - Discovery. TCP advertises interface addresses (or ListenHost); verbs
//     would pick the NIC nearest each GPU (PCI distance, as rdmamap reports
//     devices and their netdevs) and exchange queue-pair numbers, GIDs and
//     LIDs over the bootstrap as TCP exchanges its setup message.
//
// libibverbs would be loaded at run time (dlopen, like libcuda), so builds
// need no verbs headers. Until it is built and tested on a fabric, asking
// for it is refused with errVerbsNotBuilt.

// errVerbsNotBuilt is the refusal of the IB verbs transport.
var errVerbsNotBuilt = errors.New("network transport ib (InfiniBand/RoCE verbs) is not built in this version of goep: " +
	"use tcp (NetworkConfig.Transport = TransportEthernet, or $" + NetTransportEnv + "=tcp)")

// ErrTransportNotBuilt is what errors.Is finds in the refusal of a
// transport this build lacks (IB verbs).
var ErrTransportNotBuilt = errVerbsNotBuilt
