// Package buffer is the EP Buffer under package ep: it owns one rank's memory,
// picks the protocol of the group (intranode for one node, internode for several: internode.go) and runs each call's
// sequence of launches and host waits; inputs arrive validated by package ep.
package buffer
