// Package collectives is goep's collective layer: allreduce, allgather and
// reduce-scatter on channels, a selector with tuning tables, work handles,
// execution plans first and NCCL as fallback.
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
