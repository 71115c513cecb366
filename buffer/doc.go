// Package buffer owns the memory an EP Buffer is made of: the IPC-shared
// NVLink workspace of every rank, RDMA buffers, peer pointer tables on the
// GPU, barrier signals and host-mapped receive counters. (Being built.)
package buffer
