// Package buffer is the EP Buffer under package ep: it owns one rank's
// memory (workspaces shared with the peers, handle slots, counters), picks
// the protocol of the group (intranode today) and runs each call's sequence
// of launches and host waits. Inputs arrive validated by package ep.
package buffer
