// Package collectives provides allreduce, allgather and reduce-scatter over
// NVLink without multicast, an algorithm selector, asynchronous work handles,
// and an executor for MSCCL++ execution-plan JSON files. (Being built.)
package collectives
