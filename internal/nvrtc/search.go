package nvrtc

import (
	"github.com/goep-dev/goep/internal/dl"
)

// EnvLibrary names the environment variable that pins the NVRTC library to
// one file. When it is set and that file cannot be used, Load fails rather
// than falling back to a search.
const EnvLibrary = "GOEP_NVRTC"

// sonames are tried through the dynamic loader's default search path
// (LD_LIBRARY_PATH, the ld.so cache, /lib, /usr/lib), newest first.
// libnvrtc.so.11.2 is the soname of every NVRTC 11.x release from 11.2 on.
var sonames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}

// searchSpec is NVRTC's search (see the package comment): a toolkit
// library, so CUDA_HOME's copy comes before the loader's. The wheel
// directories are nvidia-cuda-nvrtc-cu12 (and cu11), and nvidia-cuda-nvrtc
// for CUDA 13.
var searchSpec = dl.Spec{
	EnvVar:    EnvLibrary,
	File:      "libnvrtc.so*",
	Sonames:   sonames,
	WheelDirs: []string{"nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"},
}

// searchEnv is what the search reads from the system, replaceable in tests.
type searchEnv struct {
	dl.Env
	sonames []string
}

func osSearchEnv() searchEnv { return searchEnv{Env: dl.OSEnv(), sonames: sonames} }

// searchPlaces lists, in order, where Load looks when GOEP_NVRTC is unset.
func searchPlaces(env searchEnv) []dl.Place {
	spec := searchSpec
	spec.Sonames = env.sonames
	return spec.Places(env.Env)
}

// NotFoundError is returned by Load when no usable NVRTC library was found;
// its Tried holds one line per place looked at or candidate rejected.
type NotFoundError = dl.NotFoundError

func notFound(tried []string) *NotFoundError {
	return &NotFoundError{
		What:  "nvrtc: cannot load libnvrtc (the CUDA runtime compiler)",
		Tried: tried,
		Fix: "install the CUDA toolkit (and set CUDA_HOME if it is not in /usr/local/cuda), " +
			"or `pip install nvidia-cuda-nvrtc-cu12`, or set " + EnvLibrary + "=/path/to/libnvrtc.so.12",
	}
}
