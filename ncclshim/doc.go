// Command ncclshim is built as libgoep_nccl.so (make nccl-shim): the NCCL C API
// for LD_PRELOAD, so NCCL programs such as PyTorch run goep's algorithms.
package main
