// Package gpu runs resolved execution plans on GPUs: it builds the channels,
// semaphores and tables a plan needs and launches kernels/plan_exec.cu.
package gpu
