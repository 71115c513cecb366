// Package kernels holds goep's CUDA C++ sources, embedded, with the NVRTC
// compiler, the disk cache and the module registry that owners fill.
package kernels
