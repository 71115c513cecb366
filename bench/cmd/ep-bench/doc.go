// Command ep-bench runs goep's checks and benchmarks (package bench).
package main
