package plan

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Query describes a call a registered plan might run.
type Query struct {
	Collective   string // allreduce, allgather, reducescatter, alltoall, sendrecv
	World        int
	RanksPerNode int
	InPlace      bool
	Bytes        uint64   // input (send) bytes per rank, as Plan.SizesFor takes them
	Op           ReduceOp // the call's reduction (ignored for allgather-like plans)
}

// Entry is a registered plan with its selection rules.
type Entry struct {
	Plan *Plan
	// Priority: among matching plans the highest wins, then the earliest
	// registered.
	Priority int
	// RanksPerNode restricts the plan to worlds with that many ranks per
	// node (0: any).
	RanksPerNode int
	// Accept, when set, may decline a matching call (return false).
	Accept func(Query) bool

	order int
}

// EntryOption adjusts an entry at registration.
type EntryOption func(*Entry)

// WithPriority sets the entry's priority (default 0; higher wins).
func WithPriority(p int) EntryOption { return func(e *Entry) { e.Priority = p } }

// WithRanksPerNode restricts the entry to that many ranks per node.
func WithRanksPerNode(n int) EntryOption { return func(e *Entry) { e.RanksPerNode = n } }

// WithAccept installs a selector hook that may decline calls.
func WithAccept(f func(Query) bool) EntryOption { return func(e *Entry) { e.Accept = f } }

// Registry holds plans and picks one for a call. It is safe for concurrent
// use; every rank must register the same plans in the same order.
type Registry struct {
	mu       sync.Mutex
	entries  []*Entry
	next     int
	selector Selector
}

// Selector picks the plan for a call among the entries that take it,
// ordered best first (higher priority, then earlier registration); nil
// means no plan (the caller falls back to its native algorithms). It is
// MSCCL++'s set_selector.
type Selector func(q Query, candidates []*Entry) *Entry

// SetSelector installs f (nil restores the default: the first candidate).
func (r *Registry) SetSelector(f Selector) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.selector = f
}

// Add registers a validated plan.
func (r *Registry) Add(p *Plan, opts ...EntryOption) *Entry {
	if r == nil {
		var r0 *Entry
		return r0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := &Entry{Plan: p, order: r.next}
	r.next++
	for _, o := range opts {
		o(e)
	}
	r.entries = append(r.entries, e)
	return e
}

// AddFile loads and registers one plan file.
func (r *Registry) AddFile(path string, opts ...EntryOption) (*Entry, error) {
	if r == nil {
		var r0 *Entry
		return r0, ErrNil
	}
	p, err := Load(path)
	if err != nil {
		return nil, err
	}
	return r.Add(p, opts...), nil
}

// AddDir registers every *.json plan of dir, in file name order. It loads
// them all before registering any, and reports every bad file.
func (r *Registry) AddDir(dir string, opts ...EntryOption) ([]*Entry, error) {
	if r == nil {
		var r0 []*Entry
		return r0, ErrNil
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("plan directory: %w", err)
		}
	}
	sort.Strings(names)
	var plans []*Plan
	var errs []error
	for _, n := range names {
		p, err := Load(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		plans = append(plans, p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out := make([]*Entry, len(plans))
	for i, p := range plans {
		out[i] = r.Add(p, opts...)
	}
	return out, nil
}

// Entries lists the registered plans in registration order.
func (r *Registry) Entries() []*Entry {
	if r == nil {
		var r0 []*Entry
		return r0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Entry(nil), r.entries...)
}

// Select returns the plan for q, nil when none matches: same collective,
// world size, ranks per node and in-place mode, a size the plan cuts and
// admits ([min, max]), the call's reduction, and no decline by the entry's
// Accept. Ties go to the higher priority, then the earlier registration.
func (r *Registry) Select(q Query) *Entry {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	entries := append([]*Entry(nil), r.entries...)
	sel := r.selector
	r.mu.Unlock()
	var cands []*Entry
	for _, e := range entries {
		if e.matches(q) {
			cands = append(cands, e)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		return a.Priority > b.Priority || a.Priority == b.Priority && a.order < b.order
	})
	if sel == nil {
		if len(cands) == 0 {
			return nil
		}
		return cands[0]
	}
	// The selector's answer counts only if it is one of the candidates: a
	// plan that does not take the call must never run it.
	got := sel(q, append([]*Entry(nil), cands...))
	for _, e := range cands {
		if e == got {
			return e
		}
	}
	return nil
}

// Why says why e does not take q ("" when it does).
func (e *Entry) Why(q Query) string {
	if e == nil {
		return "no entry (nil)"
	}
	p := e.Plan
	switch {
	case normalize(p.Collective) != normalize(q.Collective):
		return fmt.Sprintf("collective %s, not %s", p.Collective, q.Collective)
	case p.World() != q.World:
		return fmt.Sprintf("for %d GPUs, not %d", p.World(), q.World)
	case e.RanksPerNode != 0 && e.RanksPerNode != q.RanksPerNode:
		return fmt.Sprintf("for %d ranks per node, not %d", e.RanksPerNode, q.RanksPerNode)
	case p.InPlace != q.InPlace:
		return fmt.Sprintf("in-place %v, call in-place %v", p.InPlace, q.InPlace)
	}
	sz, err := p.SizesFor(q.Bytes)
	if err != nil {
		return err.Error()
	}
	if n := p.RangeSize(sz); n < p.MinMessageSize || n > p.MaxMessageSize {
		return fmt.Sprintf("size %d outside [%d, %d]", n, p.MinMessageSize, p.MaxMessageSize)
	}
	if ops := p.ReduceOps(); len(ops) > 0 && (len(ops) != 1 || ops[0] != q.Op) {
		return fmt.Sprintf("reduces with %v, the call with %s", ops, q.Op)
	}
	if e.Accept != nil && !e.Accept(q) {
		return "declined by its selector"
	}
	return ""
}

func (e *Entry) matches(q Query) bool { return e.Why(q) == "" }

func normalize(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "") }

// ReduceOps lists the distinct reductions the plan's ops use.
func (p *Plan) ReduceOps() []ReduceOp {
	if p == nil {
		var r0 []ReduceOp
		return r0
	}
	seen := map[ReduceOp]bool{}
	var out []ReduceOp
	var visit func(ops []Op)
	visit = func(ops []Op) {
		for i := range ops {
			code, err := ParseOpcode(ops[i].Name)
			if err == nil && code.Reduces() {
				r, _ := parseReduceOp(ops[i].ReduceOp)
				if !seen[r] {
					seen[r] = true
					out = append(out, r)
				}
			}
			visit(ops[i].Ops)
		}
	}
	for g := range p.GPUs {
		for t := range p.GPUs[g].Threadblocks {
			visit(p.GPUs[g].Threadblocks[t].Ops)
		}
	}
	return out
}
