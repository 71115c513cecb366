// Package abi is the ABI of the collective kernels: names, argument packing
// and constants shared with kernels/coll_*.cu.
package abi
