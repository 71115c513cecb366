// Package channels is the communication layer under EP and the collectives:
// communicator, registered memory, connections, semaphores, memory channels
// and port channels. The bootstrap that ranks meet through is in
// channels/bootstrap. (Being built.)
package channels
