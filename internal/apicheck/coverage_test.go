package apicheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testSupport are packages that only tests use (harnesses, fakes): their
// types are not API. The list matches internal/layers' test support.
var testSupport = map[string]bool{
	"internal/cpuemu": true, "channels/channeltest": true, "collectives/colltest": true,
	"collectives/plan/plantest": true, "intranode/intranodetest": true, "collectives/internal/fakenccl": true,
	"collectives/nccl/nccltest": true,
}

// Every package of the module that declares an exported type with
// exported methods has a test calling Cover over its API table, so a new
// package cannot add API outside the no-panic rule (issue 18 class 1); a
// new type inside a covered package is caught by that package's Cover.
func TestEveryPackageCovered(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if testSupport[rel] {
			return nil
		}
		types, err := Declared(path)
		if err != nil || len(types) == 0 {
			return nil // no Go package here, or nothing to cover
		}
		checked++
		tests, _ := filepath.Glob(filepath.Join(path, "*_test.go"))
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err == nil && strings.Contains(string(b), "apicheck.Cover(") {
				return nil
			}
		}
		if rel == "internal/apicheck" {
			return nil // this package: its own types are the checker's
		}
		t.Errorf("package %s declares exported types with methods (%v) but no test calls apicheck.Cover over them",
			rel, types)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Errorf("only %d packages with exported methods found under %s: the walk is broken", checked, root)
	}
}
