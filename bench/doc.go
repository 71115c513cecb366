// Package bench is ep-bench: every check and benchmark of goep behind one CLI
// (doctor, kernels, intranode, lowlatency, layout, route, channels, collectives, plan,
// launch, userkernel).
package bench
