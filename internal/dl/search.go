package dl

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Spec describes one library's search.
type Spec struct {
	// EnvVar names the variable that pins the library to one file; when it
	// is set, Search tries that file only.
	EnvVar string
	// File is the file name (or glob, "libnvrtc.so*") looked for in each
	// directory.
	File string
	// Sonames are asked of the dynamic loader (LD_LIBRARY_PATH, the ld.so
	// cache, /lib, /usr/lib), in order.
	Sonames []string
	// SonamesFirst tries the sonames before the CUDA directories (a library
	// the system installs, like NCCL); otherwise they come after (a toolkit
	// library, like NVRTC, whose CUDA_HOME copy should win).
	SonamesFirst bool
	// WheelDirs are library directories inside site-packages of the pip
	// wheels that ship the library ("nvidia/nccl/lib").
	WheelDirs []string
}

// Env is what the search reads from the system, replaceable in tests.
type Env struct {
	Getenv func(string) string
	Glob   func(string) ([]string, error)
	Home   func() (string, error)
}

// OSEnv reads the real environment and file system.
func OSEnv() Env { return Env{Getenv: os.Getenv, Glob: filepath.Glob, Home: os.UserHomeDir} }

// filled is e with the functions it leaves nil taken from OSEnv, so a zero
// Env reads the real system instead of calling a nil function.
func (e Env) filled() Env {
	os := OSEnv()
	if e.Getenv == nil {
		e.Getenv = os.Getenv
	}
	if e.Glob == nil {
		e.Glob = os.Glob
	}
	if e.Home == nil {
		e.Home = os.Home
	}
	return e
}

// PythonBases are globbed for python3.X directories that may hold pip
// wheels. A leading "~" is the home directory and "$VIRTUAL_ENV" the active
// virtual environment.
var PythonBases = []string{
	"$VIRTUAL_ENV/lib/python3*",
	"/usr/lib/python3*",
	"/usr/local/lib/python3*",
	"~/.local/lib/python3*",
	"/opt/*/.venv/lib/python3*",
	"/opt/*/lib/python3*",
}

// Place is one location of the search: a description and the candidates it
// produced (file paths, or one soname for the dynamic loader).
type Place struct {
	Where  string
	Skip   string // why the place produced nothing without being looked at
	Paths  []string
	Soname bool
}

// Places lists, in order, where Search looks when the override is unset.
func (s Spec) Places(env Env) []Place {
	env = env.filled()
	var places []place
	seen := map[string]bool{}
	addGlob := func(where string, patterns ...string) {
		p := place{Where: where}
		var found []string
		for _, pat := range patterns {
			m, _ := env.Glob(pat)
			found = append(found, m...)
		}
		SortLibraries(found)
		for _, f := range found {
			if !seen[f] {
				seen[f] = true
				p.Paths = append(p.Paths, f)
			}
		}
		places = append(places, p)
	}
	sonames := func() {
		for _, so := range s.Sonames {
			places = append(places, place{Where: so + " (dynamic loader search path)", Paths: []string{so}, Soname: true})
		}
	}

	if s.SonamesFirst {
		sonames()
	}
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		dir := env.Getenv(v)
		where := "$" + v + "/lib64/" + s.File
		if dir == "" {
			places = append(places, place{Where: where, Skip: "$" + v + " is not set"})
			continue
		}
		addGlob(where+" ("+filepath.Join(dir, "lib64")+")", filepath.Join(dir, "lib64", s.File))
	}
	addGlob("/usr/local/cuda/lib64/"+s.File, filepath.Join("/usr/local/cuda/lib64", s.File))
	if !s.SonamesFirst {
		sonames()
	}
	if len(s.WheelDirs) == 0 {
		return places
	}
	home, herr := env.Home()
	for _, base := range PythonBases {
		where := base + "/{site,dist}-packages/{" + strings.Join(s.WheelDirs, ",") + "}/" + s.File
		switch {
		case strings.HasPrefix(base, "$VIRTUAL_ENV"):
			venv := env.Getenv("VIRTUAL_ENV")
			if venv == "" {
				places = append(places, place{Where: where, Skip: "$VIRTUAL_ENV is not set"})
				continue
			}
			base = venv + strings.TrimPrefix(base, "$VIRTUAL_ENV")
		case strings.HasPrefix(base, "~"):
			if herr != nil || home == "" {
				places = append(places, place{Where: where, Skip: "no home directory"})
				continue
			}
			base = home + strings.TrimPrefix(base, "~")
		}
		var pats []string
		for _, pkgs := range []string{"site-packages", "dist-packages"} {
			for _, wd := range s.WheelDirs {
				pats = append(pats, filepath.Join(base, pkgs, wd, s.File))
			}
		}
		addGlob(where, pats...)
	}
	return places
}

type place = Place

// Candidates flattens Places into the paths tried, in order.
func (s Spec) Candidates(env Env) []string {
	var out []string
	for _, p := range s.Places(env) {
		out = append(out, p.Paths...)
	}
	return out
}

// OverrideError is a library pinned by Spec.EnvVar that cannot be used.
type OverrideError struct {
	Var, Path string
	Err       error
}

func (e *OverrideError) Error() string {
	if e == nil {
		return "dl: nil *OverrideError"
	}
	return fmt.Sprintf("%s=%s cannot be used: %v", e.Var, e.Path, e.Err)
}

func (e *OverrideError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// NotFoundError is a search that found no usable library.
type NotFoundError struct {
	// What the caller looked for, as the first line says it
	// ("nvrtc: cannot load libnvrtc (the CUDA runtime compiler)").
	What string
	// Tried holds one line per place looked at or candidate rejected.
	Tried []string
	// Fix says how to make the library found.
	Fix string
}

func (e *NotFoundError) Error() string {
	if e == nil {
		return "dl: nil *NotFoundError"
	}
	var b strings.Builder
	b.WriteString(e.What)
	b.WriteString("; looked at:\n")
	for _, t := range e.Tried {
		fmt.Fprintf(&b, "  %s\n", t)
	}
	if e.Fix != "" {
		b.WriteString("to fix: " + e.Fix)
	}
	return strings.TrimRight(b.String(), "\n")
}

// Search tries the library pinned by s.EnvVar, or else every candidate of
// s.Places in order, and returns the first that open accepts. open gets a
// path or a soname; its error should say why the file is not the library
// ("dlopen: <dlerror>" as Open says it, or a missing symbol). The error of
// a failed search is an *OverrideError or a *NotFoundError (What empty: the
// caller fills it in) whose Tried names every path and why it failed.
func Search[T any](s Spec, env Env, open func(path string) (T, error)) (T, error) {
	var zero T
	env = env.filled()
	if s.EnvVar != "" {
		if p := strings.TrimSpace(env.Getenv(s.EnvVar)); p != "" {
			v, err := open(p)
			if err != nil {
				return zero, &OverrideError{Var: s.EnvVar, Path: p, Err: err}
			}
			return v, nil
		}
	}
	var tried []string
	for _, pl := range s.Places(env) {
		switch {
		case pl.Skip != "":
			tried = append(tried, pl.Where+": "+pl.Skip)
		case len(pl.Paths) == 0:
			tried = append(tried, pl.Where+": no match")
		}
		for _, p := range pl.Paths {
			v, err := open(p)
			if err == nil {
				return v, nil
			}
			label, msg := p, err.Error()
			if pl.Soname {
				label = pl.Where
			}
			// dlerror() already names the file: "dlopen: <p>: <reason>".
			msg = strings.TrimPrefix(msg, "dlopen: "+p+": ")
			tried = append(tried, label+": "+msg)
		}
	}
	return zero, &NotFoundError{Tried: tried}
}

// SortLibraries orders matches of a library glob: the unversioned name
// first (a developer symlink to the installed version), then by version,
// newest first; ties (one file in several python3.X directories) go by path,
// descending.
func SortLibraries(paths []string) {
	sort.SliceStable(paths, func(i, j int) bool {
		vi, vj := SoVersion(paths[i]), SoVersion(paths[j])
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
		return paths[i] > paths[j]
	})
}

// SoVersion parses the numbers after ".so." in a library file name
// ("libnvrtc.so.12.4.127" -> [12 4 127]); a part that is not a number is 0.
func SoVersion(path string) []int {
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
