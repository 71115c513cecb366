package nvrtc

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// EnvLibrary names the environment variable that pins the NVRTC library to
// one file. When it is set and that file cannot be used, Load fails rather
// than falling back to a search.
const EnvLibrary = "GOEP_NVRTC"

// sonames are tried through the dynamic loader's default search path
// (LD_LIBRARY_PATH, the ld.so cache, /lib, /usr/lib), newest first.
// libnvrtc.so.11.2 is the soname of every NVRTC 11.x release from 11.2 on.
var sonames = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}

// pythonBases are globbed for python3.X directories that may hold pip wheels.
// A leading "~" is the home directory and "$VIRTUAL_ENV" the active venv.
var pythonBases = []string{
	"$VIRTUAL_ENV/lib/python3*",
	"/usr/lib/python3*",
	"/usr/local/lib/python3*",
	"~/.local/lib/python3*",
	"/opt/*/.venv/lib/python3*",
	"/opt/*/lib/python3*",
}

// wheelDirs are the library directories inside site-packages of the NVRTC
// wheels: nvidia-cuda-nvrtc-cu12 (and cu11) and nvidia-cuda-nvrtc for CUDA 13.
var wheelDirs = []string{"nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"}

// searchEnv is what the search reads from the system, replaceable in tests.
type searchEnv struct {
	getenv  func(string) string
	glob    func(string) ([]string, error)
	home    func() (string, error)
	sonames []string
}

func osSearchEnv() searchEnv {
	return searchEnv{getenv: os.Getenv, glob: filepath.Glob, home: os.UserHomeDir, sonames: sonames}
}

// place is one location of the search: a human-readable description and the
// candidates it produced (file paths, or sonames for the dynamic loader).
type place struct {
	where  string
	skip   string // why the place produced nothing without being looked at
	paths  []string
	soname bool // paths holds one soname for the dynamic loader
}

// searchPlaces lists, in order, where Load looks when GOEP_NVRTC is unset.
func searchPlaces(env searchEnv) []place {
	var places []place
	seen := map[string]bool{}
	addGlob := func(where string, patterns ...string) {
		p := place{where: where}
		var found []string
		for _, pat := range patterns {
			m, _ := env.glob(pat)
			found = append(found, m...)
		}
		sortLibraries(found)
		for _, f := range found {
			if !seen[f] {
				seen[f] = true
				p.paths = append(p.paths, f)
			}
		}
		places = append(places, p)
	}

	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		dir := env.getenv(v)
		where := "$" + v + "/lib64/libnvrtc.so*"
		if dir == "" {
			places = append(places, place{where: where, skip: "$" + v + " is not set"})
			continue
		}
		addGlob(where+" ("+filepath.Join(dir, "lib64")+")", filepath.Join(dir, "lib64", "libnvrtc.so*"))
	}
	addGlob("/usr/local/cuda/lib64/libnvrtc.so*", "/usr/local/cuda/lib64/libnvrtc.so*")
	for _, s := range env.sonames {
		places = append(places, place{where: s + " (dynamic loader search path)", paths: []string{s}, soname: true})
	}

	home, herr := env.home()
	for _, base := range pythonBases {
		where := base + "/{site,dist}-packages/{" + strings.Join(wheelDirs, ",") + "}/libnvrtc.so*"
		switch {
		case strings.HasPrefix(base, "$VIRTUAL_ENV"):
			venv := env.getenv("VIRTUAL_ENV")
			if venv == "" {
				places = append(places, place{where: where, skip: "$VIRTUAL_ENV is not set"})
				continue
			}
			base = venv + strings.TrimPrefix(base, "$VIRTUAL_ENV")
		case strings.HasPrefix(base, "~"):
			if herr != nil || home == "" {
				places = append(places, place{where: where, skip: "no home directory"})
				continue
			}
			base = home + strings.TrimPrefix(base, "~")
		}
		var pats []string
		for _, pkgs := range []string{"site-packages", "dist-packages"} {
			for _, wd := range wheelDirs {
				pats = append(pats, filepath.Join(base, pkgs, wd, "libnvrtc.so*"))
			}
		}
		addGlob(where, pats...)
	}
	return places
}

// sortLibraries orders matches of libnvrtc.so*: the unversioned name first
// (a developer symlink to the installed version), then by version, newest
// first; ties keep path order.
func sortLibraries(paths []string) {
	sort.SliceStable(paths, func(i, j int) bool {
		vi, vj := soVersion(paths[i]), soVersion(paths[j])
		if (len(vi) == 0) != (len(vj) == 0) {
			return len(vi) == 0
		}
		for k := 0; k < len(vi) && k < len(vj); k++ {
			if vi[k] != vj[k] {
				return vi[k] > vj[k]
			}
		}
		if len(vi) != len(vj) {
			return len(vi) > len(vj)
		}
		return paths[i] < paths[j]
	})
}

// soVersion parses the numbers after ".so." in a library file name
// ("libnvrtc.so.12.4.127" -> [12 4 127]); a part that is not a number is 0.
func soVersion(path string) []int {
	base := filepath.Base(path)
	i := strings.Index(base, ".so.")
	if i < 0 {
		return nil
	}
	var v []int
	for _, part := range strings.Split(base[i+4:], ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			n = 0
		}
		v = append(v, n)
	}
	return v
}

// NotFoundError is returned by Load when no usable NVRTC library was found.
type NotFoundError struct {
	// Tried holds one line per place looked at or candidate rejected.
	Tried []string
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	b.WriteString("nvrtc: cannot load libnvrtc (the CUDA runtime compiler); looked at:\n")
	for _, t := range e.Tried {
		fmt.Fprintf(&b, "  %s\n", t)
	}
	b.WriteString("to fix: install the CUDA toolkit (and set CUDA_HOME if it is not in /usr/local/cuda), " +
		"or `pip install nvidia-cuda-nvrtc-cu12`, or set " + EnvLibrary + "=/path/to/libnvrtc.so.12")
	return b.String()
}
