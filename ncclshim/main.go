// Command ncclshim is libgoep_nccl.so (`make nccl-shim`): the NCCL C API on
// goep, for LD_PRELOAD under programs written for NCCL (PyTorch's
// backend="nccl"). Each call goes to a registered execution plan, else
// goep's native algorithm, else the real NCCL ($GOEP_NCCL); see
// ncclshim/core and the README's section on the shim.

package main

func main() {}
