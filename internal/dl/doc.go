// Package dl opens shared libraries at run time (dlopen, dlsym) and searches
// for them in one agreed order: an override variable, CUDA_HOME, /usr/local/cuda,
// the loader's path, pip's nvidia-* wheels.
package dl
