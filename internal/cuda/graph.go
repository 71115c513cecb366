package cuda

/*
#include "shim.h"
*/
import "C"

// Graph is a CUgraph, obtained from Stream.EndCapture.
type Graph struct {
	ctx *Context
	h   C.uintptr_t
}

// Handle returns the CUgraph.
func (g *Graph) Handle() uintptr {
	if g == nil {
		return 0
	}
	return uintptr(g.h)
}

// NumNodes returns the number of nodes in the graph.
func (g *Graph) NumNodes() (int, error) {
	if g == nil {
		return 0, errNil("Graph")
	}
	r := C.gc_graph_num_nodes(g.ctx.h, g.h)
	if r.r != 0 {
		return 0, newError("cuGraphGetNodes", r.r)
	}
	return int(r.v), nil
}

// Instantiate creates an executable graph (cuGraphInstantiateWithFlags,
// flags 0). The Graph may be destroyed afterwards.
func (g *Graph) Instantiate() (*GraphExec, error) {
	if g == nil {
		return nil, errNil("Graph")
	}
	r := C.gc_graph_instantiate(g.ctx.h, g.h)
	if r.r != 0 {
		return nil, newError("cuGraphInstantiateWithFlags", r.r)
	}
	return &GraphExec{ctx: g.ctx, ch: g.ctx.h, h: C.uintptr_t(r.v)}, nil
}

// Destroy destroys the graph.
func (g *Graph) Destroy() error {
	if g == nil {
		return nil
	}
	if g.h == 0 {
		return nil
	}
	h := g.h
	g.h = 0
	return check("cuGraphDestroy", C.gc_graph_destroy(g.ctx.h, h))
}

// GraphExec is an instantiated graph (CUgraphExec).
type GraphExec struct {
	ctx *Context
	ch  C.uintptr_t
	h   C.uintptr_t
}

// Handle returns the CUgraphExec.
func (e *GraphExec) Handle() uintptr {
	if e == nil {
		return 0
	}
	return uintptr(e.h)
}

// Launch queues one replay of the graph on s (nil: the NULL stream).
func (e *GraphExec) Launch(s *Stream) error {
	if e == nil {
		return errNil("GraphExec")
	}
	var sh C.uintptr_t
	if s != nil {
		sh = s.h
	}
	return check("cuGraphLaunch", C.gc_graph_launch(e.ch, e.h, sh))
}

// Destroy destroys the executable graph.
func (e *GraphExec) Destroy() error {
	if e == nil {
		return nil
	}
	if e.h == 0 {
		return nil
	}
	h := e.h
	e.h = 0
	return check("cuGraphExecDestroy", C.gc_graph_exec_destroy(e.ch, h))
}
