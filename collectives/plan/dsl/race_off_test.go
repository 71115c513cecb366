//go:build !race

package dsl

const raceEnabled = false
