// Package intranodetest is test support for the intranode kernels: ranks that
// build their workspaces without an EP Buffer, and prepared benchmark rounds.
package intranodetest
