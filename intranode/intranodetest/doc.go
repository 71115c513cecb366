// Package intranodetest is test support for the intranode kernels: ranks
// that build their workspaces without an EP Buffer (NewRank, NewGroup) and
// prepared dispatch/combine rounds for benchmarks (NewBench).
package intranodetest
