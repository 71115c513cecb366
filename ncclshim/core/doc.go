// Package core is the NCCL API implemented on goep, behind the C exports of
// libgoep_nccl.so (package ncclshim): communicators over goep's bootstrap,
// each call sent to a registered plan, a native algorithm, or the real NCCL,
// with NCCL's result codes.
package core
