// Package plan loads MSCCL++ execution plans, validates and resolves them, runs
// them on the host interpreter, and picks one per call (Registry).
//
// Layers, each in its own files:
//
//   - format.go: structs mirroring the JSON; Load and Parse decode (wrong
//     types are errors, unknown fields are tolerated) and validate.
//   - validate.go, shape.go: every reference, range, limit and operand
//     shape, with errors naming plan, GPU, threadblock, op and field.
//   - resolved.go, resolve.go: the resolved form, one rank's blocks of
//     instructions with byte-range operands for one message size, which the
//     host interpreter here and the GPU interpreter consume.
//   - host*.go: the host interpreter (goroutine blocks, port-channel proxy,
//     LL packets with per-launch flags, bounded waits).
//   - registry.go: plans registered from files or directories and chosen
//     per call; collectives.Communicator.UsePlans tries them first.
//   - expect.go: the collectives' definitions, to check results.
//   - dsl/: writing plans in Go (programs compiled to this JSON) and the
//     builtin algorithms written that way.
//
// Switch-channel (NVLS multicast) plans parse and validate, and are refused
// at execution.
package plan
