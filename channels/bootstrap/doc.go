// Package bootstrap connects the ranks of a job before any GPU memory is
// shared: TCP across processes (torchrun, mpirun, srun, ep-bench launch) or
// in-process for goroutine ranks, every wait bounded.
//
// Two implementations share one set of semantics:
//
//   - Connect: one process per rank, TCP. Rank 0 listens on Config.RootAddr,
//     every other rank registers there (retrying until the timeout, so the
//     root may start last), the root hands out the address table, and the
//     ranks build a full mesh with exactly one connection per pair.
//   - NewInProcess: goroutine ranks of one process, no sockets.
//
// Collectives are everyone-to-everyone over the mesh: each rank sends its
// contribution directly to every other rank under a reserved negative tag
// (user tags must be >= 0) and waits for all contributions. This costs
// O(size) messages per rank, which is fine for bootstrap-sized data, and it
// means a rank knows exactly which ranks it is still waiting for, so timeout
// errors can name them and the death of any rank is seen by every rank
// directly rather than through a chain of neighbours.
//
// Every wait is bounded by the caller's context and by Config.Timeout.
// Timeouts wrap ErrTimeout (see TimeoutError, which names the missing ranks);
// a peer that went away wraps ErrPeerClosed (see PeerClosedError, which names
// the rank); using a closed Bootstrap gives ErrClosed.
//
// Collectives must be called in the same order on every rank and not
// concurrently on one rank (they are serialised per rank). Send and Recv may
// be used from any number of goroutines; messages with the same (peer, tag)
// are delivered in the order they were sent. Incoming messages are queued
// without limit until received, so the protocol above must not let a rank
// send unboundedly many messages that are never received.
package bootstrap
