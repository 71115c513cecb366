// Package dl opens shared libraries at run time (dlopen, dlsym, dlerror in
// one small C layer) and searches for them the way goep's loaders agree on:
// an environment variable naming one file, then CUDA_HOME/CUDA_PATH,
// /usr/local/cuda, the dynamic loader's path, and pip's nvidia-* wheels.
package dl
