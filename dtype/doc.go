// Package dtype names the element types every part of goep speaks of: the
// EP tensors (ep), the collectives and their references (collectives,
// collectives/ref) and the plan executor (collectives/plan) share this one type.
//
// The numeric values are part of the device ABI: the collective kernels take
// a DType as their dtype code (kernels/coll_common.cuh, checked by a test), so
// no package translates between numberings. The zero value means "no type"
// (an absent optional tensor).
package dtype
