package cpuemu

import (
	"fmt"
	"maps"
	"strings"
	"sync"
)

// User sources: CUDA programs that are not goep's (user kernels, package
// userkernel), built like goep's modules (translated with every header,
// compiled by g++) so that Launch runs their kernels by name. They stay
// loaded for the life of the process, as goep's modules do.
var (
	userMu    sync.Mutex
	userFiles = map[string]string{} // file -> source
	userIndex = map[string]string{} // kernel -> file
)

// userFileOf returns the user source that defines kernel.
func userFileOf(kernel string) (string, bool) {
	userMu.Lock()
	defer userMu.Unlock()
	f, ok := userIndex[kernel]
	return f, ok
}

// withUserSources adds the user sources to goep's.
func withUserSources(src map[string]string) map[string]string {
	userMu.Lock()
	defer userMu.Unlock()
	if len(userFiles) == 0 {
		return src
	}
	out := maps.Clone(src)
	maps.Copy(out, userFiles)
	return out
}

// LoadSource builds a CUDA source that is not one of goep's, with goep's
// headers available to #include, so that Launch runs its kernels; it
// returns the kernels the source defines (`extern "C" __global__ void
// name(` on one line). file names the source in diagnostics and must be
// unique per content: loading the same file and source again is a no-op,
// another source under the same file or a kernel name that goep or another
// source already defines is refused. A source g++ cannot build fails here
// with g++'s output, not at the first launch.
func (d *Device) LoadSource(file, src string) ([]string, error) {
	if d == nil {
		return nil, fmt.Errorf("cpuemu: LoadSource on a nil device")
	}
	if !strings.HasSuffix(file, ".cu") || strings.ContainsAny(file, `/\`) {
		return nil, fmt.Errorf("cpuemu: LoadSource: %q is not a .cu name without path separators", file)
	}
	if _, goeps := sources()[file]; goeps {
		return nil, fmt.Errorf("cpuemu: LoadSource: %s is the name of one of goep's sources", file)
	}
	var ks []string
	for _, m := range kernelRE.FindAllStringSubmatch(src, -1) {
		ks = append(ks, m[1])
	}
	if len(ks) == 0 {
		return nil, fmt.Errorf("cpuemu: LoadSource: %s defines no kernel written `extern \"C\" __global__ void name(` on one line", file)
	}
	for _, k := range ks {
		if f, err := fileOf(k); err == nil && f != file {
			return nil, fmt.Errorf("cpuemu: LoadSource: kernel %s of %s is already defined by %s", k, file, f)
		}
	}
	userMu.Lock()
	if old, ok := userFiles[file]; ok && old != src {
		userMu.Unlock()
		return nil, fmt.Errorf("cpuemu: LoadSource: another source is loaded as %s", file)
	}
	userFiles[file] = src
	for _, k := range ks {
		userIndex[k] = file
	}
	userMu.Unlock()
	if _, err := moduleFor(ks[0]); err != nil {
		// Nothing was built: forget the source, so a fixed one can take
		// the name.
		userMu.Lock()
		delete(userFiles, file)
		for _, k := range ks {
			delete(userIndex, k)
		}
		userMu.Unlock()
		return nil, err
	}
	return ks, nil
}
