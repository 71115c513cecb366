// Package channels is goep's channel layer: communicator, connections,
// registered memory, semaphores, memory channels and port channels (FIFO and
// CPU proxy), with every device-side wait bounded.
//
//   - Registered memory. RegisterMemory makes an allocation reachable by
//     peers; RegisteredMemory serialises to a handle (a CUDA IPC handle
//     across processes, peer access between goroutine ranks, an address on
//     the host backend) that SendMemory / RecvMemory / ExchangeMemory carry
//     and OpenMemory maps, once per allocation, until Close.
//     RegisterHostMemory registers pinned host memory mapped into the GPU
//     as a source of this rank's own puts (never sent to peers): TCP sends
//     a write from it without staging.
//   - Connections (Connect, ConnectAll): one interface (Write,
//     UpdateAndSync, AtomicAdd, Flush) over transports: CUDA IPC (GPUs of
//     one host, copy engines; updates are stream writes, atomic adds a
//     one-thread kernel) and host memory (goroutine ranks of the host
//     backend) within a node; TCP between nodes (conn_tcp.go: several
//     sockets per connection, operations applied in order by the
//     receiver, GPU data staged through pinned host buffers, atomic adds
//     as device atomics on the target GPU). IB verbs is designed for
//     (rdma.go) and refused until built. Between virtual nodes of one host
//     the network transport may instead be the port over CUDA IPC
//     (NetworkConfig.Transport = TransportCudaIPC, $GOEP_NET_TRANSPORT=ipc):
//     cross-node connections of the intra-host kind (copy engines; host
//     memory on the host backend) that still admit only port channels and
//     host semaphores.
//   - Topology: a node is a host (host backend: a process), or one of
//     NetworkConfig.VirtualNodes groups of consecutive ranks
//     ($GOEP_VIRTUAL_NODES), whose cross-node traffic then goes over the
//     network transport (TCP, or the port over CUDA IPC) and never through
//     memory channels. Memory of a peer on another node opens unmapped
//     (Ptr 0) and is reached by its registration key (over the port over
//     CUDA IPC: mapped, for the proxy's copies).
//   - Semaphores: MemorySemaphore (device to device: signal is a release
//     add on the peer's inbound token over mapped memory, wait spins with
//     acquire loads on a monotonic expected counter kept in device memory)
//     and HostSemaphore (the host signals the peer's device through the
//     connection; the device waits or polls).
//   - Memory channels: a semaphore plus the memory it moves data between
//     (the peer's and this rank's buffers, and LL packet buffers with their
//     flag counters). Kernels use them through kernels/channel_device.cuh:
//     put/get of byte ranges by any group of threads, signal/wait/poll, and
//     LL16/LL8 packets whose flags the kernels advance themselves, so CUDA
//     graphs replay without any host action. NewMemoryChannelMesh builds one
//     per peer; UploadMemoryChannels puts their handles in device memory.
//   - Port channels: a Proxy (NewProxy) owns a FIFO of 16-byte triggers in
//     pinned host memory and a goroutine on a locked OS thread that drains
//     it in order; kernels push put, signal, flush, atomic-add and store
//     triggers through kernels/port_device.cuh and the proxy carries them
//     out on the channel's connection with the copy engines, leaving the
//     SMs free (a store is the connection's UpdateAndSync: a stream write
//     where an atomic add over CUDA IPC is a kernel launch). Its flow
//     control keeps at most MaxPending operations in flight on a
//     connection: on a CUDA IPC stream it waits at the bound for a mark
//     recorded half a bound earlier (never emptying the queue) and forgets
//     the count of a stream that went idle; other connections are flushed
//     at the bound, except TCP, whose sockets bound its queues.
//     Memory is registered with the proxy (AddMemory) so triggers carry
//     small ids; NewPortChannel / NewPortChannelMesh build channels over
//     host-to-device semaphores, UploadPortChannels uploads their handles.
//
// Pairing. Every setup exchange is tagged: the k-th A->B exchange with a
// tag pairs with the k-th B->A one. The communicator's bootstrap traffic
// uses tags at or above 1<<40, clear of the application's. Functions that
// talk to several peers (ConnectAll, NewMemorySemaphores, ExchangeMemory,
// NewMemoryChannelMesh) send to all before receiving from any, so ranks may
// list their peers in any order.
//
// Bounded waits. Every device-side spin (kernels/channel_wait.cuh, FIFO
// back-pressure and flush waits included) reads the
// GPU global timer and gives up after Timeouts.Wait (default 60 s,
// $GOEP_CHANNEL_TIMEOUT). The first thread to give up records which
// channel, peer and stage in host-mapped memory and raises an abort flag
// that makes every other bounded spin of the communicator give up too;
// Check turns the record into a *TimeoutError, and from then on (or after
// Abort) the communicator and everything built from it refuse calls until
// Close. Kernels with waits of their own use Watchdog and NewWaitID with
// goep_wait_ge_u64 and friends.
//
// The device ABI (struct layouts shared with the kernels, and a Go version
// of the device API that the host backend's kernel twins use) is in
// channels/devapi; channels/channeltest holds the correctness checks and
// benchmarks that the tests and `ep-bench channels` run.
package channels
