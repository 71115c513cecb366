package kernels

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// User sources are CUDA programs written by goep's users (package
// userkernel), not embedded here. They are registered at run time, beside
// goep's own modules, so that the device layer finds, compiles (with every
// embedded .cuh offered as a header, exactly as for goep's modules) and
// preloads their kernels by name as it does goep's. They are kept apart from
// Modules, which lists what goep ships (CheckRegistry, ep-bench kernels).
var userSources []Module // guarded by regMu

// SourceKernels lists the kernels a source defines: its extern "C"
// __global__ functions, written on one line as `extern "C" __global__ void
// name(` (the form the CPU emulation also looks for), in source order.
func SourceKernels(src string) []string {
	var out []string
	for _, g := range globalRE.FindAllStringSubmatch(src, -1) {
		out = append(out, g[1])
	}
	return out
}

// RegisterSource registers a module compiled from m.Source (m.File is the
// name NVRTC reports diagnostics against). Unlike Register it returns
// errors, since the source is a user's input: it needs a Name and a .cu File
// without path separators, neither of them goep's, a Source, and Kernels
// that the source defines. Registering an identical module (same name,
// source, options and kernels) again is a no-op. A kernel name another
// module already defines is refused: loaded kernels are cached by name for
// the life of the process, so one name must always mean one kernel.
// Registered sources stay registered until the process ends.
func RegisterSource(m Module) error {
	switch {
	case m.Name == "" || strings.ContainsAny(m.Name, `/\`):
		return fmt.Errorf("kernels: RegisterSource(%q): a source module needs a name without path separators", m.Name)
	case !strings.HasSuffix(m.File, ".cu") || strings.ContainsAny(m.File, `/\`):
		return fmt.Errorf("kernels: RegisterSource(%q): file %q is not a .cu name without path separators", m.Name, m.File)
	case strings.TrimSpace(m.Source) == "":
		return fmt.Errorf("kernels: RegisterSource(%q): empty source", m.Name)
	case len(m.Kernels) == 0:
		return fmt.Errorf("kernels: RegisterSource(%q): no kernels named", m.Name)
	}
	if _, err := sourceFS.Open(m.File); err == nil {
		return fmt.Errorf("kernels: RegisterSource(%q): %s is the name of one of goep's own sources; name yours otherwise", m.Name, m.File)
	}
	defined := SourceKernels(m.Source)
	for i, k := range m.Kernels {
		switch {
		case !slices.Contains(defined, k):
			return fmt.Errorf("kernels: RegisterSource(%q): %s defines no kernel %s (it defines %v; kernels are written `extern \"C\" __global__ void name(` on one line)",
				m.Name, m.File, k, defined)
		case slices.Contains(m.Kernels[:i], k):
			return fmt.Errorf("kernels: RegisterSource(%q): kernel %s listed twice", m.Name, k)
		}
	}
	m.Options = slices.Clone(m.Options)
	m.Kernels = slices.Clone(m.Kernels)
	regMu.Lock()
	defer regMu.Unlock()
	for _, o := range registry {
		if o.Name == m.Name {
			return fmt.Errorf("kernels: RegisterSource(%q): goep's module %q has that name", m.Name, o.Name)
		}
		for _, k := range m.Kernels {
			if slices.Contains(o.Kernels, k) {
				return fmt.Errorf("kernels: RegisterSource(%q): kernel %s is goep's (module %q); name yours otherwise", m.Name, k, o.Name)
			}
		}
	}
	for _, o := range userSources {
		if o.Name == m.Name {
			if o.File == m.File && o.Source == m.Source && slices.Equal(o.Options, m.Options) &&
				slices.Equal(o.Kernels, m.Kernels) && o.NeedsArchSpecific == m.NeedsArchSpecific && o.CacheOnDisk == m.CacheOnDisk {
				return nil
			}
			return fmt.Errorf("kernels: RegisterSource(%q): another source is registered under this name", m.Name)
		}
		for _, k := range m.Kernels {
			if slices.Contains(o.Kernels, k) {
				return fmt.Errorf("kernels: RegisterSource(%q): kernel %s is already defined by source module %q (%s); "+
					"one kernel name means one kernel for the life of the process, so give a changed kernel a new name",
					m.Name, k, o.Name, o.File)
			}
		}
	}
	userSources = append(userSources, m)
	return nil
}

// SourceModules returns every module registered with RegisterSource
// (copies), sorted by name.
func SourceModules() []Module {
	regMu.RLock()
	out := make([]Module, len(userSources))
	for i, m := range userSources {
		m.Options = slices.Clone(m.Options)
		m.Kernels = slices.Clone(m.Kernels)
		out[i] = m
	}
	regMu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Headers lists the headers every module, user sources included, may
// include by name (#include "channel_device.cuh"), sorted.
func Headers() []string {
	var out []string
	for _, n := range sourceNames() {
		if strings.HasSuffix(n, ".cuh") {
			out = append(out, n)
		}
	}
	return out
}
