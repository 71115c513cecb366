// Package nccltest gives tests outside collectives/ the host-memory NCCL
// stand-in (collectives/internal/fakenccl): ranks are threads of one
// process, buffers host memory.

package nccltest

import "github.com/goep-dev/goep/collectives/internal/fakenccl"

// BuildFake compiles the stand-in into dir (gcc) and returns its path, a
// libnccl.so.2 to point GOEP_NCCL at.
func BuildFake(dir string) (string, error) { return fakenccl.Build(dir) }
