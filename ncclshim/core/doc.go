// Package core is the NCCL API implemented on goep, behind the C exports of
// libgoep_nccl.so: each call goes to a registered plan, a native algorithm or
// the real NCCL, with NCCL's result codes.
package core
