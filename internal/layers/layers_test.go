// Package layers holds the test that keeps goep's import graph as
// docs/ARCHITECTURE.md draws it: lower layers never import higher ones,
// product code never imports test support, and a few named rules.
package layers

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/goep-dev/goep/"

// layerOf places every package (path relative to the module). A package
// may import packages of its own layer or lower ones. Patterns ending in
// "/..." cover a folder and everything under it; the longest match wins.
var layerTable = []struct {
	layer   int
	pattern string
}{
	// 0: loaders and plain utilities, no goep imports above them.
	{0, "internal/..."},
	{0, "dtype"},
	// 1: the CUDA C++ sources, embedded, and their compiler and cache.
	{1, "kernels/..."},
	// 2: the seam between host Go and the two backends; the CPU emulation
	// of the kernels is a third backend, for tests.
	{2, "internal/device"},
	{2, "internal/cpuemu"},
	// 3: bootstrap, connections, registered memory, semaphores, channels.
	{3, "channels/..."},
	// 4: what runs on channels: routing/layout, the EP protocols, the
	// collectives and the plan executor.
	{4, "routing/..."},
	{4, "intranode/..."},
	{4, "internode/..."},
	{4, "lowlatency/..."},
	{4, "collectives/..."},
	{4, "userkernel/..."},
	// 5: the EP Buffer (owns the mode), 6: the public EP API.
	{5, "buffer/..."},
	{6, "ep/..."},
	// 7: programs on top: the CLI and the NCCL-API library.
	{7, "bench/..."},
	{7, "ncclshim/..."},
	{7, "examples/..."},
}

// testSupport are packages only tests (and bench) may import.
var testSupport = []string{"internal/cpuemu", "internal/apicheck", "internal/ranktest", "channels/channeltest", "collectives/colltest", "collectives/plan/plantest",
	"intranode/intranodetest", "collectives/internal/fakenccl", "collectives/nccl/nccltest"}

// mayImportTestSupport are product packages allowed to use test support:
// the CLI checks and benchmarks with the same harnesses the tests use.
var mayImportTestSupport = []string{"bench/..."}

// forbidden are named rules beyond the layer order: from -> to patterns.
var forbidden = []struct{ from, to, why string }{
	{"kernels/...", "*", "kernels/ is a leaf: it imports nothing of goep outside internal/"},
	{"collectives/...", "routing/...", "collectives know nothing of EP"},
	{"collectives/...", "intranode/...", "collectives know nothing of EP"},
	{"ep/...", "intranode/...", "ep imports no protocol package: the Buffer picks the mode"},
	{"ep/...", "internode/...", "ep imports no protocol package: the Buffer picks the mode"},
	{"ep/...", "lowlatency/...", "ep imports no protocol package: the Buffer picks the mode"},
}

// restricted are packages that only the listed product packages may
// import (tests may import them freely): internal/kernelflags holds the
// benchmarks' measurement switches (fingerprint compiled out), which the
// kernel compilers apply and only test and benchmark harnesses set; no
// product package may read or set them.
var restricted = map[string][]string{
	"internal/kernelflags": {"kernels", "internal/cpuemu", "bench/..."},
}

func match(pattern, pkg string) bool {
	if pattern == "*" {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

func layerOf(pkg string) (int, bool) {
	best, layer := -1, 0
	for _, e := range layerTable {
		if match(e.pattern, pkg) && len(e.pattern) > best {
			best, layer = len(e.pattern), e.layer
		}
	}
	return layer, best >= 0
}

func inList(list []string, pkg string) bool {
	for _, p := range list {
		if match(p, pkg) {
			return true
		}
	}
	return false
}

// violations checks an import graph (package -> non-test imports, module-
// relative paths of goep packages only) against the rules.
func violations(graph map[string][]string) []string {
	var out []string
	for pkg, imports := range graph {
		from, ok := layerOf(pkg)
		if !ok {
			out = append(out, fmt.Sprintf("%s: not in the layer table (internal/layers): place it in a layer", pkg))
			continue
		}
		for _, imp := range imports {
			to, ok := layerOf(imp)
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s imports %s, which is not in the layer table", pkg, imp))
			case to > from:
				out = append(out, fmt.Sprintf("%s (layer %d) imports %s (layer %d): an upward import", pkg, from, imp, to))
			}
			if allowed, ok := restricted[imp]; ok && !inList(allowed, pkg) {
				out = append(out, fmt.Sprintf("%s imports %s, which only %v may import (the benchmarks' measurement switches)", pkg, imp, allowed))
			}
			if inList(testSupport, imp) && !inList(testSupport, pkg) && !inList(mayImportTestSupport, pkg) {
				out = append(out, fmt.Sprintf("%s imports the test-support package %s", pkg, imp))
			}
			for _, f := range forbidden {
				if !match(f.from, pkg) || !match(f.to, imp) {
					continue
				}
				// kernels/ may import internal/ and itself.
				if f.to == "*" && (match("internal/...", imp) || match(f.from, imp)) {
					continue
				}
				out = append(out, fmt.Sprintf("%s imports %s: %s", pkg, imp, f.why))
			}
		}
	}
	sort.Strings(out)
	return out
}

// goList returns every goep package's non-test goep imports.
func goList(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...")
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("go list: %v (the go tool is needed for this test)", err)
	}
	graph := map[string][]string{}
	dec := json.NewDecoder(outPipe)
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkg, ok := strings.CutPrefix(p.ImportPath, module)
		if !ok {
			continue
		}
		var imps []string
		for _, imp := range p.Imports {
			if r, ok := strings.CutPrefix(imp, module); ok {
				imps = append(imps, r)
			}
		}
		graph[pkg] = imps
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	return graph
}

func TestImportsFollowTheLayers(t *testing.T) {
	graph := goList(t)
	if len(graph) < 10 {
		t.Fatalf("go list found %d packages; expected the whole module", len(graph))
	}
	for _, v := range violations(graph) {
		t.Error(v)
	}
}

// The checker itself fails on each kind of violation.
func TestViolationsAreFound(t *testing.T) {
	cases := map[string]map[string][]string{
		"an upward import":       {"channels": {"buffer"}, "buffer": nil},
		"not in the layer table": {"newthing": nil},
		"test-support package":   {"collectives": {"channels/channeltest"}, "channels/channeltest": nil},
		"kernels/ is a leaf":     {"kernels/twins": {"channels/devapi"}, "channels/devapi": nil},
		"know nothing of EP":     {"collectives/plan/gpu": {"intranode"}, "intranode": nil},
		"imports no protocol":    {"ep": {"intranode"}, "intranode": nil},
		"measurement switches":   {"intranode": {"internal/kernelflags"}, "internal/kernelflags": nil},
	}
	for want, g := range cases {
		v := violations(g)
		if len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), want) {
			t.Errorf("%s: got %q", want, v)
		}
	}
	if v := violations(map[string][]string{"ep": {"buffer", "routing"}, "buffer": {"intranode"}, "bench": {"channels/channeltest"}}); len(v) != 0 {
		t.Errorf("allowed graph refused: %q", v)
	}
}
