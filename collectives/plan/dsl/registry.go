package dsl

import (
	"errors"
	"fmt"

	"github.com/goep-dev/goep/collectives/plan"
)

// Register compiles p and adds its plan to reg (MSCCL++'s register_plan).
// accept, when not nil, may decline calls the plan would take (a per-plan
// selector); reg.SetSelector chooses among several plans that take a call.
func Register(reg *plan.Registry, p *Program, accept func(plan.Query) bool, opts ...plan.EntryOption) (*plan.Entry, error) {
	if reg == nil {
		return nil, errors.New("dsl: register: nil registry")
	}
	pl, _, err := p.Compile()
	if err != nil {
		return nil, err
	}
	if accept != nil {
		opts = append(opts, plan.WithAccept(accept))
	}
	return reg.Add(pl, opts...), nil
}

// RegisterBuiltins compiles the named builtins (every one when names is
// empty) for o and registers them in that order. Nothing is registered
// when one fails.
func RegisterBuiltins(reg *plan.Registry, o Options, names ...string) ([]*plan.Entry, error) {
	if reg == nil {
		return nil, errors.New("dsl: register: nil registry")
	}
	if len(names) == 0 {
		for _, b := range builtins {
			names = append(names, b.Name)
		}
	}
	var plans []*plan.Plan
	for _, n := range names {
		p, err := Build(n, o)
		if err != nil {
			return nil, err
		}
		pl, _, err := p.Compile()
		if err != nil {
			return nil, fmt.Errorf("dsl: builtin %s: %w", n, err)
		}
		plans = append(plans, pl)
	}
	out := make([]*plan.Entry, len(plans))
	for i, pl := range plans {
		out[i] = reg.Add(pl)
	}
	return out, nil
}
