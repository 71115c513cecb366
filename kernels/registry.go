package kernels

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
)

// The registry is filled by the packages that launch the kernels: each
// registers its modules in init, naming the kernels with its own constants,
// so a kernel's name is written once on the Go side and this package stays a
// leaf. A program sees the modules of the packages it links; CheckRegistry
// tells one that must see all of them (ep-bench kernels, doctor) whether it
// does.
var (
	regMu    sync.RWMutex
	registry []Module
)

// Register adds m to the registry. Call it from init of the package that
// launches m's kernels. It panics on a programming error (no name, no
// kernels, a File that is not embedded, an inline Source, or a module name,
// file or kernel registered twice), which the first run of any test of that
// package finds, as a duplicate http.Handle does.
func Register(m Module) {
	if err := register(m); err != nil {
		panic(err)
	}
}

func register(m Module) error {
	switch {
	case m.Name == "" || len(m.Kernels) == 0:
		return fmt.Errorf("kernels: Register(%q, %q): a module needs a name and kernels", m.Name, m.File)
	case m.Source != "":
		return fmt.Errorf("kernels: Register(%q): registered modules compile their embedded file, not Source", m.Name)
	case !strings.HasSuffix(m.File, ".cu"):
		return fmt.Errorf("kernels: Register(%q): file %q is not a .cu file", m.Name, m.File)
	}
	if _, err := sourceFS.Open(m.File); err != nil {
		return fmt.Errorf("kernels: Register(%q): no embedded source %q", m.Name, m.File)
	}
	m.Options = slices.Clone(m.Options)
	m.Kernels = slices.Clone(m.Kernels)
	regMu.Lock()
	defer regMu.Unlock()
	for _, o := range registry {
		if o.Name == m.Name || o.File == m.File {
			return fmt.Errorf("kernels: Register(%q, %q): module %q already registers %s", m.Name, m.File, o.Name, o.File)
		}
		for _, k := range m.Kernels {
			if slices.Contains(o.Kernels, k) {
				return fmt.Errorf("kernels: Register(%q): kernel %s is already in module %q", m.Name, k, o.Name)
			}
		}
	}
	for i, k := range m.Kernels {
		if slices.Contains(m.Kernels[:i], k) {
			return fmt.Errorf("kernels: Register(%q): kernel %s listed twice", m.Name, k)
		}
	}
	registry = append(registry, m)
	return nil
}

// Modules returns every registered module (copies), sorted by name.
func Modules() []Module {
	regMu.RLock()
	out := make([]Module, len(registry))
	for i, m := range registry {
		m.Options = slices.Clone(m.Options)
		m.Kernels = slices.Clone(m.Kernels)
		out[i] = m
	}
	regMu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ModuleByName returns the registered module with this name (goep's own
// or a user source, RegisterSource).
func ModuleByName(name string) (Module, bool) {
	for _, m := range append(Modules(), SourceModules()...) {
		if m.Name == name {
			return m, true
		}
	}
	return Module{}, false
}

// ModuleForKernel returns the registered module that defines kernel (goep's
// own or a user source, RegisterSource).
func ModuleForKernel(kernel string) (Module, bool) {
	for _, m := range append(Modules(), SourceModules()...) {
		if slices.Contains(m.Kernels, kernel) {
			return m, true
		}
	}
	return Module{}, false
}

var globalRE = regexp.MustCompile(`(?m)^extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(`)

// definedKernels lists the extern "C" __global__ functions of an embedded
// file, sorted.
func definedKernels(file string) ([]string, error) {
	src, err := sourceFile(file)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, g := range globalRE.FindAllStringSubmatch(src, -1) {
		out = append(out, g[1])
	}
	sort.Strings(out)
	return out, nil
}

// CheckRegistry reports every embedded .cu file that no module registers
// (the program does not link the package that owns it) and every
// registered module whose Kernels differ from its file's extern "C"
// __global__ functions. Programs that must see every module (ep-bench
// kernels and doctor) call it; nil means the registry is complete.
func CheckRegistry() error {
	byFile := map[string]Module{}
	for _, m := range Modules() {
		byFile[m.File] = m
	}
	var errs []error
	for _, n := range sourceNames() {
		if !strings.HasSuffix(n, ".cu") {
			continue
		}
		m, ok := byFile[n]
		if !ok {
			errs = append(errs, fmt.Errorf("kernels: %s is registered by no linked package (import the package that launches its kernels)", n))
			continue
		}
		defined, err := definedKernels(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		want := slices.Clone(m.Kernels)
		sort.Strings(want)
		if !slices.Equal(defined, want) {
			errs = append(errs, fmt.Errorf("kernels: module %q registers kernels %v, %s defines %v", m.Name, want, n, defined))
		}
	}
	return errors.Join(errs...)
}
