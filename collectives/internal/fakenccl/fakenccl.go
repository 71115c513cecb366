// Package fakenccl builds a stand-in for libnccl.so.2 that works on host
// memory with ranks as threads of one process (the host backend's goroutine
// ranks), so tests exercise goep's NCCL path without GPUs. It needs gcc,
// which cgo needs anyway.

package fakenccl

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

//go:embed fakenccl.c.in
var source []byte

// Build compiles the fake into dir and returns the library's path.
func Build(dir string) (string, error) {
	src := filepath.Join(dir, "fakenccl.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libnccl.so.2")
	out, err := exec.Command("gcc", "-O1", "-shared", "-fPIC", "-o", lib, src, "-lpthread").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("fakenccl: gcc: %v\n%s", err, out)
	}
	return lib, nil
}
