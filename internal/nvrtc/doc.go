// Package nvrtc loads NVRTC at run time and compiles CUDA C++ to CUBIN for
// the GPU at hand.
//
// Nothing links against NVRTC at build time and no CUDA header is needed:
// the few types and entry points used here are declared in this package and
// resolved with dlsym, so a binary builds on machines without CUDA and finds
// the library (any of NVRTC 11.2+, 12, 13) when it runs. Load searches, in
// order:
//
//  1. $GOEP_NVRTC, a file path; when set, nothing else is tried;
//  2. $CUDA_HOME/lib64/libnvrtc.so* and $CUDA_PATH/lib64/libnvrtc.so*;
//  3. /usr/local/cuda/lib64/libnvrtc.so*;
//  4. the sonames libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so.11.2 and
//     libnvrtc.so through the dynamic loader's default search path;
//  5. pip wheels (nvidia-cuda-nvrtc-cu12 / -cu13): nvidia/cuda_nvrtc/lib and
//     nvidia/cu13/lib under the site-packages or dist-packages directories of
//     $VIRTUAL_ENV, /usr/lib/python3*, /usr/local/lib/python3*,
//     ~/.local/lib/python3*, /opt/*/.venv/lib/python3* and /opt/*/lib/python3*.
//
// Within one directory the plain libnvrtc.so comes first, then versioned
// names, newest first. The first candidate that opens and exports every
// required symbol wins; when none does, the error lists every place looked at
// and why each was rejected.
//
// Without cgo the package still builds; Load then reports that NVRTC cannot
// be used.
package nvrtc
