// Package apicheck is test support: it calls every exported method of a
// value with zero arguments, to prove that nil receivers and closed objects
// answer with an error or a zero value instead of a panic (the library's
// rule: no panic across the API).
package apicheck

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
	"time"
)

// Failure is one method that panicked or did not return.
type Failure struct {
	Method string
	Panic  any
	Stack  string
}

func (f Failure) String() string {
	if f.Panic == nil {
		return f.Method + ": did not return within the bound"
	}
	return fmt.Sprintf("%s: panic: %v\n%s", f.Method, f.Panic, f.Stack)
}

// Options adjust Call.
type Options struct {
	// Skip lists method names not to call (e.g. ones documented to block).
	Skip []string
	// Bound is how long one call may take (default 10s); a call that takes
	// longer is reported and left running.
	Bound time.Duration
}

// Call calls every exported method of v (a pointer, possibly nil, or a
// value) with zero arguments (a context argument gets an already-cancelled
// context, so nothing waits) and returns the methods that panicked or hung.
// On a nil pointer, methods with value receivers are not called: Go itself
// panics dereferencing the pointer before the method runs, so no library
// code can answer there (value types are checked by passing a zero value).
func Call(v any, opt Options) []Failure {
	if opt.Bound <= 0 {
		opt.Bound = 10 * time.Second
	}
	skip := map[string]bool{}
	for _, s := range opt.Skip {
		skip[s] = true
	}
	rv := reflect.ValueOf(v)
	rt := rv.Type()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ctxType := reflect.TypeOf((*context.Context)(nil)).Elem()
	valueMethods := map[string]bool{}
	if rt.Kind() == reflect.Pointer && rv.IsNil() {
		for i := 0; i < rt.Elem().NumMethod(); i++ {
			valueMethods[rt.Elem().Method(i).Name] = true
		}
	}
	var fails []Failure
	for i := 0; i < rt.NumMethod(); i++ {
		m := rt.Method(i)
		if skip[m.Name] || valueMethods[m.Name] {
			continue
		}
		name := fmt.Sprintf("(%s).%s", rt, m.Name)
		ft := m.Type
		args := []reflect.Value{rv}
		for a := 1; a < ft.NumIn(); a++ {
			t := ft.In(a)
			if ft.IsVariadic() && a == ft.NumIn()-1 {
				break
			}
			if t == ctxType {
				args = append(args, reflect.ValueOf(ctx))
			} else {
				args = append(args, reflect.Zero(t))
			}
		}
		done := make(chan *Failure, 1)
		go func() {
			defer func() {
				if r := recover(); r != nil {
					done <- &Failure{Method: name, Panic: r, Stack: string(debug.Stack())}
				}
			}()
			m.Func.Call(args)
			done <- nil
		}()
		select {
		case f := <-done:
			if f != nil {
				fails = append(fails, *f)
			}
		case <-time.After(opt.Bound):
			fails = append(fails, Failure{Method: name})
		}
	}
	return fails
}

// Declared lists the exported types declared in the Go package in dir (its
// non-test files) that have at least one exported method: the types whose
// methods the no-panic rule covers.
func Declared(dir string) ([]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("apicheck: %w", err)
	}
	seen := map[string]bool{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 || !fd.Name.IsExported() {
					continue
				}
				if name := recvName(fd.Recv.List[0].Type); ast.IsExported(name) {
					seen[name] = true
				}
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// recvName is the type name of a receiver expression (T, *T, T[P], *T[P]).
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// Uncovered returns the types Declared in dir that no value of covered
// names (a pointer's element type counts): the guard that keeps a
// package's no-panic test complete when a new exported type appears.
func Uncovered(dir string, covered ...any) ([]string, error) {
	names, err := Declared(dir)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, v := range covered {
		t := reflect.TypeOf(v)
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t != nil {
			name, _, _ := strings.Cut(t.Name(), "[") // an instantiated generic
			have[name] = true
		}
	}
	var missing []string
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// Cover is a package's whole no-panic test over its API table: it fails
// t for every type Declared in dir (the package under test: ".") that
// vals does not cover, and for every method of every value in vals (nil
// pointers for types with pointer methods, zero values for value types)
// that panics or hangs when called with zero arguments.
func Cover(t testing.TB, dir string, vals []any, opt Options) {
	t.Helper()
	missing, err := Uncovered(dir, vals...)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range missing {
		t.Errorf("exported type %s has exported methods but is not in this package's apicheck table: "+
			"add a nil pointer (or zero value) of it, and a closed live one where it owns resources", n)
	}
	for _, v := range vals {
		for _, f := range Call(v, opt) {
			t.Error(f)
		}
	}
}
