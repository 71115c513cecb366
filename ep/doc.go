// Package ep is the user-facing expert-parallel API for Go inference engines:
// dispatch and combine of MoE tokens across the GPUs of a node (intranode,
// over NVLink) and across nodes (internode, RDMA plus NVLink forwarding).
// Tensors are device pointers with a shape and a dtype; streams and events
// belong to the engine. (Being built: see the project issues.)
package ep
