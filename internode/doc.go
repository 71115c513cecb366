// Package internode runs dispatch and combine across nodes: RDMA between
// GPUs of the same local index, NVLink forwarding inside each node. (Being built.)
package internode
