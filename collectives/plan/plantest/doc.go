// Package plantest is test support for plans on GPUs: it runs a plan on a
// world of goroutine ranks and checks the outputs against the definition.
package plantest
