// Package ref is the plain-Go reference of the collectives: element types,
// reductions and expected outputs that the tests check against.
package ref
