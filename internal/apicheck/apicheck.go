// Package apicheck is test support: it calls every exported method of a
// value with zero arguments, to prove that nil receivers and closed objects
// answer with an error or a zero value instead of a panic (the library's
// rule: no panic across the API).
package apicheck

import (
	"context"
	"fmt"
	"reflect"
	"runtime/debug"
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

// Call calls every exported method of v (a pointer, possibly nil) with
// zero arguments (a context argument gets an already-cancelled context, so
// nothing waits) and returns the methods that panicked or hung.
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
	var fails []Failure
	for i := 0; i < rt.NumMethod(); i++ {
		m := rt.Method(i)
		if skip[m.Name] {
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
