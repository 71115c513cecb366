package kernels

import "strings"

// Sources returns every embedded .cu and .cuh file, keyed by file name, for
// tools that build the kernels with another compiler (internal/cpuemu
// compiles them with g++ for the CPU emulation at test time, so nothing
// derived from them is committed and nothing can go stale).
func Sources() map[string]string {
	out := map[string]string{}
	for _, n := range sourceNames() {
		if strings.HasSuffix(n, ".cu") || strings.HasSuffix(n, ".cuh") {
			s, err := sourceFile(n)
			if err == nil {
				out[n] = s
			}
		}
	}
	return out
}
