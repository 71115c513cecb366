package ep

import (
	"github.com/goep-dev/goep/internal/device"
)

// Device is one rank's accelerator: a GPU (CUDA backend) or the host
// backend, Go twins of every kernel on host memory with goroutine ranks.
type Device = device.Device

// Stream orders work on a Device. Engines wrap their own CUstream with
// WrapStream.
type Stream = device.Stream

// Kind names a backend: CUDA or Host.
type Kind = device.Kind

// Backends.
const (
	CUDA = device.CUDA
	Host = device.Host
)

// OpenDevice opens GPU ordinal (CUDA) or host-backend rank ordinal (Host).
// Close it after every Buffer on it.
func OpenDevice(kind Kind, ordinal int) (Device, error) { return device.Open(kind, ordinal) }

// ParseKind accepts "cuda", "host" and "auto" (CUDA when a GPU is usable).
func ParseKind(s string) (Kind, error) {
	k, _, err := device.ParseKind(s)
	return k, err
}

// GPUCount is the number of CUDA GPUs (an error says why there are none).
func GPUCount() (int, error) { return device.CUDADeviceCount() }

// WrapStream makes an engine's CUstream (a cudaStream_t) usable as a
// Stream; closing the Stream does not destroy the CUstream. On the host
// backend it returns the device's stream.
func WrapStream(dev Device, handle uintptr) (Stream, error) { return device.WrapStream(dev, handle) }
