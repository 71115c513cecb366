// Package collectives provides allreduce, allgather and reduce-scatter
// among the GPUs of one host over NVLink, without NVLink multicast, for Go
// engines: a Communicator built from a bootstrap (the launchers' conventions,
// channels/bootstrap) on top of channels.Communicator; asynchronous Work
// handles (Wait makes a stream wait on the GPU, Done polls, Err reports a
// timeout that names the rank that never arrived, or an NCCL failure);
// native algorithms for every message size (LL packets, scratch buffers,
// zero-copy on registered buffers; see the Algo* constants), all capturable
// in CUDA graphs; a selector driven by a tuning table measured on the
// machine (`ep-bench collectives --tune`); and NCCL loaded at run time
// (collectives/nccl) as one more algorithm: the fallback for what the
// native ones do not cover and the reference `ep-bench collectives
// --compare nccl` measures against.
//
// Types: bf16, fp16 and fp32 for every collective, fp8 e4m3 for allgather;
// reductions sum, min and max (prod and avg through NCCL). Results of the
// native algorithms are bit-exact with the plain-Go reference in
// collectives/ref (rank-order float32 accumulation, one rounding), so every
// rank of an allreduce holds the same bits.
//
// On the host backend (no GPU) the same code runs with the kernels' Go
// twins (twins.go), which this package registers with its kernel modules.
package collectives
